//! Prometheus metrics: the families of `metric_families.rs` measured and
//! rendered with `sloserve_api::prom`'s writer. Histograms
//! (per SLO class) are observed from each finished request's engine timings (TTFT,
//! queue, prefill, e2e, TPOT) and from token times (ITL); gauges and counters are
//! read from `EngineHandle::stats()` at scrape time (the grammar's mask-time
//! histogram too: the engine's thread keeps it), the grammar's compile counts from
//! `sloserve_grammar::compile_counts()`. Names follow vLLM's pattern,
//! plus the `vllm:` gauges the Kubernetes inference gateway reads.
//!
//! Observing takes no lock: every bucket, count and sum is an atomic (an ITL is
//! observed per token, from every request's task at once).

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sloserve_api::prom::{Family, Writer};
use sloserve_engine::stats::MASK_TIME_BUCKETS;
use sloserve_engine::{EngineStats, FinishInfo, FinishReason, SloClass};

use crate::metric_families as F;

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

/// Each histogram's family, in `H`'s order.
const HISTOGRAMS: [(H, &Family); 6] = [
    (H::Ttft, &F::TTFT),
    (H::Itl, &F::ITL),
    (H::Tpot, &F::TPOT),
    (H::E2e, &F::E2E),
    (H::Queue, &F::QUEUE_TIME),
    (H::Prefill, &F::PREFILL_TIME),
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

    /// The whole exposition: histograms plus the engine's gauges and counters,
    /// every family from `metric_families.rs`.
    pub fn render(&self, st: &EngineStats) -> String {
        let mut w = Writer::with_capacity(16 << 10);
        self.render_into(st, &mut w);
        w.into_string()
    }

    /// [`Metrics::render`] into a writer (the Batch API's families follow).
    pub fn render_into(&self, st: &EngineStats, w: &mut Writer) {
        let m: &dyn Display = &self.model_name;
        for (h, f) in HISTOGRAMS {
            w.head(f);
            for class in SloClass::ALL {
                let s = self.hist[h as usize][class.index()].snapshot();
                w.histogram(f, &[m, &class], &BUCKETS, &s.counts, s.sum, s.count);
            }
        }
        // The grammar's mask time per constrained token (kept by the engine's
        // thread, read with its stats): one series, no class split.
        let mt = &st.counters.mask_times;
        w.head(&F::GRAMMAR_MASK_TIME);
        w.histogram(
            &F::GRAMMAR_MASK_TIME,
            &[m],
            &MASK_TIME_BUCKETS,
            &mt.buckets,
            mt.sum_ns as f64 / 1e9,
            mt.count,
        );
        let per_class = |w: &mut Writer, f: &Family, v: &dyn Fn(SloClass) -> f64| {
            w.head(f);
            for c in SloClass::ALL {
                w.sample(f, &[m, &c], v(c));
            }
        };
        let c = &st.counters;
        per_class(w, &F::NUM_REQUESTS_RUNNING, &|k| *st.running.get(k) as f64);
        per_class(w, &F::NUM_REQUESTS_WAITING, &|k| *st.waiting.get(k) as f64);
        w.single(&F::KV_CACHE_USAGE_PERC, &[m], st.kv_usage);
        w.single(&F::KV_CACHE_BLOCKS_TOTAL, &[m], st.kv_blocks_total as f64);
        w.single(&F::KV_CACHE_BLOCKS_USED, &[m], st.kv_blocks_used as f64);
        w.single(&F::PREFILL_TOKENS_PER_SECOND, &[m], st.prefill_tokens_per_s);
        let queried = c.prefix_cache_queried_tokens as f64;
        w.single(&F::PREFIX_CACHE_QUERIES_TOTAL, &[m], queried);
        let hits = c.prefix_cache_hit_tokens as f64;
        w.single(&F::PREFIX_CACHE_HITS_TOTAL, &[m], hits);
        let d = &c.disk;
        // Hits by tier: RAM's are all hits but the loaded disk blocks.
        let ram = c.prefix_cache_hit_tokens.saturating_sub(d.loaded_tokens);
        w.head(&F::PREFIX_CACHE_TIER_HITS_TOTAL);
        w.sample(&F::PREFIX_CACHE_TIER_HITS_TOTAL, &[m, &"ram"], ram as f64);
        w.sample(
            &F::PREFIX_CACHE_TIER_HITS_TOTAL,
            &[m, &"disk"],
            d.hit_tokens as f64,
        );
        w.head(&F::PREFIX_CACHE_DISK_DECISIONS_TOTAL);
        let decisions = [("load", d.loads), ("recompute", d.recomputes)];
        for (k, v) in decisions {
            w.sample(&F::PREFIX_CACHE_DISK_DECISIONS_TOTAL, &[m, &k], v as f64);
        }
        w.head(&F::PREFIX_CACHE_DISK_BYTES_TOTAL);
        for (k, v) in [("read", d.bytes_read), ("written", d.bytes_written)] {
            w.sample(&F::PREFIX_CACHE_DISK_BYTES_TOTAL, &[m, &k], v as f64);
        }
        w.single(
            &F::PREFIX_CACHE_DISK_SPILL_DROPS_TOTAL,
            &[m],
            d.spill_drops as f64,
        );
        w.single(
            &F::PREFIX_CACHE_DISK_BAD_FILES_TOTAL,
            &[m],
            d.bad_files as f64,
        );
        w.single(
            &F::PREFIX_CACHE_DISK_EVICTIONS_TOTAL,
            &[m],
            d.blocks_evicted as f64,
        );
        w.single(&F::PREFIX_CACHE_DISK_BYTES, &[m], d.bytes as f64);
        let prompt = (c.prompt_tokens_computed + c.prompt_tokens_cached) as f64;
        w.single(&F::PROMPT_TOKENS_TOTAL, &[m], prompt);
        w.single(
            &F::GENERATION_TOKENS_TOTAL,
            &[m],
            c.generation_tokens as f64,
        );
        w.single(&F::ENGINE_RESTARTS_TOTAL, &[m], st.engine_restarts as f64);
        w.single(&F::NUM_PREEMPTIONS_TOTAL, &[m], c.preemptions as f64);
        w.head(&F::PREEMPTION_RESUMPTIONS_TOTAL);
        let resumed = [
            ("kept", c.preemptions_kept),
            ("spilled", c.preemptions_spilled),
            ("recomputed", c.preemptions_recomputed),
        ];
        for (k, v) in resumed {
            w.sample(&F::PREEMPTION_RESUMPTIONS_TOTAL, &[m, &k], v as f64);
        }
        let released = c.paused_released as f64;
        w.single(&F::PREEMPTION_PAUSED_RELEASED_TOTAL, &[m], released);
        w.head(&F::RECOMPUTED_TOKENS_TOTAL);
        let generated = c
            .recomputed_tokens
            .saturating_sub(c.recomputed_prompt_tokens);
        for (k, v) in [
            ("prompt", c.recomputed_prompt_tokens),
            ("generated", generated),
        ] {
            w.sample(&F::RECOMPUTED_TOKENS_TOTAL, &[m, &k], v as f64);
        }
        per_class(w, &F::REQUESTS_REJECTED_TOTAL, &|k| {
            *st.rejected.get(k) as f64
        });
        w.head(&F::REQUEST_SUCCESS_TOTAL);
        for class in SloClass::ALL {
            for (i, r) in REASONS.iter().enumerate() {
                let n = self.finished[class.index()][i].load(Ordering::Relaxed);
                w.sample(&F::REQUEST_SUCCESS_TOTAL, &[m, &class, r], n as f64);
            }
        }
        w.head(&F::SLO_ATTAINMENT_TOTAL);
        for class in SloClass::ALL {
            let a = st.counters.slo.get(class);
            for (slo, result, n) in [
                ("ttft", "met", a.ttft_met),
                ("ttft", "missed", a.ttft_missed),
                ("tpot", "met", a.tpot_met),
                ("tpot", "missed", a.tpot_missed),
            ] {
                let labels: [&dyn Display; 4] = [m, &class, &slo, &result];
                w.sample(&F::SLO_ATTAINMENT_TOTAL, &labels, n as f64);
            }
        }
        let deferred = c.batch_rows_deferred as f64;
        w.single(&F::BATCH_ROWS_DEFERRED_TOTAL, &[m], deferred);
        let unreachable = c.slo_unreachable_steps as f64;
        w.single(&F::SLO_UNREACHABLE_STEPS_TOTAL, &[m], unreachable);
        w.single(&F::ENGINE_STEPS_TOTAL, &[m], c.steps as f64);
        per_class(w, &F::SPEC_DECODE_NUM_DRAFTS_TOTAL, &|k| {
            c.spec[k].verify_rows as f64
        });
        per_class(w, &F::SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL, &|k| {
            c.spec[k].drafted_tokens as f64
        });
        per_class(w, &F::SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL, &|k| {
            c.spec[k].accepted_tokens as f64
        });
        per_class(w, &F::SPEC_DECODE_NUM_EMITTED_TOKENS_TOTAL, &|k| {
            c.spec[k].emitted_tokens as f64
        });
        per_class(w, &F::SPEC_DECODE_ACCEPTANCE_RATE, &|k| {
            let s = c.spec[k];
            s.accepted_tokens as f64 / s.drafted_tokens.max(1) as f64
        });
        let grammar = sloserve_grammar::compile_counts();
        w.single(&F::CONSTRAINED_REQUESTS_TOTAL, &[m], grammar.ok as f64);
        w.single(
            &F::GRAMMAR_COMPILE_ERRORS_TOTAL,
            &[m],
            grammar.errors as f64,
        );
        per_class(w, &F::GRAMMAR_FORCED_DRAFT_TOKENS_TOTAL, &|k| {
            c.forced[k].drafted_tokens as f64
        });
        per_class(w, &F::GRAMMAR_FORCED_TOKENS_TOTAL, &|k| {
            c.forced[k].accepted_tokens as f64
        });
        let dropped = crate::kv_events::dropped() as f64;
        w.single(&F::KV_EVENTS_DROPPED_TOTAL, &[m], dropped);
        let cost = &st.step_cost;
        w.head(&F::STEP_COST_SECONDS);
        let terms = sloserve_engine::step_cost::TERM_NAMES.iter();
        for (t, v) in terms.zip(cost.coefficients) {
            w.sample(&F::STEP_COST_SECONDS, &[m, t], v);
        }
        let err = cost.mean_abs_rel_error;
        w.single(&F::STEP_COST_RELATIVE_ERROR, &[m], err);
        w.head(&F::LAST_STEP_SECONDS);
        for (kind, v) in [
            ("predicted", st.last_step_predicted_s),
            ("measured", st.last_step_s),
            ("limit", st.last_step_limit_s),
        ] {
            w.sample(&F::LAST_STEP_SECONDS, &[m, &kind], v);
        }
        // The four families llm-d's endpoint picker (EPP) reads from every replica, by
        // vLLM's names and meanings (see docs/gateway.md): one series each, no class split.
        let waiting = (st.waiting.interactive + st.waiting.batch) as f64;
        let running = (st.running.interactive + st.running.batch) as f64;
        w.single(&F::VLLM_NUM_REQUESTS_WAITING, &[m], waiting);
        w.single(&F::VLLM_NUM_REQUESTS_RUNNING, &[m], running);
        w.single(&F::VLLM_KV_CACHE_USAGE_PERC, &[m], st.kv_usage);
        let (bs, blocks) = (st.kv_block_size, st.kv_blocks_total);
        w.single(&F::VLLM_CACHE_CONFIG_INFO, &[m, &bs, &blocks], 1.0);
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
