//! Prometheus metrics in the text exposition format, written by hand. Histograms
//! (per SLO class) are observed from each finished request's engine timings (TTFT,
//! queue, prefill, e2e, TPOT) and from token times (ITL); gauges and counters are
//! read from `EngineHandle::stats()` at scrape time (the grammar's mask-time
//! histogram too: the engine's thread keeps it), the grammar's compile counts from
//! `sloserve_grammar::compile_counts()`. Names follow vLLM's pattern,
//! plus the `vllm:` gauges the Kubernetes inference gateway reads.
//!
//! Observing takes no lock: every bucket, count and sum is an atomic (an ITL is
//! observed per token, from every request's task at once).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sloserve_engine::stats::MASK_TIME_BUCKETS;
use sloserve_engine::{EngineStats, FinishInfo, FinishReason, SloClass};

/// Seconds; from 5 ms (a 100 ms voice SLO falls well inside) to 60 s.
pub const BUCKETS: [f64; 20] = [
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
    15.0, 20.0, 30.0, 60.0,
];

/// A histogram that many threads observe into at once, lock-free.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    /// The f64 bits of the sum of the observed values.
    sum: AtomicU64,
    count: AtomicU64,
}

/// A histogram as read at one scrape.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&self, secs: f64) {
        // The count first, each bucket after it with Release, and `snapshot` reads
        // the buckets (Acquire) before the count: a scrape never sees more in the
        // buckets than in the count (the `+Inf` bucket).
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Ordering::Release);
        }
        let mut cur = self.sum.load(Ordering::Relaxed);
        loop {
            let new = (f64::from_bits(cur) + secs).to_bits();
            match self
                .sum
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }

    fn snapshot(&self) -> Snapshot {
        let counts = std::array::from_fn(|i| self.counts[i].load(Ordering::Acquire));
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        let count = self.count.load(Ordering::Acquire);
        Snapshot { counts, sum, count }
    }
}

impl Snapshot {
    /// The `q` quantile (0-1) as Prometheus' `histogram_quantile` estimates it:
    /// linear within the bucket it falls in (from 0 in the first); past the last
    /// bound, that bound. `None` before any observation.
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (i, &n) in self.counts.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let lo = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
                let into = (rank - below as f64) / n as f64;
                return Some(lo + (BUCKETS[i] - lo) * into);
            }
            below += n;
        }
        Some(BUCKETS[BUCKETS.len() - 1])
    }
}

/// One class's latency figure since start, read from its histogram (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_s: Option<f64>,
    pub p50_s: Option<f64>,
    pub p90_s: Option<f64>,
    pub p99_s: Option<f64>,
}

impl From<Snapshot> for LatencySummary {
    fn from(s: Snapshot) -> Self {
        LatencySummary {
            count: s.count,
            mean_s: (s.count > 0).then(|| s.sum / s.count as f64),
            p50_s: s.quantile(0.5),
            p90_s: s.quantile(0.9),
            p99_s: s.quantile(0.99),
        }
    }
}

/// Requests of one class finished since start, by the reasons of `/metrics`'
/// `request_success_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FinishedCounts {
    pub stop: u64,
    pub length: u64,
    pub error: u64,
    pub abort: u64,
}

#[derive(Debug, Clone, Copy)]
enum H {
    Ttft,
    Itl,
    Tpot,
    E2e,
    Queue,
    Prefill,
}

const HISTOGRAMS: [(H, &str, &str); 6] = [
    (
        H::Ttft,
        "time_to_first_token_seconds",
        "Time from arrival to the first token.",
    ),
    (
        H::Itl,
        "inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
    ),
    (
        H::Tpot,
        "time_per_output_token_seconds",
        "Mean time per output token after the first, per request.",
    ),
    (
        H::E2e,
        "e2e_request_latency_seconds",
        "Time from arrival to the request's end.",
    ),
    (
        H::Queue,
        "request_queue_time_seconds",
        "Time from arrival to the first scheduled step.",
    ),
    (
        H::Prefill,
        "request_prefill_time_seconds",
        "Time from the first scheduled step to the first token.",
    ),
];

/// Requests finished, by reason (the order of `REASONS`).
type Finished = [AtomicU64; 4];

const REASONS: [&str; 4] = ["stop", "length", "error", "abort"];

pub struct Metrics {
    model_name: String,
    /// [histogram][class]
    hist: [[Histogram; 2]; 6],
    /// Requests finished, [class][stop, length, error, cancelled by client].
    finished: [Finished; 2],
}

impl Metrics {
    pub fn new(model_name: &str) -> Self {
        Metrics {
            model_name: model_name.replace(['"', '\\', '\n'], "_"),
            hist: Default::default(),
            finished: Default::default(),
        }
    }

