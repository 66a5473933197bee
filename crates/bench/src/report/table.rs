//! Console tables: one block per load point (like `vllm bench serve`) and a one-row-per-point sweep table.

use std::fmt::Write;

use crate::metrics::{Stats, Summary};
use crate::report::PointReport;

fn kv(out: &mut String, k: &str, v: impl std::fmt::Display) {
    let _ = writeln!(out, "{k:<40}{v:>14}");
}

/// Percent with one decimal.
pub fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The block for one point (or one class of it).
pub fn summary_text(title: &str, s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:=^54}", format!(" {title} "));
    kv(&mut out, "Successful requests:", s.completed);
    kv(&mut out, "Failed requests:", s.failed);
    kv(
        &mut out,
        "Benchmark duration (s):",
        format!("{:.2}", s.duration_s),
    );
    kv(&mut out, "Total input tokens:", s.total_input_tokens);
    kv(&mut out, "Total generated tokens:", s.total_output_tokens);
    kv(
        &mut out,
        "Mean input / output tokens:",
        format!("{:.1} / {:.1}", s.mean_input_tokens, s.mean_output_tokens),
    );
    kv(
        &mut out,
        "Request throughput (req/s):",
        format!("{:.2}", s.request_throughput),
    );
    kv(
        &mut out,
        "Output token throughput (tok/s):",
        format!("{:.2}", s.output_throughput),
    );
    kv(
        &mut out,
        "Total token throughput (tok/s):",
        format!("{:.2}", s.total_token_throughput),
    );
    if let (Some(g), Some(a), Some(n)) = (s.goodput, s.slo_attainment, s.good_requests) {
        kv(&mut out, "Good requests:", n);
        kv(&mut out, "Request goodput (req/s):", format!("{g:.2}"));
        kv(&mut out, "SLO attainment:", pct(a));
    }
    if let Some(t) = &s.server_targets {
        let of = |met: usize, missed: usize| format!("{met} of {}", met + missed);
        kv(
            &mut out,
            "Server TTFT targets met:",
            of(t.ttft_met, t.ttft_missed),
        );
        kv(
            &mut out,
            "Server TPOT targets met:",
            of(t.tpot_met, t.tpot_missed),
        );
    }
    if s.usage_missing > 0 {
        kv(
            &mut out,
            "Requests without usage (chunks counted):",
            s.usage_missing,
        );
    }
    let _ = writeln!(out, "{:-^54}", " Latency (ms) ");
    let _ = writeln!(
        out,
        "{:<6}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}",
        "", "mean", "median", "p90", "p95", "p99", "max"
    );
    for (name, st) in [
        ("TTFT", &s.ttft_ms),
        ("TPOT", &s.tpot_ms),
        ("ITL", &s.itl_ms),
        ("E2EL", &s.e2el_ms),
    ] {
        let _ = writeln!(out, "{name:<6}{}", stats_cells(st));
    }
    if !s.slo_checks.is_empty() {
        let _ = writeln!(out, "{:-^54}", " SLO targets ");
        for c in &s.slo_checks {
            let actual = c
                .actual_ms
                .map(|a| format!("{a:.1} ms"))
                .unwrap_or_else(|| "n/a".into());
            let _ = writeln!(
                out,
                "{:<28}{:>14}  {}",
                c.target,
                actual,
                if c.met { "met" } else { "MISSED" }
            );
        }
    }
    if !s.errors.is_empty() {
        let _ = writeln!(out, "{:-^54}", " Errors ");
        for e in &s.errors {
            let _ = writeln!(out, "{:>5} × {}", e.count, e.error);
        }
    }
    let _ = writeln!(out, "{}", "=".repeat(54));
    out
}

fn stats_cells(st: &Stats) -> String {
    if st.count == 0 {
        return format!("{:>8}", "-");
    }
    format!(
        "{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>8.1}",
        st.mean, st.median, st.p90, st.p95, st.p99, st.max
    )
}

/// The full console output of one point, with one row per SLO class.
pub fn point_text(p: &PointReport) -> String {
    let mut out = summary_text(&format!("sloserve bench: {}", p.label), &p.summary);
    if !p.classes.is_empty() {
        let rows: Vec<(String, &Summary)> = p
            .classes
            .iter()
            .map(|(c, s)| (format!("class {c}"), s))
            .collect();
        out.push_str(&rows_text(&rows));
    }
    out
}

/// One row per point: the numbers a sweep is read by.
pub fn sweep_text(points: &[PointReport]) -> String {
    let rows: Vec<(String, &Summary)> = points
        .iter()
        .map(|p| (p.label.clone(), &p.summary))
        .collect();
    rows_text(&rows)
}

/// A compact table, one labelled summary per row.
pub fn rows_text(rows: &[(String, &Summary)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18}{:>6}{:>6}{:>9}{:>10}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}",
        "",
        "ok",
        "fail",
        "req/s",
        "out tok/s",
        "TTFTp50",
        "TTFTp95",
        "TTFTp99",
        "TPOTp50",
        "TPOTp95",
        "goodput",
        "attain"
    );
    for (label, s) in rows {
        let _ = writeln!(
            out,
            "{:<18}{:>6}{:>6}{:>9.2}{:>10.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9}{:>8}",
            label,
            s.completed,
            s.failed,
            s.request_throughput,
            s.output_throughput,
            s.ttft_ms.median,
            s.ttft_ms.p95,
            s.ttft_ms.p99,
            s.tpot_ms.median,
            s.tpot_ms.p95,
            s.goodput
                .map(|g| format!("{g:.2}"))
                .unwrap_or_else(|| "-".into()),
            s.slo_attainment.map(pct).unwrap_or_else(|| "-".into()),
        );
    }
    out
}
