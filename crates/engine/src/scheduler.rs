//! The scheduler: pure policy deciding, step by step, which tokens of which
//! sequences run, and building the step's flat [`Batch`].
//!
//! Each step, within `max_num_batched_tokens` tokens and `max_num_seqs` sequences:
//! 1. running **decodes** first (interactive, then batch; oldest first), so streams
//!    never stall behind prefills;
//! 2. **prefill chunks** (at most `max_prefill_chunk` tokens each) of running
//!    sequences whose prompt is not done, interactive first; while interactive
//!    requests wait or run, batch prefill fills the step only up to
//!    `interactive_max_batched_tokens` (when set), keeping steps short;
//! 3. **admission** of waiting sequences, interactive before batch, reusing the
//!    longest cached prefix; without SLO classes there is one FCFS queue. Aging
//!    against starvation: while no batch sequence runs at all, the head of the
//!    batch queue, once it has waited `batch_aging_ms`, competes as interactive (by
//!    arrival) and runs promoted (not preempted). A batch backlog that is being
//!    served, however slowly, is not starving and never outranks interactive work.
//!
//! Preemption (recompute): a running sequence that cannot get a KV block preempts
//! the newest sequence of the lowest rank not above its own (possibly itself); a
//! waiting interactive request that finds the engine full (sequences or blocks)
//! preempts the most recently started batch sequences. A preempted sequence frees
//! its blocks (the prefix cache keeps its full blocks while it can), keeps its
//! generated tokens and sampler, and goes to the front of its class's queue.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::block_pool::BlockPool;
use crate::budget::StepBudget;
use crate::config::EngineConfig;
use crate::event::FinishReason;
use crate::prefix_cache::PrefixCache;
use crate::request::SloClass;
use crate::runner::Batch;
use crate::sequence::Sequence;
use crate::stats::{Counters, PerClass};

pub(crate) struct Scheduler {
    pub cfg: EngineConfig,
    pub pool: BlockPool,
    pub cache: Option<PrefixCache>,
    /// Waiting sequences per class (index `SloClass::index`), front first.
    pub waiting: [VecDeque<Sequence>; 2],
    /// Admitted sequences in start order (oldest first).
    pub running: Vec<Sequence>,
    /// Indices into `running` of the current batch's sequences, in batch order.
    pub step_seqs: Vec<usize>,
    pub step: u64,
    pub counters: Counters,
    /// Requests (count, prompt tokens) that left the not-yet-started waiting queue
    /// since the engine last drained it (feeds admission control).
    pub released: PerClass<(usize, usize)>,
    next_start: u64,
    watermark_blocks: usize,
    preempt_buf: Vec<Sequence>,
}

impl Scheduler {
    pub fn new(cfg: EngineConfig, num_blocks: usize, block_size: usize) -> Self {
        let pool = BlockPool::new(num_blocks, block_size);
        let cache = cfg
            .enable_prefix_cache
            .then(|| PrefixCache::new(pool.clone()));
        let watermark_blocks = (cfg.kv_watermark * num_blocks as f64) as usize;
        Scheduler {
            cfg,
            pool,
            cache,
            waiting: [VecDeque::new(), VecDeque::new()],
            running: Vec::new(),
            step_seqs: Vec::new(),
            step: 0,
            counters: Counters::default(),
            released: PerClass::default(),
            next_start: 0,
            watermark_blocks,
            preempt_buf: Vec::new(),
        }
    }