    /// Per token: three atomic adds, no lock.
    pub fn observe_itl(&self, class: SloClass, d: Duration) {
        self.hist[H::Itl as usize][class.index()].observe(d.as_secs_f64());
    }

    /// A request the engine finished (any reason).
    pub fn observe_finished(&self, class: SloClass, info: &FinishInfo) {
        let c = class.index();
        let t = &info.timings;
        {
            // By `FinishReason::as_openai`, the order of `REASONS`.
            let reason = match info.reason {
                FinishReason::Stop | FinishReason::StopString => 0,
                FinishReason::Length => 1,
                FinishReason::Error(_) | FinishReason::Constraint(_) => 2,
                FinishReason::Cancelled
                | FinishReason::Aborted
                | FinishReason::TimedOut
                | FinishReason::ClientStalled
                | FinishReason::Shed => 3,
            };
            self.finished[c][reason].fetch_add(1, Ordering::Relaxed);
            if reason > 1 {
                return;
            }
            let obs = |h: H, d: Option<Duration>| {
                if let Some(d) = d {
                    self.hist[h as usize][c].observe(d.as_secs_f64());
                }
            };
            obs(H::Ttft, t.ttft());
            obs(H::E2e, t.e2e());
            obs(H::Queue, t.queue_time());
            obs(H::Prefill, t.prefill_time());
            obs(H::Tpot, t.mean_inter_token(info.completion_tokens));
        }
    }

    /// A client went away before its request finished.
    pub fn observe_disconnect(&self, class: SloClass) {
        self.finished[class.index()][3].fetch_add(1, Ordering::Relaxed);
    }

    /// A class's TTFT since start (the `time_to_first_token_seconds` histogram).
    pub fn ttft(&self, class: SloClass) -> LatencySummary {
        self.hist[H::Ttft as usize][class.index()].snapshot().into()
    }

    /// A class's TPOT since start (the `time_per_output_token_seconds` histogram).
    pub fn tpot(&self, class: SloClass) -> LatencySummary {
        self.hist[H::Tpot as usize][class.index()].snapshot().into()
    }

    /// Tokens a class's requests received after their first: the count of its
    /// `inter_token_latency_seconds` histogram (observed live, per token).
    pub fn tokens_after_first(&self, class: SloClass) -> u64 {
        self.hist[H::Itl as usize][class.index()]
            .count
            .load(Ordering::Acquire)
    }

    /// A class's finished requests by reason (`request_success_total`).
    pub fn finished(&self, class: SloClass) -> FinishedCounts {
        let f = |r: usize| self.finished[class.index()][r].load(Ordering::Relaxed);
        FinishedCounts {
            stop: f(0),
            length: f(1),
            error: f(2),
            abort: f(3),
        }
    }

