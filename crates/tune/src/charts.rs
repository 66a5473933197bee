//! The tune report's plots: TTFT, TPOT and output throughput against
//! `max_num_seqs`, one series per token budget / chunk size, with the SLO lines.

use std::collections::BTreeSet;

use sloserve_bench::report::plots::{Chart, RefLine, Series};
use sloserve_bench::Summary;

use crate::procedure::{series, PointMetrics};
use crate::report::TuneReport;

/// A percentile line: its name, how to read it, and whether it is drawn when
/// several (budget, chunk) groups share the chart.
type Percentile = (&'static str, fn(&Summary) -> f64, bool);

/// The plots, by file stem.
pub fn charts(report: &TuneReport) -> Vec<(String, Chart)> {
    let xs: Vec<usize> = report
        .points
        .iter()
        .map(|p| p.knobs.max_num_seqs)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if xs.is_empty() {
        return Vec::new();
    }
    let x_labels: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    let metrics: Vec<PointMetrics> = report.points.iter().map(|p| p.metrics.clone()).collect();
    let groups = series(&metrics);
    let many = groups.len() > 1;
    // One line per (series, metric): y at each max_num_seqs, None where not measured.
    let line = |name: String, idx: &[usize], f: &dyn Fn(&Summary) -> Option<f64>| Series {
        name,
        ys: xs
            .iter()
            .map(|&x| {
                idx.iter()
                    .find(|&&i| report.points[i].knobs.max_num_seqs == x)
                    .and_then(|&i| f(&report.points[i].summary))
            })
            .collect(),
    };
    let ttft = |f: fn(&Summary) -> f64| move |s: &Summary| (s.ttft_ms.count > 0).then(|| f(s));
    let tpot = |f: fn(&Summary) -> f64| move |s: &Summary| (s.tpot_ms.count > 0).then(|| f(s));
    let mut ttft_series = Vec::new();
    let mut tpot_series = Vec::new();
    let mut tput_series = Vec::new();
    for (key, idx) in &groups {
        let tag = if many {
            format!(" budget={} chunk={}", key.0, key.1)
        } else {
            String::new()
        };
        // With several (budget, chunk) groups only the SLO percentiles, to stay legible.
        let ttft_lines: [Percentile; 3] = [
            ("P50", |s| s.ttft_ms.median, false),
            ("P95", |s| s.ttft_ms.p95, true),
            ("P99", |s| s.ttft_ms.p99, false),
        ];
        for (name, f, always) in ttft_lines {
            if always || !many {
                ttft_series.push(line(format!("TTFT {name}{tag}"), idx, &ttft(f)));
            }
        }
        let tpot_lines: [Percentile; 2] = [
            ("P50", |s| s.tpot_ms.median, true),
            ("P95", |s| s.tpot_ms.p95, false),
        ];
        for (name, f, always) in tpot_lines {
            if always || !many {
                tpot_series.push(line(format!("TPOT {name}{tag}"), idx, &tpot(f)));
            }
        }
        tput_series.push(line(format!("output tok/s{tag}"), idx, &|s: &Summary| {
            Some(s.output_throughput)
        }));
    }
    let x_desc = "max_num_seqs (batch size)".to_string();
    let mut out = vec![(
        "ttft_vs_max_num_seqs".to_string(),
        Chart::Lines {
            title: "TTFT vs max_num_seqs".into(),
            x_desc: x_desc.clone(),
            y_desc: "TTFT (ms)".into(),
            x_labels: x_labels.clone(),
            series: ttft_series,
            refs: vec![RefLine {
                name: format!("SLO TTFT P95 {} ms", report.slo.ttft_p95_ms),
                value: report.slo.ttft_p95_ms,
            }],
        },
    )];
    out.push((
        "tpot_vs_max_num_seqs".to_string(),
        Chart::Lines {
            title: "TPOT vs max_num_seqs".into(),
            x_desc: x_desc.clone(),
            y_desc: "TPOT (ms)".into(),
            x_labels: x_labels.clone(),
            series: tpot_series,
            refs: report
                .slo
                .tpot_p50_ms
                .map(|t| RefLine {
                    name: format!("SLO TPOT P50 {t} ms"),
                    value: t,
                })
                .into_iter()
                .collect(),
        },
    ));
    out.push((
        "throughput_vs_max_num_seqs".to_string(),
        Chart::Lines {
            title: "Output throughput vs max_num_seqs".into(),
            x_desc,
            y_desc: "output tokens/s".into(),
            x_labels,
            series: tput_series,
            refs: vec![],
        },
    ));
    out
}
