//! The tune report: what `tune.json` holds (every point), the texts of
//! `interactive.toml` / `batch.toml` (for `sloserve serve --config`), `report.md`
//! and the console summary. `outputs.rs` writes them with `mixed.toml` and the
//! plots.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sloserve_bench::load::LoadSpec;
use sloserve_bench::report::files::chart_md;
use sloserve_bench::Summary;
use sloserve_engine::EngineConfig;

use crate::args::TuneArgs;
use crate::procedure::{
    cost_per_million_output_tokens, Knobs, PointMetrics, Recommendation, SloTargets, Verdict,
};

/// `schema` of tune.json; bumped on incompatible changes.
pub const SCHEMA: &str = "sloserve-tune/1";

/// What the engine itself counted during a point (warmup included).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineCounters {
    pub num_kv_blocks: usize,
    /// Prompt tokens found in the prefix cache / tokens looked up.
    pub prefix_cache_hit_rate: f64,
    pub preemptions: u64,
    /// Requests refused at admission.
    pub rejected: u64,
    pub engine_steps: u64,
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TunePoint {
    /// Position in measurement order.
    pub index: usize,
    pub knobs: Knobs,
    /// The numbers the procedure uses.
    pub metrics: PointMetrics,
    pub verdict: Verdict,
    pub load: LoadSpec,
    pub warmup_requests: usize,
    /// Measured requests planned (the time bound may have cut the run short).
    pub planned_requests: usize,
    /// 95% confidence interval of the TTFT P95 (order statistics), ms.
    pub ttft_p95_ci_ms: Option<(f64, f64)>,
    /// The full bench summary (TTFT/TPOT/ITL/E2EL distributions, throughput, goodput).
    pub summary: Summary,
    pub engine: EngineCounters,
    /// 1-minute load average when the point started and ended.
    pub load_avg_1m: [Option<f64>; 2],
    /// Seconds to load the model and start the engine.
    pub model_load_s: f64,
    /// Seconds for the whole point (load, warmup, measured run, shutdown).
    pub wall_s: f64,
    /// This point's full bench report (results.json with every request,
    /// report.md, TTFT histogram), relative to the output directory.
    pub report_dir: String,
    /// The effective engine configuration.
    pub engine_config: EngineConfig,
}

/// A planned configuration that was not measured, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NotMeasured {
    pub knobs: Knobs,
    pub reason: String,
}

/// Everything one `sloserve tune` run did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TuneReport {
    pub schema: String,
    pub started_unix_s: f64,
    pub wall_s: f64,
    /// The command line as invoked.
    pub command: String,
    pub model: String,
    /// How load was applied at each point.
    pub load: String,
    pub slo: SloTargets,
    /// The profile (+ `--config`) every point started from.
    pub base_config: EngineConfig,
    /// 1-minute load average at the start and end of the tune.
    pub load_avg_1m: [Option<f64>; 2],
    pub cpus: Option<usize>,
    pub points: Vec<TunePoint>,
    pub not_measured: Vec<NotMeasured>,
    pub notes: Vec<String>,
    pub interactive: Option<Recommendation>,
    pub batch: Option<Recommendation>,
    pub args: TuneArgs,
}

impl TuneReport {
    /// Read a tune.json back.
    pub fn load(path: &Path) -> anyhow::Result<TuneReport> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: TuneReport =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        anyhow::ensure!(
            r.schema == SCHEMA,
            "{}: schema {:?}, expected {SCHEMA:?}",
            path.display(),
            r.schema
        );
        Ok(r)
    }

    /// `sloserve serve` with the recommended config file.
    pub fn serve_command(&self, toml: &Path) -> String {
        let mut c = format!("sloserve serve --model {}", self.args.model.display());
        if self.args.precision != "fast" {
            let _ = write!(c, " --precision {}", self.args.precision);
        }
        let _ = write!(c, " --config {}", toml.display());
        c
    }

    /// `sloserve bench` re-measuring a recommendation on the tune's workload and load.
    pub fn bench_command(&self, max_num_seqs: usize) -> String {
        let mut f = vec!["sloserve".to_string(), "bench".to_string()];
        f.extend(self.args.workload.workload_flags());
        f.extend(self.args.workload.load_flags(max_num_seqs));
        let mut slo = format!("ttft_p95={}ms", self.slo.ttft_p95_ms);
        if let Some(t) = self.slo.tpot_p50_ms {
            let _ = write!(slo, ",tpot_p50={t}ms");
        }
        f.extend(["--slo".to_string(), slo]);
        f.join(" ")
    }
}

