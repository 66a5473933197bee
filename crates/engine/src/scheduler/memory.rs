//! KV memory for planned work: block allocation, then, when the pool is short,
//! eviction of idle cached blocks, the release of paused sequences' blocks, and
//! last the preemption of running sequences with their KV released.
//!
//! A sequence preempted for another reason than KV memory (an interactive
//! request taking its place) is paused with its KV kept
//! (`preemption_keeps_kv`): it resumes where it stopped. When memory is needed,
//! paused sequences release theirs (batch before interactive, the most recently
//! started first) before any running sequence is preempted; their full blocks
//! stay in the prefix cache, on disk too with its disk tier (written through
//! as they were cached), so they resume by finding them again; only what
//! neither tier holds is recomputed.

use super::Scheduler;
use crate::budget::StepBudget;
use crate::event::FinishReason;
use crate::request::SloClass;
use crate::sequence::Sequence;
use crate::step_cost::StepShape;

/// The step-budget share of `n` tokens planned for `s` (before they run).
fn part(s: &Sequence, n: usize) -> StepShape {
    StepShape::of_seq(n, s.num_computed(), s.is_decoding())
}

impl Scheduler {
    pub(super) fn num_active(&self) -> usize {
        self.running.iter().filter(|s| s.is_active()).count()
    }

    /// Blocks `s` lacks to run `n` more tokens.
    fn blocks_needed(&self, s: &Sequence, n: usize) -> usize {
        self.pool
            .blocks_for(s.num_computed() + n)
            .saturating_sub(s.blocks().len())
    }

    /// Makes `n` blocks free, evicting idle cached blocks, then releasing paused
    /// sequences' blocks, if needed.
    pub(super) fn ensure_free(&mut self, n: usize) -> bool {
        loop {
            let free = self.pool.num_free();
            if free >= n {
                return true;
            }
            if let Some(cache) = &mut self.cache {
                cache.evict(n - free);
            }
            if self.pool.num_free() >= n {
                return true;
            }
            if !self.release_one_paused() {
                return false;
            }
        }
    }

    /// Releases the KV of one paused sequence (preempted, its blocks kept): batch
    /// before interactive, the most recently started first. False if none holds any.
    fn release_one_paused(&mut self) -> bool {
        // (batch, start order) of the best so far, and where it is: `None` in the
        // running set (preempted this step), else its class's queue.
        let mut best: Option<((bool, u64), Option<SloClass>, usize)> = None;
        let mut consider = |s: &Sequence, at: Option<SloClass>, i: usize| {
            let key = (s.class() == SloClass::Batch, s.start_order());
            if s.is_paused() && best.is_none_or(|(k, ..)| key > k) {
                best = Some((key, at, i));
            }
        };
        for (i, s) in self.running.iter().enumerate() {
            consider(s, None, i);
        }
        for (c, q) in self.waiting.iter() {
            for (i, s) in q.iter().enumerate() {
                consider(s, Some(c), i);
            }
        }
        let Some((_, at, i)) = best else {
            return false;
        };
        let s = match at {
            None => &mut self.running[i],
            Some(c) => &mut self.waiting[c][i],
        };
        tracing::debug!(
            seq = s.id(),
            blocks = s.blocks().len(),
            "releasing a paused sequence's KV"
        );
        s.release_kv();
        self.counters.paused_released += 1;
        true
    }

    /// Gives running sequence `i` the blocks for `n` more tokens (ensured free)
    /// and plans them.
    pub(super) fn allocate(&mut self, i: usize, n: usize, budget: &mut StepBudget) {
        let need = self.blocks_needed(&self.running[i], n);
        let s = &mut self.running[i];
        s.push_new_blocks(need).expect("blocks were ensured free");
        budget.take(part(s, n));
        s.plan_tokens(n);
    }

    /// Plans `n` tokens of running sequence `i`, preempting for KV memory if needed.
    pub(super) fn plan_running(&mut self, i: usize, n: usize, budget: &mut StepBudget) -> bool {
        loop {
            let need = self.blocks_needed(&self.running[i], n);
            if self.ensure_free(need) {
                self.allocate(i, n, budget);
                return true;
            }
            let victim = self.newest_victim(self.running[i].rank());
            match victim {
                Some(v) if v != i => self.preempt(v, budget, false),
                _ if self.num_active() == 1 => {
                    // Alone and the pool cannot hold it: it has hit the KV capacity.
                    tracing::warn!(
                        seq = self.running[i].id(),
                        "KV cache exhausted by one sequence"
                    );
                    let s = &mut self.running[i];
                    s.reset_kv();
                    s.finish(FinishReason::Length);
                    return false;
                }
                _ => {
                    self.preempt(i, budget, false);
                    return false;
                }
            }
        }
    }

    /// The newest active running sequence of the lowest class not above `max`
    /// (batch before interactive).
    fn newest_victim(&self, max: SloClass) -> Option<usize> {
        let ranks: &[SloClass] = match max {
            SloClass::Interactive => &[SloClass::Batch, SloClass::Interactive],
            SloClass::Batch => &[SloClass::Batch],
        };
        ranks.iter().find_map(|&rank| {
            (0..self.running.len()).rev().find(|&v| {
                let s = &self.running[v];
                s.is_active() && s.rank() == rank
            })
        })
    }

    /// Preempts running sequence `v`. `for_memory`: its KV is released (the
    /// pool is short); otherwise it is paused with its KV kept, unless
    /// `preemption_keeps_kv` is off.
    pub(super) fn preempt(&mut self, v: usize, budget: &mut StepBudget, for_memory: bool) {
        let keep = !for_memory && self.cfg.preemption_keeps_kv;
        let bs = self.pool.block_size();
        let s = &mut self.running[v];
        if s.scheduled() > 0 {
            budget.give_back(part(s, s.scheduled()));
        }
        tracing::debug!(seq = s.id(), class = %s.class(), phase = ?s.phase(), keep, "preempting");
        s.preempt(keep, bs);
        self.counters.preemptions += 1;
    }

    /// A running batch sequence to preempt for a waiting sequence of `rank`:
    /// only interactive work preempts, with classes and preemption on.
    pub(super) fn newest_batch_victim(&self, rank: SloClass) -> Option<usize> {
        if !(self.cfg.slo_classes && self.cfg.enable_preemption && rank == SloClass::Interactive) {
            return None;
        }
        (0..self.running.len()).rev().find(|&v| {
            let s = &self.running[v];
            s.is_active() && s.rank() == SloClass::Batch
        })
    }

    /// Moves the sequences preempted while planning back to the front of their
    /// class's queue, oldest-started first.
    pub(super) fn requeue_preempted(&mut self) {
        let mut k = 0;
        while k < self.running.len() {
            if self.running[k].is_preempted() {
                self.preempt_buf.push(self.running.remove(k));
            } else {
                k += 1;
            }
        }
        while let Some(mut s) = self.preempt_buf.pop() {
            s.requeue();
            self.waiting[s.class()].push_front(s);
        }
    }
}
