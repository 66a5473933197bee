//! `EngineStats`: a snapshot of the engine's gauges and counters that the server's
//! `/metrics` reads cheaply (the engine publishes one per step behind a mutex).

use serde::Serialize;

use crate::request::SloClass;
use crate::step_cost::StepCostFigures;

/// One value per SLO class (indexable by [`SloClass`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PerClass<T> {
    pub interactive: T,
    pub batch: T,
}

impl<T> std::ops::Index<SloClass> for PerClass<T> {
    type Output = T;
    fn index(&self, class: SloClass) -> &T {
        self.get(class)
    }
}

impl<T> std::ops::IndexMut<SloClass> for PerClass<T> {
    fn index_mut(&mut self, class: SloClass) -> &mut T {
        self.get_mut(class)
    }
}

impl<T> PerClass<T> {
    /// `(class, value)` for both classes, highest priority first.
    pub fn iter(&self) -> impl Iterator<Item = (SloClass, &T)> {
        SloClass::ALL.into_iter().map(move |c| (c, self.get(c)))
    }
    /// `(class, value)` for both classes, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (SloClass, &mut T)> {
        SloClass::ALL
            .into_iter()
            .zip([&mut self.interactive, &mut self.batch])
    }
    pub fn get(&self, class: SloClass) -> &T {
        match class {
            SloClass::Interactive => &self.interactive,
            SloClass::Batch => &self.batch,
        }
    }
    pub fn get_mut(&mut self, class: SloClass) -> &mut T {
        match class {
            SloClass::Interactive => &mut self.interactive,
            SloClass::Batch => &mut self.batch,
        }
    }
}

/// Requests that met or missed their latency targets (counted when a request
/// finishes with `stop` or `length`; only requests with an absolute target count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SloAttainment {
    pub ttft_met: u64,
    pub ttft_missed: u64,
    pub tpot_met: u64,
    pub tpot_missed: u64,
}

/// Cumulative counters kept by the scheduler (monotonic since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Prefix-cache lookups, in tokens: tokens looked up at each admission
    /// (including re-admissions after preemption) ...
    pub prefix_cache_queried_tokens: u64,
    /// ... and tokens found cached.
    pub prefix_cache_hit_tokens: u64,
    /// Prompt tokens requests had to compute at their first admission.
    pub prompt_tokens_computed: u64,
    /// Prompt tokens requests found in the prefix cache at their first admission.
    pub prompt_tokens_cached: u64,
    /// Tokens whose KV a preempted sequence had, released, and computed again
    /// when it resumed (not found in the prefix cache, RAM or disk) ...
    pub recomputed_tokens: u64,
    /// ... of them, prompt tokens.
    pub recomputed_prompt_tokens: u64,
    /// Tokens run in prefill chunks (all of them, for throughput).
    pub prefill_tokens: u64,
    /// Tokens sampled.
    pub generation_tokens: u64,
    pub preemptions: u64,
    /// Preempted sequences that resumed, by what became of their KV: kept
    /// (paused with their blocks; nothing recomputed) ...
    pub preemptions_kept: u64,
    /// ... released for memory, every full block found again in the prefix
    /// cache (RAM or disk; at most the partial last block recomputed) ...
    pub preemptions_spilled: u64,
    /// ... or released, some full blocks recomputed.
    pub preemptions_recomputed: u64,
    /// Paused sequences whose kept KV was released because memory was needed.
    pub paused_released: u64,
    pub requests_started: u64,
    pub requests_finished_stop: u64,
    pub requests_finished_length: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub steps: u64,
    /// Batch decode rows left out of a step to keep an interactive target.
    pub batch_rows_deferred: u64,
    /// Steps whose interactive work alone was predicted to miss the tightest
    /// interactive target (the machine cannot meet it even without batch rows:
    /// the step runs the interactive work, batch rows only as starving ones).
    pub slo_unreachable_steps: u64,
    /// Targets met / missed, per class.
    pub slo: PerClass<SloAttainment>,
    /// The grammar's mask time of each constrained token sampled.
    pub mask_times: MaskTimes,
    /// N-gram speculation, per class (batch rows never draft).
    pub spec: PerClass<SpecCounters>,
    /// Grammar fast-forward (tokens a grammar forced, verified as drafts), per class.
    pub forced: PerClass<ForcedCounters>,
    /// The prefix cache's disk tier (`--prefix-cache-dir`).
    pub disk: DiskCounters,
}

impl Counters {
    /// A preempted sequence resumed: counts what became of its KV.
    pub(crate) fn count_resumption(&mut self, r: crate::sequence::Resumed) {
        use crate::sequence::Resumed;
        let (recomputed, prompt) = match r {
            Resumed::Kept => {
                self.preemptions_kept += 1;
                (0, 0)
            }
            Resumed::Spilled { recomputed, prompt } => {
                self.preemptions_spilled += 1;
                (recomputed, prompt)
            }
            Resumed::Recomputed { recomputed, prompt } => {
                self.preemptions_recomputed += 1;
                (recomputed, prompt)
            }
        };
        self.recomputed_tokens += recomputed as u64;
        self.recomputed_prompt_tokens += prompt as u64;
    }
}