fn ms(v: f64) -> String {
    format!("{v:.0}")
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} ms"))
        .unwrap_or_else(|| "n/a".into())
}

fn load_avg(l: &[Option<f64>; 2]) -> String {
    match l {
        [Some(a), Some(b)] => format!("{a:.2}→{b:.2}"),
        _ => "-".into(),
    }
}

/// The header comment and the configuration of one recommendation.
pub fn config_file_text(
    report: &TuneReport,
    kind: &str,
    rec: &Recommendation,
    path: &Path,
) -> String {
    let p = &report.points[rec.point];
    let mut out = String::new();
    let _ = writeln!(out, "# sloserve tune: {kind} recommendation, {}", rec.knobs);
    let _ = writeln!(
        out,
        "# measured: TTFT P95 {}, TPOT P50 {}, {:.1} output tok/s over {} requests at {}",
        opt_ms(rec.ttft_p95_ms),
        opt_ms(rec.tpot_p50_ms),
        rec.output_tok_s,
        p.summary.completed + p.summary.failed,
        p.load.label()
    );
    let _ = writeln!(
        out,
        "# SLO {}: {}",
        report.slo,
        if rec.slo_met { "met" } else { "NOT met" }
    );
    if let Some(c) = rec.cost_per_million_output_tokens {
        let _ = writeln!(
            out,
            "# cost per million output tokens: {c:.4} (at {} per hour)",
            report.args.machine_cost_per_hour.unwrap_or(0.0)
        );
    }
    let _ = writeln!(out, "# why: {}", rec.reason.replace("**", ""));
    let _ = writeln!(out, "# serve: {}", report.serve_command(path));
    let _ = writeln!(
        out,
        "# model: {} (precision {})\n",
        report.model, report.args.precision
    );
    out.push_str(&p.engine_config.to_toml_string());
    out
}

fn pick_mark(report: &TuneReport, i: usize) -> String {
    let mut m = Vec::new();
    if report.interactive.as_ref().is_some_and(|r| r.point == i) {
        m.push("**interactive**");
    }
    if report.batch.as_ref().is_some_and(|r| r.point == i) {
        m.push("**batch**");
    }
    m.join(", ")
}

