//! The tuning procedure as pure functions over measured points: the SLO
//! verdict of a point, when a series stops early, the interactive and batch
//! recommendations, and cost per million output tokens.
//!
//! * A **series** is every measured `max_num_seqs` with the same token budget
//!   and prefill chunk, in ascending batch size.
//! * A point **meets** the SLO when it ran its planned requests (not cut by
//!   the time bound), none failed, its TTFT P95 is within `--slo-ttft-p95`
//!   and, if given, its TPOT P50 within `--slo-tpot-p50`.
//! * **Interactive**: in each series, walk up from the smallest batch while
//!   points meet the SLO ("increase until TTFT violates the SLO"); the largest
//!   point of that run is backed off one step to the next smaller measured
//!   batch size (the run's smallest point is kept when there is no smaller
//!   one). A point that meets the SLO after a smaller one missed it is taken
//!   for noise and not used. Across series, the candidate with the most
//!   output tokens/s wins (then the lower TTFT P95). When no point meets the
//!   SLO, the smallest batch size (lowest TTFT P95 among its points) is
//!   recommended and marked as not meeting it.
//! * **Batch**: the complete point without failures that has the most output
//!   tokens/s (any point with output when none is complete and clean).
//! * **Cost** per million output tokens: `cost_per_hour / (output_tok_s · 3600) · 10⁶`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sloserve_bench::Summary;

/// The tuned engine knobs of one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Knobs {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_prefill_chunk: usize,
}

impl Knobs {
    /// The series this configuration belongs to: (token budget, prefill chunk).
    pub fn series(&self) -> (usize, usize) {
        (self.max_num_batched_tokens, self.max_prefill_chunk)
    }

    /// `budget=512 chunk=128`.
    pub fn series_label(&self) -> String {
        format!(
            "budget={} chunk={}",
            self.max_num_batched_tokens, self.max_prefill_chunk
        )
    }

    /// File-name-safe: `seqs8_budget512_chunk128`.
    pub fn slug(&self) -> String {
        format!(
            "seqs{}_budget{}_chunk{}",
            self.max_num_seqs, self.max_num_batched_tokens, self.max_prefill_chunk
        )
    }
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max_num_seqs={} (budget {}, chunk {})",
            self.max_num_seqs, self.max_num_batched_tokens, self.max_prefill_chunk
        )
    }
}

/// The SLO the interactive recommendation must meet.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloTargets {
    pub ttft_p95_ms: f64,
    pub tpot_p50_ms: Option<f64>,
}

impl fmt::Display for SloTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TTFT P95 ≤ {} ms", self.ttft_p95_ms)?;
        if let Some(t) = self.tpot_p50_ms {
            write!(f, " and TPOT P50 ≤ {t} ms")?;
        }
        Ok(())
    }
}

/// What the procedure needs of one measured point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PointMetrics {
    pub knobs: Knobs,
    pub completed: usize,
    pub failed: usize,
    /// Fewer requests than planned ran (the time bound cut the point short).
    pub partial: bool,
    /// `None` when no request produced a first token.
    pub ttft_p95_ms: Option<f64>,
    /// `None` when no request had two or more output tokens.
    pub tpot_p50_ms: Option<f64>,
    pub output_tok_s: f64,
}

impl PointMetrics {
    pub fn from_summary(knobs: Knobs, s: &Summary, partial: bool) -> Self {
        PointMetrics {
            knobs,
            completed: s.completed,
            failed: s.failed,
            partial,
            ttft_p95_ms: (s.ttft_ms.count > 0).then_some(s.ttft_ms.p95),
            tpot_p50_ms: (s.tpot_ms.count > 0).then_some(s.tpot_ms.median),
            output_tok_s: s.output_throughput,
        }
    }
}

/// Whether a point meets the SLO, and why not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub meets: bool,
    pub ttft_met: bool,
    /// `None` without a TPOT target.
    pub tpot_met: Option<bool>,
    /// Short reason: `meets`, `TTFT P95 1234 ms > 1000 ms`, `2 failed`, ...
    pub why: String,
}

