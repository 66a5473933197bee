//! The scheduler: pure policy deciding, step by step, which tokens of which
//! sequences run, building the step's flat [`Batch`], and taking the step's
//! results back (sampling, stop checks, freeing). It owns its queues, the KV pool,
//! the prefix cache, the counters and the step-time model; the engine core sees
//! only `schedule`, `postprocess`, the outcome and a `snapshot`.
//!
//! Each step, within `max_num_batched_tokens` tokens and `max_num_seqs` sequences
//! (`plan.rs`):
//! 1. interactive **decodes**, then interactive **prefill chunks** and admission
//!    of waiting interactive requests (reusing the longest cached prefix);
//! 2. **batch work**. With `step_budget = "time"` (the default), while interactive
//!    work runs or waits the step gets a time limit: the tightest of its
//!    interactive requests' targets (absolute TPOT for decodes, the share of the
//!    TTFT slack for prefills, else the relative bound: the same step without batch
//!    work, plus `max_batch_interference`), less `slo_margin` of the allowance.
//!    Batch decode rows join oldest-run first while the predicted step time (the
//!    online [`StepCostModel`]) fits; the rest skip the step in rotation, and a row
//!    skipped `batch_max_skip_steps` times joins regardless. The allowance a step
//!    leaves unused carries over (4 steps' worth, or one interactive step's time), so work larger than one
//!    step's allowance (a batch row beside a short interactive step) still runs,
//!    and the bound holds on average rather than per step. Batch prefill chunks
//!    are sized to the time left. With no interactive work, steps are as large as
//!    the token budget allows, except within `interactive_linger_ms` of the last
//!    interactive work: then a step is bounded as if it carried that work, so
//!    the next interactive arrival waits no longer for the step in flight than
//!    beside it; within `interactive_followup_ms` of an interactive request's
//!    finish, steps stay within the relative bound (its client's next request,
//!    sent at once by closed-loop clients, arrives during them). With
//!    `step_budget = "tokens"` (the earlier policy) every decode joins and batch
//!    prefill fills up to `interactive_max_batched_tokens`.
//!
//! Within a class, waiting requests start in fair order across flows (the
//! gateway's fairness id; `fair.rs`): start-time fair queuing, one unit per
//! request, so one flow's burst does not hold another flow's request behind all
//! of it; without ids, first come first served.
//!
//! Without SLO classes there is one queue. Aging against starvation: while no
//! batch sequence runs at all, the head of the batch queue, once it has waited
//! `batch_aging_ms`, competes as interactive (by arrival) and runs promoted.
//!
//! Preemption (`memory.rs`): a running sequence that cannot get a KV block
//! (after free blocks, idle cached blocks and paused sequences' kept KV) preempts
//! the newest sequence of the lowest class not above its own (possibly itself);
//! a waiting interactive request that finds the engine full (sequences or
//! blocks) preempts the most recently started batch sequences. A sequence
//! preempted for a slot is paused with its KV kept (`preemption_keeps_kv`); one
//! preempted for memory frees its blocks (the prefix cache, and its disk tier,
//! keep its full blocks while they can). Either keeps its generated tokens and
//! sampler and goes to the front of its class's queue.

mod admit;
mod disk;
mod fair;
mod finish;
mod forced;
mod memory;
mod plan;
mod speculate;

pub(crate) use finish::StepOutcome;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::block_pool::{BlockPool, BlockTable};
use crate::budget::StepBudget;
use crate::config::{EngineConfig, StepBudgetPolicy};
use crate::disk_tier::{DiskTier, Spill};
use crate::prefix_cache::PrefixCache;
use crate::request::{FlowKey, SloClass};
use crate::runner::{Batch, RunnerInfo};
use crate::sequence::Sequence;
use crate::stats::{Counters, EngineStats, PerClass};
use crate::step_cost::{StepCostModel, StepShape};

/// Requests that left the not-yet-started waiting queue since the last report
/// (started, or ended before starting): what admission control gets back.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct QueueExits {
    pub requests: usize,
    pub prompt_tokens: usize,
    /// The longest wait, arrival to start, among those that started (seconds).
    pub longest_start_wait_s: f64,
    /// Each one's flow (admission counts waiting requests per flow).
    pub flows: Vec<FlowKey>,
}