/// The table of every point, as markdown.
pub fn points_table_md(report: &TuneReport) -> String {
    let mut out = String::new();
    let cost = report.args.machine_cost_per_hour;
    let _ = write!(
        out,
        "| # | max_num_seqs | budget | chunk | requests (+warmup) | TTFT P50 | TTFT P95 [95% CI] | TTFT P99 | TPOT P50 | TPOT P95 | output tok/s | total tok/s |"
    );
    if cost.is_some() {
        out.push_str(" cost / M output tok |");
    }
    out.push_str(" prefix hit | load avg | verdict | pick |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    if cost.is_some() {
        out.push_str("---:|");
    }
    out.push_str("---:|---|---|---|\n");
    for (i, p) in report.points.iter().enumerate() {
        let s = &p.summary;
        let ci = p
            .ttft_p95_ci_ms
            .map(|(a, b)| format!(" [{}–{}]", ms(a), ms(b)))
            .unwrap_or_default();
        let ran = s.completed + s.failed;
        let reqs = if p.metrics.partial {
            format!("{ran} of {} (+{})", p.planned_requests, p.warmup_requests)
        } else {
            format!("{ran} (+{})", p.warmup_requests)
        };
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {reqs} | {} | {}{ci} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            i + 1,
            p.knobs.max_num_seqs,
            p.knobs.max_num_batched_tokens,
            p.knobs.max_prefill_chunk,
            ms(s.ttft_ms.median),
            ms(s.ttft_ms.p95),
            ms(s.ttft_ms.p99),
            s.tpot_ms.median,
            s.tpot_ms.p95,
            s.output_throughput,
            s.total_token_throughput,
        );
        if let Some(c) = cost {
            let _ = write!(
                out,
                " {} |",
                cost_per_million_output_tokens(c, s.output_throughput)
                    .map(|v| format!("{v:.4}"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        let _ = writeln!(
            out,
            " {:.0}% | {} | {} | {} |",
            p.engine.prefix_cache_hit_rate * 100.0,
            load_avg(&p.load_avg_1m),
            p.verdict.why,
            pick_mark(report, i)
        );
    }
    out
}

/// `report.md`; `charts` are the stems written next to it (each .png and .svg).
pub fn render_markdown(report: &TuneReport, dir: &Path, charts: &[String]) -> String {
    let a = &report.args;
    let w = &a.workload;
    let mut out = String::new();
    let _ = writeln!(out, "# sloserve tune report\n");
    let _ = writeln!(
        out,
        "- model: `{}` (precision {}), base profile `{}`{}",
        report.model,
        a.precision,
        a.profile,
        a.config
            .as_ref()
            .map(|c| format!(" + `{}`", c.display()))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "- workload: `{}`", w.workload_flags().join(" "));
    let _ = writeln!(out, "- load: {}", report.load);
    let _ = writeln!(out, "- SLO: {}", report.slo);
    if let Some(c) = a.machine_cost_per_hour {
        let _ = writeln!(out, "- machine cost: {c} per hour");
    }
    let _ = writeln!(
        out,
        "- time bound: {} min; the tune took {:.1} min",
        a.max_minutes,
        report.wall_s / 60.0
    );
    let _ = writeln!(
        out,
        "- machine: {} CPUs; 1-minute load average {} over the tune (per point in the table; the machine may be shared, so compare points measured under similar load)",
        report.cpus.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
        load_avg(&report.load_avg_1m)
    );
    let _ = writeln!(out, "- command: `{}`", report.command);
    for n in &report.notes {
        let _ = writeln!(out, "- note: {n}");
    }

    let _ = writeln!(out, "\n## Recommendations\n");
    let _ = writeln!(
        out,
        "| | max_num_seqs | budget | chunk | TTFT P95 | TPOT P50 | output tok/s | cost / M output tok | SLO | file |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for (kind, rec) in [
        ("interactive", &report.interactive),
        ("batch", &report.batch),
    ] {
        if let Some(r) = rec {
            let _ = writeln!(
                out,
                "| **{kind}** | {} | {} | {} | {} | {} | {:.1} | {} | {} | [`{kind}.toml`]({kind}.toml) |",
                r.knobs.max_num_seqs,
                r.knobs.max_num_batched_tokens,
                r.knobs.max_prefill_chunk,
                opt_ms(r.ttft_p95_ms),
                opt_ms(r.tpot_p50_ms),
                r.output_tok_s,
                r.cost_per_million_output_tokens
                    .map(|c| format!("{c:.4}"))
                    .unwrap_or_else(|| "-".into()),
                if r.slo_met { "met" } else { "**not met**" }
            );
        }
    }
    for (kind, rec) in [
        ("Interactive", &report.interactive),
        ("Batch", &report.batch),
    ] {
        match rec {
            Some(r) => {
                let _ = writeln!(out, "\n**{kind}:** {}", r.reason);
            }
            None => {
                let _ = writeln!(out, "\n**{kind}:** no point was measured.");
            }
        }
    }
    if let Some(b) = &report.batch {
        let _ = writeln!(
            out,
            "\n**Mixed:** [`mixed.toml`](mixed.toml), both classes on one replica: the `mixed` profile with the batch pick's size (max_num_seqs={}) and the interactive class's default targets from the SLO ({}). Not measured as one configuration.",
            b.knobs.max_num_seqs, report.slo
        );
    }
    if report.interactive.is_some() || report.batch.is_some() {
        let _ = writeln!(
            out,
            "\nServe a recommendation, then re-measure it on the same workload and load:\n\n```sh"
        );
        for (kind, rec) in [
            ("interactive", &report.interactive),
            ("batch", &report.batch),
        ] {
            if let Some(r) = rec {
                let _ = writeln!(
                    out,
                    "# {kind}\n{}",
                    report.serve_command(&dir.join(format!("{kind}.toml")))
                );
                let _ = writeln!(out, "{}", report.bench_command(r.knobs.max_num_seqs));
            }
        }
        let _ = writeln!(out, "```");
    }

    let _ = writeln!(out, "\n## Every point measured\n");
    let _ = writeln!(
        out,
        "In measurement order. Requests: measured (+ warmup, discarded). The TTFT P95 interval is a distribution-free 95% confidence interval from order statistics: an SLO inside it is a close call. Prefix hit: prompt tokens served from the prefix cache. Each point's full bench report (every request, TTFT histogram) is linked below the table.\n"
    );
    out.push_str(&points_table_md(report));
    let _ = writeln!(out);
    for p in &report.points {
        let _ = writeln!(
            out,
            "- {}: [{}/report.md]({}/report.md), load `{}`, model load {:.1} s, point {:.1} s, {} preemptions, {} rejected",
            p.knobs,
            p.report_dir,
            p.report_dir,
            serde_json::to_string(&p.load).unwrap_or_default(),
            p.model_load_s,
            p.wall_s,
            p.engine.preemptions,
            p.engine.rejected
        );
    }
    if !report.not_measured.is_empty() {
        let _ = writeln!(out, "\n### Not measured\n");
        for n in &report.not_measured {
            let _ = writeln!(out, "- {}: {}", n.knobs, n.reason);
        }
    }
    if !charts.is_empty() {
        let _ = writeln!(out, "\n## Plots\n");
        for c in charts {
            let _ = writeln!(out, "{}\n", chart_md(c));
        }
    }
    let _ = writeln!(out, "\n## How the winners are chosen\n");
    let _ = writeln!(
        out,
        "- A point meets the SLO when it ran all its planned requests, none failed, its TTFT P95 is within the target and (if given) its TPOT P50 too.\n\
         - **Interactive**: for each token budget / chunk series, walk up from the smallest batch while points meet the SLO (\"increase until TTFT violates the SLO\"); take the largest of that run and back off one step to the next smaller measured batch size, for headroom against load spikes and noise. A pass after a miss is taken for noise. Across series, the candidate with the most output tok/s wins. If no point meets the SLO, the smallest batch size is recommended and marked as not meeting it.\n\
         - **Batch**: the complete point without failures with the most output tok/s, which is also the lowest cost per million output tokens (`cost_per_hour / (output_tok_s × 3600) × 10⁶`).\n\
         - A series stops after two consecutive SLO misses unless `--no-early-stop` (larger batches only add latency, though they may add throughput: the batch pick is among the points measured)."
    );
    out
}

/// A compact console table of every point and the recommendations.
pub fn console_text(report: &TuneReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>6}{:>8}{:>7}{:>8}{:>9}{:>9}{:>9}{:>9}{:>11}  verdict",
        "seqs", "budget", "chunk", "reqs", "TTFTp50", "TTFTp95", "TTFTp99", "TPOTp50", "out tok/s"
    );
    for (i, p) in report.points.iter().enumerate() {
        let s = &p.summary;
        let mark = pick_mark(report, i).replace("**", "");
        let _ = writeln!(
            out,
            "{:>6}{:>8}{:>7}{:>8}{:>9.0}{:>9.0}{:>9.0}{:>9.1}{:>11.1}  {}{}",
            p.knobs.max_num_seqs,
            p.knobs.max_num_batched_tokens,
            p.knobs.max_prefill_chunk,
            s.completed + s.failed,
            s.ttft_ms.median,
            s.ttft_ms.p95,
            s.ttft_ms.p99,
            s.tpot_ms.median,
            s.output_throughput,
            p.verdict.why,
            if mark.is_empty() {
                String::new()
            } else {
                format!("  <- {mark}")
            }
        );
    }
    for n in &report.not_measured {
        let _ = writeln!(out, "not measured: {}: {}", n.knobs, n.reason);
    }
    for (kind, rec) in [
        ("interactive", &report.interactive),
        ("batch", &report.batch),
    ] {
        if let Some(r) = rec {
            let _ = writeln!(
                out,
                "{kind}: {}{}{}",
                r.knobs,
                if r.slo_met { "" } else { " (SLO NOT met)" },
                r.cost_per_million_output_tokens
                    .map(|c| format!(", {c:.4} per million output tokens"))
                    .unwrap_or_default()
            );
        }
    }
    out
}
