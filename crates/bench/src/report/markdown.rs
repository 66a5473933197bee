//! `report.md`: the run's setup, a table per load point, SLO verdicts, errors and links to the plots.

use std::fmt::Write;

use crate::metrics::Summary;
use crate::report::files::chart_md;
use crate::report::table::pct;
use crate::report::{slug, BenchReport};

fn summary_md(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "| metric | value |\n|---|---:|");
    let rows: Vec<(&str, String)> = vec![
        ("successful requests", s.completed.to_string()),
        ("failed requests", s.failed.to_string()),
        ("duration (s)", format!("{:.2}", s.duration_s)),
        ("total input tokens", s.total_input_tokens.to_string()),
        ("total output tokens", s.total_output_tokens.to_string()),
        ("mean input tokens", format!("{:.1}", s.mean_input_tokens)),
        ("mean output tokens", format!("{:.1}", s.mean_output_tokens)),
        (
            "request throughput (req/s)",
            format!("{:.2}", s.request_throughput),
        ),
        (
            "output throughput (tok/s)",
            format!("{:.2}", s.output_throughput),
        ),
        (
            "total token throughput (tok/s)",
            format!("{:.2}", s.total_token_throughput),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    if let (Some(n), Some(g), Some(a)) = (s.good_requests, s.goodput, s.slo_attainment) {
        let _ = writeln!(
            out,
            "| good requests | {n} |\n| goodput (req/s) | {g:.2} |\n| SLO attainment | {} |",
            pct(a)
        );
    }
    if let Some(t) = &s.server_targets {
        let _ = writeln!(
            out,
            "| server targets met: TTFT | {} of {} |\n| server targets met: TPOT | {} of {} |",
            t.ttft_met,
            t.ttft_met + t.ttft_missed,
            t.tpot_met,
            t.tpot_met + t.tpot_missed
        );
    }
    if s.usage_missing > 0 {
        let _ = writeln!(
            out,
            "| requests without `usage` (chunks counted) | {} |",
            s.usage_missing
        );
    }
    let _ = writeln!(out, "\n| latency (ms) | mean | median | p90 | p95 | p99 | max | n |\n|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, st) in [
        ("TTFT", &s.ttft_ms),
        ("TPOT", &s.tpot_ms),
        ("ITL", &s.itl_ms),
        ("E2EL", &s.e2el_ms),
    ] {
        let _ = writeln!(
            out,
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            st.mean, st.median, st.p90, st.p95, st.p99, st.max, st.count
        );
    }
    if !s.slo_checks.is_empty() {
        let _ = writeln!(out, "\n| SLO target | measured | verdict |\n|---|---:|---|");
        for c in &s.slo_checks {
            let actual = c
                .actual_ms
                .map(|a| format!("{a:.1} ms"))
                .unwrap_or_else(|| "n/a".into());
            let _ = writeln!(
                out,
                "| `{}` | {actual} | {} |",
                c.target,
                if c.met { "met" } else { "**missed**" }
            );
        }
    }
    if !s.errors.is_empty() {
        let _ = writeln!(out, "\nErrors:\n");
        for e in &s.errors {
            let _ = writeln!(out, "- {} × `{}`", e.count, e.error.replace('`', "'"));
        }
    }
}

/// The markdown report; `charts` are the file stems written next to it (each as .png and .svg).
pub fn render(r: &BenchReport, charts: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# sloserve bench report\n");
    let c = &r.config;
    let _ = writeln!(
        out,
        "- server: `{}` ({:?} endpoint), model `{}`",
        r.url, r.endpoint, r.model
    );
    let _ = writeln!(
        out,
        "- dataset: `{}`, seed {}, ignore_eos {}",
        c.workload.dataset,
        c.workload.seed,
        c.workload.ignore_eos()
    );
    if let Some(s) = &r.sweep {
        let _ = writeln!(out, "- sweep: `{s}`");
    }
    if let Some(s) = &c.slo {
        let _ = writeln!(out, "- SLO targets: `{s}`");
    }
    if let Some(m) = &c.workload.slo_class {
        let _ = writeln!(out, "- SLO class mix: `{m}`");
    }
    let _ = writeln!(out, "- schema `{}`; metric definitions as `vllm bench serve` (percentiles: numpy linear interpolation)", r.schema);
    for n in &r.notes {
        let _ = writeln!(out, "- note: {n}");
    }
    let sweep_charts: Vec<&String> = charts
        .iter()
        .filter(|s| !s.starts_with("ttft_hist_"))
        .collect();
    if !sweep_charts.is_empty() {
        let _ = writeln!(
            out,
            "\n## Sweep\n\n```\n{}```\n",
            crate::report::table::sweep_text(&r.points)
        );
        for s in sweep_charts {
            let _ = writeln!(out, "{}\n", chart_md(s));
        }
    }
    for p in &r.points {
        let _ = writeln!(out, "\n## {}\n", p.label);
        let _ = writeln!(
            out,
            "Load: `{}`, {} warmup requests.\n",
            serde_json::to_string(&p.load).unwrap_or_default(),
            p.warmup_requests
        );
        summary_md(&mut out, &p.summary);
        for (class, s) in &p.classes {
            let _ = writeln!(out, "\n### class `{class}`\n");
            summary_md(&mut out, s);
        }
        let hist = format!("ttft_hist_{}", slug(&p.label));
        if charts.contains(&hist) {
            let _ = writeln!(out, "\n{}", chart_md(&hist));
        }
    }
    out
}