/// The verdict of `p` against `slo`.
pub fn verdict(p: &PointMetrics, slo: &SloTargets) -> Verdict {
    let ttft_met = p.ttft_p95_ms.is_some_and(|t| t <= slo.ttft_p95_ms);
    // No TPOT sample (single-token outputs) cannot violate a TPOT target.
    let tpot_met = slo
        .tpot_p50_ms
        .map(|lim| p.tpot_p50_ms.is_none_or(|t| t <= lim));
    let mut why = Vec::new();
    if p.partial {
        why.push("cut short by the time bound".to_string());
    }
    if p.completed == 0 {
        why.push("no request completed".to_string());
    }
    if p.failed > 0 {
        why.push(format!("{} failed", p.failed));
    }
    match p.ttft_p95_ms {
        Some(t) if t > slo.ttft_p95_ms => {
            why.push(format!("TTFT P95 {t:.0} ms > {} ms", slo.ttft_p95_ms))
        }
        None if p.completed > 0 => why.push("no TTFT measured".into()),
        _ => {}
    }
    if let (Some(false), Some(t), Some(lim)) = (tpot_met, p.tpot_p50_ms, slo.tpot_p50_ms) {
        why.push(format!("TPOT P50 {t:.1} ms > {lim} ms"));
    }
    let meets = why.is_empty() && ttft_met && tpot_met != Some(false);
    Verdict {
        meets,
        ttft_met,
        tpot_met,
        why: if meets {
            "meets".into()
        } else {
            why.join("; ")
        },
    }
}

/// Whether a series should stop after these verdicts (in ascending batch
/// size): two consecutive points missed the SLO, and larger batches only get slower.
pub fn should_stop(meets_so_far: &[bool]) -> bool {
    meets_so_far.len() >= 2 && meets_so_far[meets_so_far.len() - 2..].iter().all(|m| !m)
}

/// Cost per million output tokens at `output_tok_s` on a machine costing `cost_per_hour`.
pub fn cost_per_million_output_tokens(cost_per_hour: f64, output_tok_s: f64) -> Option<f64> {
    (output_tok_s > 0.0 && cost_per_hour.is_finite())
        .then(|| cost_per_hour / (output_tok_s * 3600.0) * 1e6)
}

/// A recommended configuration and why it won.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// Index of the winning point in the measured points.
    pub point: usize,
    pub knobs: Knobs,
    /// Whether the point meets the SLO (the interactive recommendation is
    /// false only when no point met it).
    pub slo_met: bool,
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p50_ms: Option<f64>,
    pub output_tok_s: f64,
    pub cost_per_million_output_tokens: Option<f64>,
    /// Why it won, in sentences (markdown).
    pub reason: String,
}

fn recommendation(
    points: &[PointMetrics],
    i: usize,
    slo: &SloTargets,
    cost_per_hour: Option<f64>,
    reason: String,
) -> Recommendation {
    let p = &points[i];
    Recommendation {
        point: i,
        knobs: p.knobs,
        slo_met: verdict(p, slo).meets,
        ttft_p95_ms: p.ttft_p95_ms,
        tpot_p50_ms: p.tpot_p50_ms,
        output_tok_s: p.output_tok_s,
        cost_per_million_output_tokens: cost_per_hour
            .and_then(|c| cost_per_million_output_tokens(c, p.output_tok_s)),
        reason,
    }
}

/// Indices of `points` by series, each in ascending `max_num_seqs`.
pub fn series(points: &[PointMetrics]) -> BTreeMap<(usize, usize), Vec<usize>> {
    let mut by: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        by.entry(p.knobs.series()).or_default().push(i);
    }
    for v in by.values_mut() {
        v.sort_by_key(|&i| points[i].knobs.max_num_seqs);
    }
    by
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0} ms"))
        .unwrap_or_else(|| "n/a".into())
}

