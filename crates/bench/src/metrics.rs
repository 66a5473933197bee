//! Metric computations (pure functions), with the definitions of `vllm bench serve`.
//!
//! * **TTFT**: send → first chunk that carries generated text.
//! * **E2E latency** (`e2el`): send → last chunk that carries generated text
//!   (vLLM's `latency`; the `[DONE]`/usage tail that follows is recorded as
//!   `end_s` but not counted, so TPOT is not inflated by it).
//! * **TPOT**: `(e2el − ttft) / (output_tokens − 1)`, only for requests with
//!   more than one output token.
//! * **ITL**: every gap between consecutive content chunks, pooled over all requests.
//! * **Percentiles**: linear interpolation between closest ranks, exactly
//!   numpy's default `np.percentile(x, p)` (method `"linear"`): rank
//!   `r = p/100·(n−1)`, value `x[⌊r⌋] + (x[⌈r⌉] − x[⌊r⌋])·(r − ⌊r⌋)` on the sorted data.
//! * **Throughput**: completed requests, output tokens and input+output tokens
//!   per second of the whole run (`duration_s`).
//! * **Goodput**: requests meeting every per-request SLO target per second of
//!   the run; **SLO attainment**: good requests / all requests (failed requests
//!   are never good).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;
use crate::slo::{SloMetric, SloSpec};

/// numpy-style linear-interpolation percentile of `values` (need not be
/// sorted), `p` in 0..=100. Returns `None` for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, p)
}

/// [`percentile`] on already-sorted data.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// Time to first token (seconds), if any content arrived.
pub fn ttft(r: &RequestRecord) -> Option<f64> {
    r.chunk_s.first().copied()
}

/// End-to-end latency (seconds): send → last content chunk.
pub fn e2el(r: &RequestRecord) -> Option<f64> {
    r.chunk_s.last().copied()
}

/// Time per output token (seconds) after the first, for requests with > 1 output token.
pub fn tpot(r: &RequestRecord) -> Option<f64> {
    let n = r.output_tokens();
    if n <= 1 {
        return None;
    }
    Some((e2el(r)? - ttft(r)?) / (n - 1) as f64)
}

/// Every gap (seconds) between consecutive content chunks of one request.
pub fn itls(r: &RequestRecord) -> Vec<f64> {
    r.chunk_s.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Distribution summary of one metric, in milliseconds. All zeros when `count` is 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub count: usize,
    pub mean: f64,
    /// Population standard deviation (numpy's `np.std`).
    pub std: f64,
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    /// Summary of values given in seconds, reported in milliseconds.
    pub fn from_seconds(values: &[f64]) -> Stats {
        let mut ms: Vec<f64> = values.iter().map(|v| v * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            return Stats::default();
        }
        let n = ms.len() as f64;
        let mean = ms.iter().sum::<f64>() / n;
        let var = ms.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let p = |q| percentile_sorted(&ms, q).unwrap_or(0.0);
        Stats {
            count: ms.len(),
            mean,
            std: var.sqrt(),
            min: ms[0],
            median: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
            max: ms[ms.len() - 1],
        }
    }
}

/// The result of one aggregate target such as `ttft_p95=500ms`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloCheck {
    pub target: String,
    pub metric: SloMetric,
    pub percentile: f64,
    pub threshold_ms: f64,
    /// The measured percentile (ms); `None` when the metric has no samples.
    pub actual_ms: Option<f64>,
    pub met: bool,
}

/// How often one error message occurred.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorCount {
    pub error: String,
    pub count: usize,
}

/// Requests that met or missed the targets the server judged them by (sloserve
/// reports them in `usage.sloserve` when a request carries targets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTargets {
    pub ttft_met: usize,
    pub ttft_missed: usize,
    pub tpot_met: usize,
    pub tpot_missed: usize,
}

impl ServerTargets {
    /// Counts the verdicts of `records`; `None` when the server gave none.
    pub fn count(records: &[&RequestRecord]) -> Option<ServerTargets> {
        let mut t = ServerTargets::default();
        for r in records {
            match r.server_ttft_met {
                Some(true) => t.ttft_met += 1,
                Some(false) => t.ttft_missed += 1,
                None => {}
            }
            match r.server_tpot_met {
                Some(true) => t.tpot_met += 1,
                Some(false) => t.tpot_missed += 1,
                None => {}
            }
        }
        (t != ServerTargets::default()).then_some(t)
    }
}