    /// Queues a new sequence at the back of its class.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting[seq.class.index()].push_back(seq);
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || self.waiting.iter().any(|q| !q.is_empty())
    }

    fn num_active(&self) -> usize {
        self.running
            .iter()
            .filter(|s| !s.preempted && s.finish.is_none())
            .count()
    }

    /// Plans one step into `batch` (cleared first); `step_seqs` maps batch entries
    /// to `running`.
    pub fn schedule(&mut self, now: Instant, batch: &mut Batch) {
        self.step += 1;
        batch.clear();
        self.step_seqs.clear();
        self.reap_cancelled(now);
        let mut budget = StepBudget::new(self.cfg.max_num_batched_tokens);

        // 1. Decodes.
        for rank in [1u8, 0] {
            for i in 0..self.running.len() {
                let s = &self.running[i];
                if budget.remaining() == 0 {
                    break;
                }
                if s.preempted || s.finish.is_some() || s.rank() != rank || !s.is_decoding() {
                    continue;
                }
                self.plan_running(i, 1, &mut budget);
            }
        }
        // 2. Prefill chunks, interactive work first: with SLO classes on, a waiting
        //    interactive request is admitted before running batch sequences get
        //    their next prefill chunk, so a long batch prompt never delays its TTFT.
        self.plan_prefills(1, &mut budget);
        if self.cfg.slo_classes {
            self.admit(now, &mut budget, true);
            if let Some(cap) = self.cfg.interactive_max_batched_tokens {
                if self.interactive_present() {
                    // Batch prefill fills a shorter step, but always moves.
                    budget.cap(cap.max(budget.used() + self.pool.block_size()));
                }
            }
        }
        self.plan_prefills(0, &mut budget);
        // 3. Admission.
        self.admit(now, &mut budget, false);
        // 4. Preempted sequences back to waiting; build the batch.
        self.requeue_preempted();
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.scheduled == 0 {
                continue;
            }
            let start = s.num_computed;
            let end = start + s.scheduled;
            debug_assert!(s.blocks.is_writable(start), "writing a shared KV block");
            batch.push(
                &s.tokens[start..end],
                start,
                s.blocks.ids(),
                end == s.tokens.len(),
            );
            s.timings.first_scheduled.get_or_insert(now);
            self.step_seqs.push(i);
        }
        debug_assert_eq!(batch.num_tokens(), budget.used());
        debug_assert!(batch.num_tokens() <= self.cfg.max_num_batched_tokens);
        debug_assert!(self.running.len() <= self.cfg.max_num_seqs);
    }

    /// Whether interactive requests wait or run (the step cap for batch prefill applies).
    fn interactive_present(&self) -> bool {
        !self.waiting[SloClass::Interactive.index()].is_empty()
            || self
                .running
                .iter()
                .any(|s| s.class == SloClass::Interactive && !s.preempted && s.finish.is_none())
    }

    /// Plans the next prefill chunk of every running sequence of `rank` not yet in
    /// this step, oldest first, within the budget.
    fn plan_prefills(&mut self, rank: u8, budget: &mut StepBudget) {
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if s.preempted || s.finish.is_some() || s.rank() != rank || s.scheduled > 0 {
                continue;
            }
            let n = s
                .num_uncomputed()
                .min(self.cfg.max_prefill_chunk)
                .min(budget.remaining());
            if n > 0 {
                self.plan_running(i, n, budget);
            }
        }
    }

    /// Blocks `s` lacks to run `n` more tokens.
    fn blocks_needed(&self, s: &Sequence, n: usize) -> usize {
        self.pool
            .blocks_for(s.num_computed + n)
            .saturating_sub(s.blocks.len())
    }

    /// Makes `n` blocks free, evicting idle cached blocks if needed.
    fn ensure_free(&mut self, n: usize) -> bool {
        let free = self.pool.num_free();
        if free >= n {
            return true;
        }
        if let Some(cache) = &mut self.cache {
            cache.evict(n - free);
        }
        self.pool.num_free() >= n
    }

    fn allocate(&mut self, i: usize, n: usize, budget: &mut StepBudget) {
        let need = self.blocks_needed(&self.running[i], n);
        let s = &mut self.running[i];
        for _ in 0..need {
            s.blocks.push_new().expect("blocks were ensured free");
        }
        s.scheduled = n;
        budget.take(n);
    }

    /// Plans `n` tokens of running sequence `i`, preempting for KV memory if needed.
    fn plan_running(&mut self, i: usize, n: usize, budget: &mut StepBudget) -> bool {
        loop {
            let need = self.blocks_needed(&self.running[i], n);
            if self.ensure_free(need) {
                self.allocate(i, n, budget);
                return true;
            }
            let victim = self.newest_victim(self.running[i].rank());
            match victim {
                Some(v) if v != i => self.preempt(v, budget),
                _ if self.num_active() == 1 => {
                    // Alone and the pool cannot hold it: it has hit the KV capacity.
                    tracing::warn!(
                        seq = self.running[i].id,
                        "KV cache exhausted by one sequence"
                    );
                    let s = &mut self.running[i];
                    s.reset_kv();
                    s.finish = Some(FinishReason::Length);
                    return false;
                }
                _ => {
                    self.preempt(i, budget);
                    return false;
                }
            }
        }
    }

    /// The newest active running sequence of the lowest rank `<= max_rank`.
    fn newest_victim(&self, max_rank: u8) -> Option<usize> {
        (0..=max_rank).find_map(|rank| {
            (0..self.running.len()).rev().find(|&v| {
                let s = &self.running[v];
                !s.preempted && s.finish.is_none() && s.rank() == rank
            })
        })
    }

    fn preempt(&mut self, v: usize, budget: &mut StepBudget) {
        let s = &mut self.running[v];
        budget.give_back(s.scheduled);
        s.reset_kv();
        s.preempted = true;
        s.timings.preemptions += 1;
        self.counters.preemptions += 1;
        tracing::debug!(seq = s.id, class = %s.class, "preempted");
    }

    /// Whether a waiting sequence of `rank` may preempt running batch sequences.
    fn may_preempt_batch(&self, rank: u8) -> bool {
        self.cfg.slo_classes && self.cfg.enable_preemption && rank == 1
    }

    /// Whether waiting batch sequence `s` is starving: it has waited
    /// `batch_aging_ms` and no batch sequence is running to make progress.
    fn is_aged(&self, s: &Sequence, now: Instant) -> bool {
        self.cfg.slo_classes
            && now.saturating_duration_since(s.timings.arrival)
                >= Duration::from_millis(self.cfg.batch_aging_ms)
            && !self
                .running
                .iter()
                .any(|r| r.class == SloClass::Batch && !r.preempted && r.finish.is_none())
    }

    /// The queue to admit from next, and whether its head is an aged batch request.
    fn pick_waiting(&self, now: Instant) -> Option<(usize, bool)> {
        let [iq, bq] = &self.waiting;
        match (iq.front(), bq.front()) {
            (None, None) => None,
            (Some(_), None) => Some((0, false)),
            (None, Some(b)) => Some((1, self.is_aged(b, now))),
            (Some(i), Some(b)) => {
                if self.is_aged(b, now) && b.timings.arrival <= i.timings.arrival {
                    Some((1, true))
                } else {
                    Some((0, false))
                }
            }
        }
    }

    /// Admits waiting requests (interactive first, aged batch ones by arrival) while
    /// budget, sequence slots and KV blocks allow; with `interactive_only`, stops at
    /// the first request that does not rank as interactive.
    fn admit(&mut self, now: Instant, budget: &mut StepBudget, interactive_only: bool) {
        while budget.remaining() > 0 {
            let Some((q, aged)) = self.pick_waiting(now) else {
                return;
            };
            let head = self.waiting[q].front().expect("picked a non-empty queue");
            let rank = if aged { 1 } else { head.rank() };
            if interactive_only && rank != 1 {
                return;
            }
            while self.num_active() >= self.cfg.max_num_seqs {
                match self.newest_batch_victim(rank) {
                    Some(v) => self.preempt(v, budget),
                    None => return,
                }
            }
            let mut s = self.waiting[q].pop_front().expect("non-empty");
            let matched = self.lock_cached_prefix(&mut s);
            let n = s
                .num_uncomputed()
                .min(self.cfg.max_prefill_chunk)
                .min(budget.remaining());
            let need = self.pool.blocks_for(s.num_computed + n) - s.blocks.len();
            let reserve = if self.num_active() == 0 {
                0
            } else {
                self.watermark_blocks
            };
            loop {
                if self.ensure_free(need + reserve) {
                    break;
                }
                match self.newest_batch_victim(rank) {
                    Some(v) => self.preempt(v, budget),
                    None => {
                        s.reset_kv();
                        self.waiting[q].push_front(s);
                        return;
                    }
                }
            }
            self.start(s, aged, matched);
            let i = self.running.len() - 1;
            self.allocate(i, n, budget);
        }
    }

    /// A running batch sequence to preempt for a waiting sequence of `rank`.
    fn newest_batch_victim(&self, rank: u8) -> Option<usize> {
        if !self.may_preempt_batch(rank) {
            return None;
        }
        (0..self.running.len()).rev().find(|&v| {
            let s = &self.running[v];
            !s.preempted && s.finish.is_none() && s.rank() == 0
        })
    }

    /// Looks up the longest cached prefix (leaving at least one token to compute)
    /// and takes references on it; returns the matched token count.
    fn lock_cached_prefix(&mut self, s: &mut Sequence) -> usize {
        let Some(cache) = &mut self.cache else {
            return 0;
        };
        let len = s.tokens.len();
        let blocks = cache.match_prefix(&s.tokens[..len - 1]);
        cache.lock(&blocks, &mut s.blocks);
        let matched = blocks.len() * self.pool.block_size();
        s.num_computed = matched;
        s.num_cache_inserted = blocks.len();
        matched
    }

    /// Moves an admitted sequence to the running set, with its bookkeeping.
    fn start(&mut self, mut s: Sequence, aged: bool, matched: usize) {
        let c = &mut self.counters;
        c.prefix_cache_queried_tokens += s.tokens.len() as u64;
        c.prefix_cache_hit_tokens += matched as u64;
        if s.started {
            c.recomputed_tokens += (s.tokens.len() - matched) as u64;
        } else {
            s.started = true;
            s.cached_prompt_tokens = matched;
            c.requests_started += 1;
            c.prompt_tokens_cached += matched as u64;
            c.prompt_tokens_computed += (s.prompt_len - matched) as u64;
            let r = self.released.get_mut(s.class);
            r.0 += 1;
            r.1 += s.prompt_len;
        }
        s.promoted |= aged;
        self.next_start += 1;
        s.start_order = self.next_start;
        self.running.push(s);
    }

    fn requeue_preempted(&mut self) {
        let mut k = 0;
        while k < self.running.len() {
            if self.running[k].preempted {
                self.preempt_buf.push(self.running.remove(k));
            } else {
                k += 1;
            }
        }
        // Oldest-started ends up at the front.
        while let Some(mut s) = self.preempt_buf.pop() {
            s.preempted = false;
            self.waiting[s.class.index()].push_front(s);
        }
    }

    /// Drops sequences whose client dropped the stream, freeing their blocks.
    fn reap_cancelled(&mut self, now: Instant) {
        let (counters, released) = (&mut self.counters, &mut self.released);
        for q in &mut self.waiting {
            q.retain_mut(|s| {
                if !s.is_cancelled() {
                    return true;
                }
                if !s.started {
                    let r = released.get_mut(s.class);
                    r.0 += 1;
                    r.1 += s.prompt_len;
                }
                counters.requests_cancelled += 1;
                s.send_finished(FinishReason::Cancelled, now);
                false
            });
        }
        for s in &mut self.running {
            if s.finish.is_none() && s.is_cancelled() {
                s.finish = Some(FinishReason::Cancelled);
            }
        }
        self.reap_finished(now);
    }

    /// Finishes sequence `id` with `reason`: a running one is marked and reaped, a
    /// waiting one leaves its queue; either way its stream gets `Finished`. Nothing
    /// if no such sequence is left (it already finished).
    pub fn cancel(&mut self, id: u64, reason: FinishReason, now: Instant) {
        if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
            if s.finish.is_none() {
                s.finish = Some(reason);
            }
            self.reap_finished(now);
            return;
        }
        for q in &mut self.waiting {
            let Some(k) = q.iter().position(|s| s.id == id) else {
                continue;
            };
            let mut s = q.remove(k).expect("position is in range");
            if !s.started {
                let r = self.released.get_mut(s.class);
                r.0 += 1;
                r.1 += s.prompt_len;
            }
            count_finish(&mut self.counters, &reason);
            s.send_finished(reason, now);
            return;
        }
    }

    /// Sends `Finished` for and drops every running sequence with a finish reason.
    pub fn reap_finished(&mut self, now: Instant) {
        let c = &mut self.counters;
        self.running.retain_mut(|s| {
            let Some(reason) = s.finish.take() else {
                return true;
            };
            count_finish(c, &reason);
            s.send_finished(reason, now);
            false
        });
    }

    /// Sequences per class: (waiting, running).
    pub fn class_counts(&self) -> (PerClass<usize>, PerClass<usize>) {
        let mut running = PerClass::default();
        for s in &self.running {
            *running.get_mut(s.class) += 1;
        }
        let waiting = PerClass {
            interactive: self.waiting[SloClass::Interactive.index()].len(),
            batch: self.waiting[SloClass::Batch.index()].len(),
        };
        (waiting, running)
    }
}

/// Counts a finished request by its reason.
fn count_finish(c: &mut Counters, reason: &FinishReason) {
    match reason {
        FinishReason::Stop | FinishReason::StopString => c.requests_finished_stop += 1,
        FinishReason::Length => c.requests_finished_length += 1,
        FinishReason::Cancelled | FinishReason::Aborted => c.requests_cancelled += 1,
        FinishReason::Error(_) => c.requests_failed += 1,
    }
}