impl QueueExits {
    /// `s` left the queue: by starting at `started` or by ending (`None`).
    pub(super) fn record(&mut self, s: &Sequence, started: Option<Instant>) {
        self.requests += 1;
        self.prompt_tokens += s.prompt_len();
        self.flows.push(s.flow_key());
        if let Some(now) = started {
            let wait = now.saturating_duration_since(s.timings().arrival);
            self.longest_start_wait_s = self.longest_start_wait_s.max(wait.as_secs_f64());
        }
    }
}

/// Per class.
pub(crate) type Released = PerClass<QueueExits>;

/// What the planned step is expected to cost.
#[derive(Debug, Clone, Copy, Default)]
struct PlannedStep {
    shape: StepShape,
    predicted_s: f64,
    limit_s: Option<f64>,
}

pub(crate) struct Scheduler {
    cfg: EngineConfig,
    pool: BlockPool,
    cache: Option<PrefixCache>,
    /// Waiting sequences per class, front first: requeued ones, then arrivals in
    /// fair order (by tag, ties by arrival).
    waiting: PerClass<VecDeque<Sequence>>,
    /// Each class's fair order: its virtual time and the flows waiting in it.
    fair: PerClass<fair::FairQueue>,
    /// Admitted sequences in start order (oldest first).
    running: Vec<Sequence>,
    /// Indices into `running` of the current batch's sequences, in batch order.
    step_seqs: Vec<usize>,
    step: u64,
    counters: Counters,
    released: Released,
    next_start: u64,
    watermark_blocks: usize,
    preempt_buf: Vec<Sequence>,
    cost: StepCostModel,
    planned: PlannedStep,
    /// Scratch: batch rows in rotation order.
    order: Vec<usize>,
    /// The latest step that ran any batch prefill (starvation guard).
    last_batch_prefill_step: u64,
    /// When the latest step with interactive work was planned, and the predicted
    /// time of that work (bounds the steps just after it: `linger_limit`).
    last_interactive: Option<(Instant, f64)>,
    /// When an interactive request last finished (`interactive_followup_ms`).
    last_interactive_finish: Option<Instant>,
    /// Seconds of interference allowance earlier bounded steps left unused.
    interference_credit: f64,
    /// The planned step's own time bound (before carried-over allowance).
    step_bound: Option<f64>,
    /// Scratch: a row's n-gram draft while it is planned.
    ngram: Vec<u32>,
    /// The prefix cache's disk tier (`--prefix-cache-dir`).
    disk: Option<DiskTier>,
    /// Scratch: a step's blocks to spill to disk.
    spill_buf: Vec<Spill>,
    /// Each prompt runs whole in one step or not at all (an encoder:
    /// `RunnerInfo::encoder`).
    whole_prompts: bool,
}

impl Scheduler {
    pub fn new(cfg: EngineConfig, info: &RunnerInfo) -> Self {
        let (num_blocks, block_size) = (info.num_kv_blocks, info.block_size);
        let pool = BlockPool::new(num_blocks, block_size);
        let cache = cfg
            .enable_prefix_cache
            .then(|| PrefixCache::new(pool.clone()));
        let watermark_blocks = (cfg.kv_watermark * num_blocks as f64) as usize;
        Scheduler {
            cfg,
            pool,
            cache,
            waiting: PerClass::default(),
            fair: PerClass::default(),
            running: Vec::new(),
            step_seqs: Vec::new(),
            step: 0,
            counters: Counters::default(),
            released: PerClass::default(),
            next_start: 0,
            watermark_blocks,
            preempt_buf: Vec::new(),
            cost: StepCostModel::default()
                .with_small_batch(info.small_batch_max_tokens)
                .with_experts(info.experts),
            planned: PlannedStep::default(),
            order: Vec::new(),
            last_batch_prefill_step: 0,
            last_interactive: None,
            last_interactive_finish: None,
            interference_credit: 0.0,
            step_bound: None,
            ngram: Vec::new(),
            disk: None,
            spill_buf: Vec::new(),
            whole_prompts: info.encoder,
        }
    }