/// One series' interactive candidate: (recommended index, largest passing index, reason).
fn series_candidate(
    points: &[PointMetrics],
    idx: &[usize],
    slo: &SloTargets,
) -> Option<(usize, usize, String)> {
    let meets: Vec<bool> = idx
        .iter()
        .map(|&i| verdict(&points[i], slo).meets)
        .collect();
    let run = meets.iter().take_while(|&&m| m).count();
    if run == 0 {
        return None;
    }
    let largest = idx[run - 1];
    let seqs = |i: usize| points[i].knobs.max_num_seqs;
    let mut reason = if run >= 2 {
        let chosen = idx[run - 2];
        format!(
            "max_num_seqs={} is the largest batch meeting the SLO ({}: TTFT P95 {}); backed off one step to max_num_seqs={} (TTFT P95 {}) for headroom.",
            seqs(largest),
            slo,
            fmt_ms(points[largest].ttft_p95_ms),
            seqs(chosen),
            fmt_ms(points[chosen].ttft_p95_ms)
        )
    } else {
        format!(
            "max_num_seqs={} is the largest batch meeting the SLO ({}: TTFT P95 {}); it is the smallest measured, so there is no smaller step to back off to.",
            seqs(largest),
            slo,
            fmt_ms(points[largest].ttft_p95_ms)
        )
    };
    if run < idx.len() {
        let miss = idx[run];
        reason.push_str(&format!(
            " The next batch, max_num_seqs={}, misses it ({}).",
            seqs(miss),
            verdict(&points[miss], slo).why
        ));
        let later: Vec<String> = idx[run + 1..]
            .iter()
            .zip(&meets[run + 1..])
            .filter(|(_, &m)| m)
            .map(|(&i, _)| seqs(i).to_string())
            .collect();
        if !later.is_empty() {
            reason.push_str(&format!(
                " max_num_seqs={} met it again after that miss; taken for noise and not used.",
                later.join(", ")
            ));
        }
    } else {
        reason.push_str(" Every measured batch size of this series met the SLO: larger ones may too (measure them to know).");
    }
    let chosen = if run >= 2 { idx[run - 2] } else { largest };
    Some((chosen, largest, reason))
}