/// Everything measured at one load point (or for one SLO class of it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub mean_input_tokens: f64,
    pub mean_output_tokens: f64,
    /// Completed requests whose token counts came from counting chunks
    /// because the server sent no `usage`.
    pub usage_missing: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft_ms: Stats,
    pub tpot_ms: Stats,
    pub itl_ms: Stats,
    pub e2el_ms: Stats,
    /// Requests meeting every per-request target (`None` without `--slo`).
    pub good_requests: Option<usize>,
    /// Good requests per second of the run.
    pub goodput: Option<f64>,
    /// Good requests / all requests (completed + failed).
    pub slo_attainment: Option<f64>,
    pub slo_checks: Vec<SloCheck>,
    /// Failed requests grouped by error message, most frequent first.
    pub errors: Vec<ErrorCount>,
    /// The server's own verdicts on per-request targets (`None`: it gave none).
    #[serde(default)]
    pub server_targets: Option<ServerTargets>,
}

/// Whether one successful request meets every per-request target of `slo`.
pub fn request_is_good(r: &RequestRecord, slo: &SloSpec) -> bool {
    r.ok()
        && slo.request_is_good(
            ttft(r).map(|v| v * 1e3),
            tpot(r).map(|v| v * 1e3),
            e2el(r).map(|v| v * 1e3),
        )
}

/// Summarise `records` of a run that took `duration_s`, checking `slo`.
pub fn summarize(records: &[RequestRecord], duration_s: f64, slo: &SloSpec) -> Summary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let ttfts: Vec<f64> = ok.iter().filter_map(|r| ttft(r)).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|r| tpot(r)).collect();
    let e2els: Vec<f64> = ok.iter().filter_map(|r| e2el(r)).collect();
    let itl_all: Vec<f64> = ok.iter().flat_map(|r| itls(r)).collect();
    let total_in: u64 = ok.iter().map(|r| r.input_tokens()).sum();
    let total_out: u64 = ok.iter().map(|r| r.output_tokens()).sum();
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let mean = |x: u64| {
        if ok.is_empty() {
            0.0
        } else {
            x as f64 / ok.len() as f64
        }
    };

    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter_map(|r| r.error.as_deref()) {
        *errors.entry(summarize_error(r)).or_default() += 1;
    }
    let mut errors: Vec<ErrorCount> = errors
        .into_iter()
        .map(|(error, count)| ErrorCount { error, count })
        .collect();
    errors.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.error.cmp(&b.error)));

    let mut s = Summary {
        completed: ok.len(),
        failed: records.len() - ok.len(),
        duration_s,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        mean_input_tokens: mean(total_in),
        mean_output_tokens: mean(total_out),
        usage_missing: ok.iter().filter(|r| !r.usage_reported()).count(),
        request_throughput: per_s(ok.len() as f64),
        output_throughput: per_s(total_out as f64),
        total_token_throughput: per_s((total_in + total_out) as f64),
        ttft_ms: Stats::from_seconds(&ttfts),
        tpot_ms: Stats::from_seconds(&tpots),
        itl_ms: Stats::from_seconds(&itl_all),
        e2el_ms: Stats::from_seconds(&e2els),
        errors,
        server_targets: ServerTargets::count(&ok),
        ..Summary::default()
    };
    if !slo.is_empty() {
        let good = records.iter().filter(|r| request_is_good(r, slo)).count();
        s.good_requests = Some(good);
        s.goodput = Some(per_s(good as f64));
        s.slo_attainment = Some(if records.is_empty() {
            0.0
        } else {
            good as f64 / records.len() as f64
        });
        for t in slo.targets.iter() {
            let Some(p) = t.percentile else { continue };
            let values = match t.metric {
                SloMetric::Ttft => &ttfts,
                SloMetric::Tpot => &tpots,
                SloMetric::Itl => &itl_all,
                SloMetric::E2el => &e2els,
            };
            let actual_ms = percentile(values, p).map(|v| v * 1e3);
            s.slo_checks.push(SloCheck {
                target: t.to_string(),
                metric: t.metric,
                percentile: p,
                threshold_ms: t.threshold_ms,
                actual_ms,
                met: actual_ms.is_some_and(|a| a <= t.threshold_ms),
            });
        }
    }
    s
}

/// Shorten an error to a one-line key for grouping (first line, at most 160 chars).
pub fn summarize_error(e: &str) -> String {
    let line = e.lines().next().unwrap_or("").trim();
    if line.chars().count() > 160 {
        format!("{}…", line.chars().take(160).collect::<String>())
    } else {
        line.to_string()
    }
}