    /// The whole exposition: histograms plus the engine's gauges and counters.
    pub fn render(&self, st: &EngineStats) -> String {
        let model = &self.model_name;
        let mut out = String::with_capacity(16 << 10);
        let hist: [[Snapshot; 2]; 6] =
            std::array::from_fn(|h| std::array::from_fn(|c| self.hist[h][c].snapshot()));
        let finished: [[u64; 4]; 2] = std::array::from_fn(|c| {
            std::array::from_fn(|r| self.finished[c][r].load(Ordering::Relaxed))
        });
        for (h, name, help) in HISTOGRAMS {
            let _ = writeln!(out, "# HELP sloserve:{name} {help}");
            let _ = writeln!(out, "# TYPE sloserve:{name} histogram");
            for class in SloClass::ALL {
                let hg = &hist[h as usize][class.index()];
                let labels = format!("model_name=\"{model}\",slo_class=\"{class}\"");
                let mut cum = 0;
                for (b, n) in BUCKETS.iter().zip(hg.counts) {
                    cum += n;
                    let _ = writeln!(out, "sloserve:{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
                }
                let _ = writeln!(
                    out,
                    "sloserve:{name}_bucket{{{labels},le=\"+Inf\"}} {}",
                    hg.count
                );
                let _ = writeln!(out, "sloserve:{name}_sum{{{labels}}} {}", hg.sum);
                let _ = writeln!(out, "sloserve:{name}_count{{{labels}}} {}", hg.count);
            }
        }
        // The grammar's mask time per constrained token (kept by the engine's
        // thread, read with its stats): one series, no class split.
        {
            let mt = &st.counters.mask_times;
            let name = "sloserve:grammar_mask_time_seconds";
            let labels = format!("model_name=\"{model}\"");
            let _ = writeln!(
                out,
                "# HELP {name} Time the grammar took to compute each constrained token's mask."
            );
            let _ = writeln!(out, "# TYPE {name} histogram");
            let mut cum = 0;
            for (b, n) in MASK_TIME_BUCKETS.iter().zip(mt.buckets) {
                cum += n;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", mt.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", mt.sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", mt.count);
        }
        let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        };
        let m = format!("model_name=\"{model}\"");
        let per_class = |f: &dyn Fn(SloClass) -> f64| -> Vec<(String, f64)> {
            SloClass::ALL
                .iter()
                .map(|&c| (format!("{m},slo_class=\"{c}\""), f(c)))
                .collect()
        };
        let one = |v: f64| vec![(m.clone(), v)];
        let c = &st.counters;
        family(
            "sloserve:num_requests_running",
            "gauge",
            "Requests running in the engine.",
            per_class(&|k| *st.running.get(k) as f64),
        );
        family(
            "sloserve:num_requests_waiting",
            "gauge",
            "Requests waiting to start.",
            per_class(&|k| *st.waiting.get(k) as f64),
        );
        family(
            "sloserve:kv_cache_usage_perc",
            "gauge",
            "Fraction of KV blocks held by running requests (0-1).",
            one(st.kv_usage),
        );
        family(
            "sloserve:kv_cache_blocks_total",
            "gauge",
            "KV blocks in the pool.",
            one(st.kv_blocks_total as f64),
        );
        family(
            "sloserve:kv_cache_blocks_used",
            "gauge",
            "KV blocks held by running requests.",
            one(st.kv_blocks_used as f64),
        );
        family(
            "sloserve:prefill_tokens_per_second",
            "gauge",
            "Measured prefill rate (moving average).",
            one(st.prefill_tokens_per_s),
        );
        family(
            "sloserve:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            one(c.prefix_cache_queried_tokens as f64),
        );
        family(
            "sloserve:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            one(c.prefix_cache_hit_tokens as f64),
        );
        family(
            "sloserve:prompt_tokens_total",
            "counter",
            "Prompt tokens of started requests (computed plus cached).",
            one((c.prompt_tokens_computed + c.prompt_tokens_cached) as f64),
        );
        family(
            "sloserve:generation_tokens_total",
            "counter",
            "Tokens generated.",
            one(c.generation_tokens as f64),
        );
        family(
            "sloserve:engine_restarts_total",
            "counter",
            "Engine restarts after a panic on its thread (in-flight requests failed).",
            one(st.engine_restarts as f64),
        );
        family(
            "sloserve:num_preemptions_total",
            "counter",
            "Sequences preempted (KV freed, recomputed later).",
            one(c.preemptions as f64),
        );
        family(
            "sloserve:requests_rejected_total",
            "counter",
            "Requests refused by admission control (HTTP 429).",
            per_class(&|k| *st.rejected.get(k) as f64),
        );
        let mut rows = Vec::new();
        for class in SloClass::ALL {
            for (i, r) in REASONS.iter().enumerate() {
                rows.push((
                    format!("{m},slo_class=\"{class}\",finished_reason=\"{r}\""),
                    finished[class.index()][i] as f64,
                ));
            }
        }
        family(
            "sloserve:request_success_total",
            "counter",
            "Requests finished, by reason.",
            rows,
        );
        let mut rows = Vec::new();
        for class in SloClass::ALL {
            let a = st.counters.slo.get(class);
            for (slo, result, n) in [
                ("ttft", "met", a.ttft_met),
                ("ttft", "missed", a.ttft_missed),
                ("tpot", "met", a.tpot_met),
                ("tpot", "missed", a.tpot_missed),
            ] {
                rows.push((
                    format!("{m},slo_class=\"{class}\",slo=\"{slo}\",result=\"{result}\""),
                    n as f64,
                ));
            }
        }
        family(
            "sloserve:slo_attainment_total",
            "counter",
            "Finished requests that met or missed their absolute TTFT / TPOT target.",
            rows,
        );
        family(
            "sloserve:batch_rows_deferred_total",
            "counter",
            "Batch decode rows left out of a step to keep an interactive target.",
            one(c.batch_rows_deferred as f64),
        );
        family(
            "sloserve:slo_unreachable_steps_total",
            "counter",
            "Steps whose interactive work alone was predicted to miss the tightest interactive target (the machine cannot meet it even without batch work).",
            one(c.slo_unreachable_steps as f64),
        );
        family(
            "sloserve:engine_steps_total",
            "counter",
            "Engine steps run (generation_tokens_total over this: tokens per step).",
            one(c.steps as f64),
        );
        family(
            "sloserve:spec_decode_num_drafts_total",
            "counter",
            "N-gram speculation: decode rows that carried a draft to verify (batch-class rows never draft).",
            per_class(&|k| c.spec[k].verify_rows as f64),
        );
        family(
            "sloserve:spec_decode_num_draft_tokens_total",
            "counter",
            "N-gram speculation: draft tokens verified.",
            per_class(&|k| c.spec[k].drafted_tokens as f64),
        );
        family(
            "sloserve:spec_decode_num_accepted_tokens_total",
            "counter",
            "N-gram speculation: draft tokens accepted (the output is the same as without speculation).",
            per_class(&|k| c.spec[k].accepted_tokens as f64),
        );
        family(
            "sloserve:spec_decode_num_emitted_tokens_total",
            "counter",
            "N-gram speculation: tokens the verifying rows emitted (accepted drafts plus the one sampled where each draft ended).",
            per_class(&|k| c.spec[k].emitted_tokens as f64),
        );
        family(
            "sloserve:spec_decode_acceptance_rate",
            "gauge",
            "N-gram speculation: accepted over drafted tokens since start (0 before any draft).",
            per_class(&|k| {
                let s = c.spec[k];
                s.accepted_tokens as f64 / s.drafted_tokens.max(1) as f64
            }),
        );
        let grammar = sloserve_grammar::compile_counts();
        family(
            "sloserve:constrained_requests_total",
            "counter",
            "Requests decoded under a grammar (response_format json_schema / json_object, constrained tool calls): constraints compiled or found in the compile cache.",
            one(grammar.ok as f64),
        );
        family(
            "sloserve:grammar_compile_errors_total",
            "counter",
            "Constraints that did not compile (answered 400, naming why).",
            one(grammar.errors as f64),
        );
        family(
            "sloserve:grammar_forced_draft_tokens_total",
            "counter",
            "Grammar fast-forward: tokens a grammar forced (its only continuation), verified as a draft instead of a step each.",
            per_class(&|k| c.forced[k].drafted_tokens as f64),
        );
        family(
            "sloserve:grammar_forced_tokens_total",
            "counter",
            "Grammar fast-forward: forced tokens accepted, each emitted without a step of its own (the model may draw another tokenization of the forced text, which ends the run).",
            per_class(&|k| c.forced[k].accepted_tokens as f64),
        );
        family(
            "sloserve:kv_events_dropped_total",
            "counter",
            "KV-cache event batches dropped because the publisher's queue was full (--kv-events-endpoint not connected or not keeping up).",
            one(crate::kv_events::dropped() as f64),
        );
        let cost = &st.step_cost;
        family(
            "sloserve:step_cost_seconds",
            "gauge",
            "The online step-time model: seconds per unit of each term (fixed per step, per prefill token, per decode row, per 1000 attention context tokens, and the jump past the runner's small-batch path).",
            sloserve_engine::step_cost::TERM_NAMES
                .iter()
                .zip(cost.coefficients)
                .map(|(t, v)| (format!("{m},term=\"{t}\""), v))
                .collect(),
        );
        family(
            "sloserve:step_cost_relative_error",
            "gauge",
            "Mean absolute relative error of the step-time prediction (moving average).",
            one(cost.mean_abs_rel_error),
        );
        family(
            "sloserve:last_step_seconds",
            "gauge",
            "The latest step: predicted and measured seconds, and its time limit (0 when no interactive target bounded it).",
            vec![
                (format!("{m},kind=\"predicted\""), st.last_step_predicted_s),
                (format!("{m},kind=\"measured\""), st.last_step_s),
                (format!("{m},kind=\"limit\""), st.last_step_limit_s),
            ],
        );
        let waiting = (st.waiting.interactive + st.waiting.batch) as f64;
        let running = (st.running.interactive + st.running.batch) as f64;
        // The four families llm-d's endpoint picker (EPP) reads from every replica, by
        // vLLM's names and meanings (see docs/gateway.md): one series each, no class split.
        family(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests admitted and waiting to start, preempted ones included, both SLO classes (vLLM's name and meaning).",
            one(waiting),
        );
        family(
            "vllm:num_requests_running",
            "gauge",
            "Requests in the engine's running set (prefill or decode), both SLO classes (vLLM's name and meaning).",
            one(running),
        );
        family(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage, 0-1: blocks held by running requests over all blocks; blocks only the prefix cache holds count as free (vLLM's name and meaning).",
            one(st.kv_usage),
        );
        family(
            "vllm:cache_config_info",
            "gauge",
            "The KV cache's configuration as labels: block_size (tokens per block), num_gpu_blocks (blocks in the pool); value 1 (vLLM's info gauge).",
            vec![(
                format!(
                    "{m},block_size=\"{}\",num_gpu_blocks=\"{}\"",
                    st.kv_block_size, st.kv_blocks_total
                ),
                1.0,
            )],
        );
        out
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