    /// The most prefill tokens `s` may run this step: its chunk cap, or its whole
    /// uncomputed prompt for an encoder (`whole_prompts`).
    fn chunk_cap(&self, s: &Sequence) -> usize {
        match self.whole_prompts {
            true => s.num_uncomputed(),
            false => s.prefill_chunk_cap(self.cfg.max_prefill_chunk),
        }
    }

    /// `n` of `s`'s uncomputed prompt tokens fit the step: all of them, or 0 for an
    /// encoder that cannot take them all (`whole_prompts`); `n` otherwise.
    fn whole(&self, s: &Sequence, n: usize) -> usize {
        match self.whole_prompts && n < s.num_uncomputed() {
            true => 0,
            false => n,
        }
    }

    /// With the prefix cache's disk tier (nothing without a prefix cache).
    pub fn with_disk(mut self, disk: Option<DiskTier>) -> Self {
        self.disk = disk.filter(|_| self.cache.is_some());
        self
    }

    pub fn cfg(&self) -> &EngineConfig {
        &self.cfg
    }

    /// An empty block table on this scheduler's pool (for a new sequence).
    pub fn new_block_table(&self) -> BlockTable {
        self.pool.new_table()
    }

    /// Queues a new sequence in its class, in fair order: tagged by its flow, after
    /// every sequence whose tag is not above its own (the back, without ids).
    pub fn add(&mut self, mut seq: Sequence) {
        let class = seq.class();
        let tag = self.fair[class].arrive(seq.flow());
        seq.set_fair_tag(tag);
        let q = &mut self.waiting[class];
        let at = fair::position(q, tag);
        q.insert(at, seq);
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || self.waiting.iter().any(|(_, q)| !q.is_empty())
    }

    /// After an engine restart: keep what the old scheduler counted and learned
    /// (counters, the step-time model), not its sequences or blocks.
    pub fn carry_over(&mut self, old: &Scheduler) {
        self.counters = old.counters;
        self.cost = old.cost.clone();
    }

    /// Ids of every request it holds, running then waiting (for logs).
    pub fn request_ids(&self) -> Vec<u64> {
        let waiting = self.waiting.iter().flat_map(|(_, q)| q.iter());
        self.running.iter().chain(waiting).map(|s| s.id()).collect()
    }

    /// Requests that left the waiting queue since the last call.
    pub fn take_released(&mut self) -> Released {
        std::mem::take(&mut self.released)
    }

    /// Plans one step into `batch` (cleared first).
    pub fn schedule(&mut self, now: Instant, batch: &mut Batch) {
        self.step += 1;
        batch.clear();
        self.step_seqs.clear();
        self.reap_cancelled(now);
        self.shed_overdue(now);
        let mut budget = StepBudget::new(self.cfg.max_num_batched_tokens);
        self.step_bound = None;
        match (self.cfg.slo_classes, self.cfg.step_budget) {
            (true, StepBudgetPolicy::Time) => self.plan_slo_aware(now, &mut budget),
            _ => self.plan_token_capped(now, &mut budget),
        }
        self.requeue_preempted();
        self.build(now, batch, &budget);
        if batch.is_empty() {
            // Steps count only when they run (rotation and starvation are in steps).
            self.step -= 1;
        }
    }