/// The interactive recommendation (`None` only for no points).
pub fn recommend_interactive(
    points: &[PointMetrics],
    slo: &SloTargets,
    cost_per_hour: Option<f64>,
) -> Option<Recommendation> {
    if points.is_empty() {
        return None;
    }
    let all = series(points);
    let mut cands: Vec<(usize, usize, String)> = all
        .values()
        .filter_map(|idx| series_candidate(points, idx, slo))
        .collect();
    if cands.is_empty() {
        let smallest = points.iter().map(|p| p.knobs.max_num_seqs).min()?;
        let i = (0..points.len())
            .filter(|&i| points[i].knobs.max_num_seqs == smallest)
            .min_by(|&a, &b| {
                let key = |i: usize| points[i].ttft_p95_ms.unwrap_or(f64::INFINITY);
                key(a).total_cmp(&key(b))
            })?;
        let best = points
            .iter()
            .filter_map(|p| p.ttft_p95_ms.map(|t| (t, p.knobs.max_num_seqs)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let reason = format!(
            "**No measured configuration meets the SLO** ({slo}): the lowest TTFT P95 measured was {} (max_num_seqs={}). Recommending the smallest batch size, max_num_seqs={smallest} ({}), which does NOT meet the SLO: lower the load, shorten prompts, or relax the target.",
            fmt_ms(best.map(|b| b.0)),
            best.map(|b| b.1.to_string()).unwrap_or_else(|| "-".into()),
            verdict(&points[i], slo).why
        );
        return Some(recommendation(points, i, slo, cost_per_hour, reason));
    }
    cands.sort_by(|a, b| {
        let (pa, pb) = (&points[a.0], &points[b.0]);
        pb.output_tok_s.total_cmp(&pa.output_tok_s).then(
            pa.ttft_p95_ms
                .unwrap_or(f64::INFINITY)
                .total_cmp(&pb.ttft_p95_ms.unwrap_or(f64::INFINITY)),
        )
    });
    let (chosen, _, mut reason) = cands[0].clone();
    if cands.len() > 1 {
        let others: Vec<String> = cands[1..]
            .iter()
            .map(|c| {
                let p = &points[c.0];
                format!(
                    "max_num_seqs={} with {} ({:.1} tok/s)",
                    p.knobs.max_num_seqs,
                    p.knobs.series_label(),
                    p.output_tok_s
                )
            })
            .collect();
        reason.push_str(&format!(
            " Of the {} series' candidates it has the most output throughput ({:.1} tok/s, {}), ahead of {}.",
            cands.len(),
            points[chosen].output_tok_s,
            points[chosen].knobs.series_label(),
            others.join(", ")
        ));
    }
    Some(recommendation(points, chosen, slo, cost_per_hour, reason))
}

/// The batch recommendation: the most output tokens/s (`None` when nothing produced output).
pub fn recommend_batch(
    points: &[PointMetrics],
    slo: &SloTargets,
    cost_per_hour: Option<f64>,
) -> Option<Recommendation> {
    let clean = |p: &PointMetrics| !p.partial && p.failed == 0 && p.completed > 0;
    let pool: Vec<usize> = if points.iter().any(clean) {
        (0..points.len()).filter(|&i| clean(&points[i])).collect()
    } else {
        (0..points.len())
            .filter(|&i| points[i].completed > 0)
            .collect()
    };
    let mut ranked = pool.clone();
    ranked.sort_by(|&a, &b| {
        points[b]
            .output_tok_s
            .total_cmp(&points[a].output_tok_s)
            .then(
                points[a]
                    .knobs
                    .max_num_seqs
                    .cmp(&points[b].knobs.max_num_seqs),
            )
    });
    let &best = ranked.first()?;
    let p = &points[best];
    let mut reason = format!(
        "{} has the highest output throughput of the {} usable points: {:.1} tok/s",
        p.knobs,
        pool.len(),
        p.output_tok_s
    );
    if let Some(&second) = ranked.get(1) {
        let q = &points[second];
        let gain = if q.output_tok_s > 0.0 {
            format!(
                " (+{:.1}%)",
                (p.output_tok_s / q.output_tok_s - 1.0) * 100.0
            )
        } else {
            String::new()
        };
        reason.push_str(&format!(
            "{gain}, ahead of max_num_seqs={} ({}) at {:.1} tok/s",
            q.knobs.max_num_seqs,
            q.knobs.series_label(),
            q.output_tok_s
        ));
    }
    reason.push('.');
    if let Some(c) = cost_per_hour.and_then(|c| cost_per_million_output_tokens(c, p.output_tok_s)) {
        reason.push_str(&format!(
            " That is also the lowest cost per million output tokens: {c:.4}."
        ));
    }
    reason.push_str(if verdict(p, slo).meets {
        " It also meets the interactive SLO."
    } else {
        " It does not meet the interactive SLO (batch work has no TTFT target)."
    });
    if pool.len() < points.len() {
        reason.push_str(&format!(
            " {} point(s) with failed requests or cut short were not considered.",
            points.len() - pool.len()
        ));
    }
    Some(recommendation(points, best, slo, cost_per_hour, reason))
}

/// Distribution-free 95% confidence interval of the `p`-th percentile of
/// `sorted` data, from order statistics (normal approximation of the binomial
/// rank): `None` for fewer than two values.
pub fn percentile_ci(sorted: &[f64], p: f64) -> Option<(f64, f64)> {
    let n = sorted.len();
    if n < 2 {
        return None;
    }
    let q = (p / 100.0).clamp(0.0, 1.0);
    let mean = n as f64 * q;
    let sd = (n as f64 * q * (1.0 - q)).sqrt();
    let lo = ((mean - 1.96 * sd).floor() as isize).clamp(1, n as isize) as usize;
    let hi = ((mean + 1.96 * sd).ceil() as isize + 1).clamp(1, n as isize) as usize;
    Some((sorted[lo - 1], sorted[hi - 1]))
}