/// What the prefix cache's disk tier did (all 0 without one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiskCounters {
    /// Tokens found on disk at admission (loaded or recomputed: see below); the
    /// RAM tier's are `prefix_cache_hit_tokens` less the loaded ones.
    pub hit_tokens: u64,
    /// Prefixes found on disk and loaded (the step-time model predicted loading
    /// cheaper than recomputing), and their tokens ...
    pub loads: u64,
    pub loaded_tokens: u64,
    /// ... and prefixes found on disk but recomputed.
    pub recomputes: u64,
    /// Bytes of block files read back.
    pub bytes_read: u64,
    /// Bytes of block files written, and blocks.
    pub bytes_written: u64,
    pub blocks_written: u64,
    /// Blocks not spilled: the writer's queue was full.
    pub spill_drops: u64,
    /// Block files deleted by the size limit (least recently used first).
    pub blocks_evicted: u64,
    /// Block files found damaged or foreign when read back (skipped, deleted).
    pub bad_files: u64,
    /// Writes that failed (the block is not on disk).
    pub write_errors: u64,
    /// Blocks and bytes on disk now.
    pub blocks: u64,
    pub bytes: u64,
}

/// What grammar fast-forward did for one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ForcedCounters {
    /// Forced tokens verified as drafts.
    pub drafted_tokens: u64,
    /// Forced tokens accepted: each emitted without a step of its own (a model
    /// may draw another tokenization of the forced text, which rejects the rest).
    pub accepted_tokens: u64,
}

/// What n-gram speculation did for one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SpecCounters {
    /// Verification rows run (a decode row with a draft).
    pub verify_rows: u64,
    /// Draft tokens verified.
    pub drafted_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Tokens the verification rows emitted (the accepted ones, plus the one
    /// sampled where the draft stopped or was rejected).
    pub emitted_tokens: u64,
}

/// Upper bounds (seconds) of the [`MaskTimes`] buckets: 1 µs to 50 ms (the issue's
/// goal is p50 ≤ 100 µs, p99 ≤ 2 ms).
pub const MASK_TIME_BUCKETS: [f64; 14] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2,
];

/// A histogram of the time the grammar took to compute each constrained token's
/// mask, kept by the engine's thread (plain counts: observed there, copied out with
/// the rest of [`Counters`] once per step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MaskTimes {
    /// Observations per bucket of [`MASK_TIME_BUCKETS`] (not cumulative); those
    /// above the last bound count only in `count`.
    pub buckets: [u64; MASK_TIME_BUCKETS.len()],
    pub count: u64,
    /// Sum of the observed times, in nanoseconds.
    pub sum_ns: u64,
}

impl MaskTimes {
    pub fn observe(&mut self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = MASK_TIME_BUCKETS.iter().position(|&b| s <= b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_ns = self
            .sum_ns
            .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64);
    }
}

/// Snapshot returned by `EngineHandle::stats()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// Requests waiting to be (re)started, per class.
    pub waiting: PerClass<usize>,
    /// Sequences running, per class (original class, also when promoted by aging).
    pub running: PerClass<usize>,
    pub kv_blocks_total: usize,
    /// Tokens per KV block.
    pub kv_block_size: usize,
    /// Blocks held by running sequences.
    pub kv_blocks_used: usize,
    /// Blocks only the prefix cache holds (reclaimable).
    pub kv_blocks_cached_idle: usize,
    pub kv_blocks_free: usize,
    /// `kv_blocks_used / kv_blocks_total`, 0 to 1.
    pub kv_usage: f64,
    /// Blocks in the prefix cache (held or idle).
    pub prefix_cache_blocks: usize,
    pub counters: Counters,
    /// Requests refused at submit (`QueueFull`, `TtftUnreachable`), per class.
    pub rejected: PerClass<u64>,
    /// Measured prefill throughput (tokens/s, moving average; 0 until measured).
    pub prefill_tokens_per_s: f64,
    /// Tokens in the latest step's batch.
    pub last_step_tokens: usize,
    /// The online step-time model.
    pub step_cost: StepCostFigures,
    /// The latest step: predicted and measured seconds, and its time limit
    /// (0 when no interactive target bounded it).
    pub last_step_predicted_s: f64,
    pub last_step_s: f64,
    pub last_step_limit_s: f64,
    /// Times the engine restarted after a panic on its thread.
    pub engine_restarts: u64,
}

impl EngineStats {
    /// Prefix cache hit rate in tokens (0 when nothing was looked up).
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        let q = self.counters.prefix_cache_queried_tokens;
        if q == 0 {
            0.0
        } else {
            self.counters.prefix_cache_hit_tokens as f64 / q as f64
        }
    }
}