    /// Writes the planned sequences into `batch`.
    fn build(&mut self, now: Instant, batch: &mut Batch, budget: &StepBudget) {
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.scheduled() == 0 {
                continue;
            }
            let start = s.num_computed();
            let end = start + s.scheduled();
            debug_assert!(s.blocks().is_writable(start), "writing a shared KV block");
            if s.pools() {
                s.push_pooled(batch, start, end);
            } else if s.scores_prompt() {
                batch.push_scored(&s.tokens()[start..end], start, s.blocks().ids());
            } else if s.draft().is_empty() {
                batch.push(
                    &s.tokens()[start..end],
                    start,
                    s.blocks().ids(),
                    end == s.tokens().len(),
                );
            } else {
                debug_assert_eq!(end, s.tokens().len() + s.draft().len());
                batch.push_verify(&s.tokens()[start..], s.draft(), start, s.blocks().ids());
            }
            s.mark_scheduled(now, self.step);
            self.step_seqs.push(i);
        }
        self.planned = PlannedStep {
            shape: *budget.shape(),
            predicted_s: self.cost.predict(budget.shape()),
            limit_s: self.step_bound,
        };
        debug_assert_eq!(batch.num_tokens(), budget.used());
        debug_assert!(batch.num_tokens() <= self.cfg.max_num_batched_tokens);
        debug_assert!(self.running.len() <= self.cfg.max_num_seqs);
    }

    /// Whether an interactive request finished within `interactive_followup_ms`:
    /// its client's next request may be on its way.
    fn followup_expected(&self, now: Instant) -> bool {
        let window = Duration::from_millis(self.cfg.interactive_followup_ms);
        self.last_interactive_finish
            .is_some_and(|t| now.saturating_duration_since(t) < window)
    }

    /// Whether interactive requests wait or run.
    fn interactive_present(&self) -> bool {
        !self.waiting[SloClass::Interactive].is_empty()
            || self
                .running
                .iter()
                .any(|s| s.rank() == SloClass::Interactive && s.is_active())
    }

    /// The engine's gauges and counters as the scheduler knows them (admission's
    /// own figures are the engine's to add).
    pub fn snapshot(&self) -> EngineStats {
        let mut waiting = PerClass::default();
        let mut running = PerClass::default();
        for (c, q) in self.waiting.iter() {
            waiting[c] = q.len();
        }
        for s in &self.running {
            running[s.class()] += 1;
        }
        let pool = &self.pool;
        let (total, used) = (pool.num_blocks(), pool.num_used());
        let mut counters = self.counters;
        if let Some(d) = &self.disk {
            d.fill(&mut counters.disk);
        }
        EngineStats {
            waiting,
            running,
            kv_blocks_total: total,
            kv_block_size: pool.block_size(),
            kv_blocks_used: used,
            kv_blocks_cached_idle: pool.num_cached_idle(),
            kv_blocks_free: pool.num_free(),
            kv_usage: used as f64 / total as f64,
            prefix_cache_blocks: self.cache.as_ref().map_or(0, |c| c.size()),
            counters,
            last_step_tokens: self.planned.shape.tokens(),
            step_cost: self.cost.figures(),
            last_step_predicted_s: self.planned.predicted_s,
            last_step_limit_s: self.planned.limit_s.unwrap_or(0.0),
            ..EngineStats::default()
        }
    }
}

impl Scheduler {
    /// Moves the prefix cache's changes since the last call into `out`, the
    /// token ids of the blocks they store into `tokens`.
    pub fn take_cache_changes(
        &mut self,
        out: &mut Vec<crate::prefix_cache::CacheChange>,
        tokens: &mut Vec<u32>,
    ) {
        if let Some(c) = self.cache.as_mut() {
            c.take_changes(out);
            c.take_stored_tokens(tokens);
        }
    }

    /// The step-time model (admission's prefill forecast reads it).
    pub fn cost_model(&self) -> &StepCostModel {
        &self.cost
    }
}

/// Read access for the engine's scenario tests.
#[cfg(test)]
impl Scheduler {
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }
    pub fn waiting(&self, class: SloClass) -> &VecDeque<Sequence> {
        &self.waiting[class]
    }
    /// Flows with a never-started request waiting in `class`.
    pub fn num_fair_flows(&self, class: SloClass) -> usize {
        self.fair[class].num_flows()
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }
    pub fn cache_mut(&mut self) -> Option<&mut PrefixCache> {
        self.cache.as_mut()
    }
    pub fn released(&self) -> &Released {
        &self.released
    }
    pub fn planned_shape(&self) -> &StepShape {
        &self.planned.shape
    }
    pub fn cost_model_mut(&mut self) -> &mut StepCostModel {
        &mut self.cost
    }
    pub fn step_no(&self) -> u64 {
        self.step
    }
    pub fn last_limit(&self) -> Option<f64> {
        self.planned.limit_s
    }
}
