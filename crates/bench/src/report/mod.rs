//! The benchmark report: its versioned JSON form (`results.json`), and writing it with `report.md` and plots to `--out`.

pub mod files;
pub mod markdown;
pub mod plots;
pub mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::args::{BenchArgs, Endpoint};
use crate::load::LoadSpec;
use crate::metrics::{self, Summary};
use crate::record::RequestRecord;
use crate::slo::SloMetric;
use crate::sweep::{fmt_rate, Sweep, SweepVar};
use plots::{Chart, RefLine, Series};

/// `schema` of results.json; bumped on incompatible changes.
pub const SCHEMA: &str = "sloserve-bench/1";

/// Everything one `sloserve bench` run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub schema: String,
    /// Unix time (seconds) the run started.
    pub started_unix_s: f64,
    pub url: String,
    pub endpoint: Endpoint,
    /// The model name sent.
    pub model: String,
    /// The flags, as given (the API key is never written).
    pub config: BenchArgs,
    pub sweep: Option<Sweep>,
    /// Caveats about the numbers (e.g. no `usage` from the server).
    pub notes: Vec<String>,
    pub points: Vec<PointReport>,
}

/// One load point: its summary and every request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointReport {
    /// `concurrency=4`, `rate=inf`.
    pub label: String,
    pub load: LoadSpec,
    /// The swept variable's value here (concurrency or rate), when sweeping.
    #[serde(default, with = "crate::sweep::opt_rate_serde")]
    pub value: Option<f64>,
    pub warmup_requests: usize,
    pub summary: Summary,
    /// Per SLO class (only with `--slo-class`), each against the same targets and duration.
    pub classes: BTreeMap<String, Summary>,
    pub requests: Vec<RequestRecord>,
}

impl BenchReport {
    /// Read a results.json back.
    pub fn load(path: &Path) -> anyhow::Result<BenchReport> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: BenchReport =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        anyhow::ensure!(
            r.schema == SCHEMA,
            "{}: schema {:?}, expected {SCHEMA:?}",
            path.display(),
            r.schema
        );
        Ok(r)
    }
}

/// File-name-safe form of a label: `rate=0.5` → `rate_0.5`.
pub fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Every chart of the report, by file stem: `ttft_vs_X`, `tpot_vs_X`,
/// `throughput_vs_X` for a sweep of two or more points, and `ttft_hist_LABEL` per point.
pub fn charts(report: &BenchReport) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    let targets = report
        .config
        .slo
        .as_ref()
        .map(|s| s.targets.clone())
        .unwrap_or_default();
    let refs = |m: SloMetric| -> Vec<RefLine> {
        targets
            .iter()
            .filter(|t| t.metric == m)
            .map(|t| RefLine {
                name: format!("SLO {t}"),
                value: t.threshold_ms,
            })
            .collect()
    };
    if let (Some(sweep), true) = (&report.sweep, report.points.len() >= 2) {
        let var = sweep.var.name();
        let x_desc = match sweep.var {
            SweepVar::Concurrency => "concurrency (requests in flight)".to_string(),
            SweepVar::Rate => "request rate (req/s)".to_string(),
        };
        let x_labels: Vec<String> = report
            .points
            .iter()
            .map(|p| p.value.map(fmt_rate).unwrap_or_else(|| p.label.clone()))
            .collect();
        let pick =
            |f: &dyn Fn(&Summary) -> f64, need: &dyn Fn(&Summary) -> bool| -> Vec<Option<f64>> {
                report
                    .points
                    .iter()
                    .map(|p| need(&p.summary).then(|| f(&p.summary)))
                    .collect()
            };
        let has_ttft = |s: &Summary| s.ttft_ms.count > 0;
        let has_tpot = |s: &Summary| s.tpot_ms.count > 0;
        let lines = |title: &str, y: &str, series: Vec<Series>, refs: Vec<RefLine>| Chart::Lines {
            title: title.into(),
            x_desc: x_desc.clone(),
            y_desc: y.into(),
            x_labels: x_labels.clone(),
            series,
            refs,
        };
        out.push((
            format!("ttft_vs_{var}"),
            lines(
                &format!("TTFT vs {var}"),
                "TTFT (ms)",
                vec![
                    Series {
                        name: "p50".into(),
                        ys: pick(&|s| s.ttft_ms.median, &has_ttft),
                    },
                    Series {
                        name: "p95".into(),
                        ys: pick(&|s| s.ttft_ms.p95, &has_ttft),
                    },
                    Series {
                        name: "p99".into(),
                        ys: pick(&|s| s.ttft_ms.p99, &has_ttft),
                    },
                ],
                refs(SloMetric::Ttft),
            ),
        ));
        out.push((
            format!("tpot_vs_{var}"),
            lines(
                &format!("TPOT vs {var}"),
                "TPOT (ms)",
                vec![
                    Series {
                        name: "p50".into(),
                        ys: pick(&|s| s.tpot_ms.median, &has_tpot),
                    },
                    Series {
                        name: "p95".into(),
                        ys: pick(&|s| s.tpot_ms.p95, &has_tpot),
                    },
                ],
                refs(SloMetric::Tpot),
            ),
        ));
        out.push((
            format!("throughput_vs_{var}"),
            lines(
                &format!("Throughput vs {var}"),
                "tokens/s",
                vec![
                    Series {
                        name: "output tok/s".into(),
                        ys: pick(&|s| s.output_throughput, &|_| true),
                    },
                    Series {
                        name: "total tok/s".into(),
                        ys: pick(&|s| s.total_token_throughput, &|_| true),
                    },
                ],
                vec![],
            ),
        ));
    }
    for p in &report.points {
        let values: Vec<f64> = p
            .requests
            .iter()
            .filter(|r| r.ok())
            .filter_map(metrics::ttft)
            .map(|v| v * 1e3)
            .collect();
        out.push((
            format!("ttft_hist_{}", slug(&p.label)),
            Chart::Histogram {
                title: format!("TTFT distribution ({})", p.label),
                x_desc: "TTFT (ms)".into(),
                values,
                refs: refs(SloMetric::Ttft),
            },
        ));
    }
    out
}

/// Write `results.json`, every chart as `.png` and `.svg`, and `report.md`
/// into `dir` (created if missing). Returns the files written.
pub fn write_outputs(report: &BenchReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let json = dir.join("results.json");
    files::write_json(&json, report)?;
    written.push(json);
    let charts = files::write_charts(dir, charts(report))?;
    written.extend(charts.files);
    let md = dir.join("report.md");
    std::fs::write(&md, markdown::render(report, &charts.stems))?;
    written.push(md);
    Ok(written)
}
