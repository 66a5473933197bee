//! Admission of waiting sequences into the running set: which queue goes next
//! (interactive first, aged batch requests by arrival), the prefix-cache lookup,
//! KV room (preempting batch work for interactive arrivals) and bookkeeping.

use std::time::{Duration, Instant};

use super::Scheduler;
use crate::budget::StepBudget;
use crate::request::SloClass;
use crate::sequence::Sequence;

impl Scheduler {
    /// Whether waiting batch sequence `s` is starving: it has waited
    /// `batch_aging_ms` and no batch sequence is running to make progress.
    fn is_aged(&self, s: &Sequence, now: Instant) -> bool {
        self.cfg.slo_classes
            && now.saturating_duration_since(s.timings().arrival)
                >= Duration::from_millis(self.cfg.batch_aging_ms)
            && !self
                .running
                .iter()
                .any(|r| r.class() == SloClass::Batch && r.is_active())
    }

    /// The queue to admit from next, and whether its head is an aged batch request.
    fn pick_waiting(&self, now: Instant) -> Option<(SloClass, bool)> {
        let (iq, bq) = (
            &self.waiting[SloClass::Interactive],
            &self.waiting[SloClass::Batch],
        );
        match (iq.front(), bq.front()) {
            (None, None) => None,
            (Some(_), None) => Some((SloClass::Interactive, false)),
            (None, Some(b)) => Some((SloClass::Batch, self.is_aged(b, now))),
            (Some(i), Some(b)) => {
                if self.is_aged(b, now) && b.timings().arrival <= i.timings().arrival {
                    Some((SloClass::Batch, true))
                } else {
                    Some((SloClass::Interactive, false))
                }
            }
        }
    }

    /// Admits waiting requests (interactive first, aged batch ones by arrival) while
    /// budget, sequence slots and KV blocks allow; with `interactive_only`, stops at
    /// the first request that does not rank as interactive.
    pub(super) fn admit(&mut self, now: Instant, budget: &mut StepBudget, interactive_only: bool) {
        while budget.remaining() > 0 {
            let Some((q, aged)) = self.pick_waiting(now) else {
                return;
            };
            let head = self.waiting[q].front().expect("picked a non-empty queue");
            let rank = if aged {
                SloClass::Interactive
            } else {
                head.rank()
            };
            if interactive_only && rank != SloClass::Interactive {
                return;
            }
            while self.num_active() >= self.cfg.max_num_seqs {
                // A slot, not memory: the victim keeps its KV while memory allows.
                match self.newest_batch_victim(rank) {
                    Some(v) => self.preempt(v, budget, false),
                    None => return,
                }
            }
            let mut s = self.waiting[q].pop_front().expect("non-empty");
            // A paused sequence resumes on the KV it kept; the others look up
            // the prefix cache (and leave it unlocked if they cannot start).
            let kept = s.is_paused();
            let matched = if kept {
                s.num_computed()
            } else {
                self.lock_cached_prefix(&mut s)
            };
            let mut n = s
                .num_uncomputed()
                .min(self.chunk_cap(&s))
                .min(budget.remaining());
            n = self.whole(&s, n);
            if rank == SloClass::Batch && n > 0 {
                // Not running yet: it competes as if last run when it arrived.
                n = self.fit_batch_prefill(s.num_computed(), n, self.step, budget);
                n = self.whole(&s, n);
            }
            if n == 0 {
                if !kept {
                    s.reset_kv();
                }
                self.waiting[q].push_front(s);
                return;
            }
            let need = self.pool.blocks_for(s.num_computed() + n) - s.blocks().len();
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
                    Some(v) => self.preempt(v, budget, true),
                    None => {
                        if !kept {
                            s.reset_kv();
                        }
                        self.waiting[q].push_front(s);
                        return;
                    }
                }
            }
            self.start(s, aged, matched, !kept, now);
            let i = self.running.len() - 1;
            self.allocate(i, n, budget);
        }
    }

    /// Looks up the longest cached prefix (leaving at least one token to compute)
    /// and takes references on it, in RAM, then on disk; returns the matched
    /// token count.
    fn lock_cached_prefix(&mut self, s: &mut Sequence) -> usize {
        let Some(cache) = &mut self.cache else {
            return 0;
        };
        let ram = s.lock_cached_prefix(cache, self.pool.block_size());
        ram + self.load_from_disk(s)
    }

    /// Moves an admitted sequence to the running set, with its bookkeeping;
    /// `looked_up`: its `matched` tokens came from the prefix cache (not kept KV).
    fn start(
        &mut self,
        mut s: Sequence,
        aged: bool,
        matched: usize,
        looked_up: bool,
        now: Instant,
    ) {
        let bs = self.pool.block_size();
        let c = &mut self.counters;
        if looked_up {
            c.prefix_cache_queried_tokens += s.tokens().len() as u64;
            c.prefix_cache_hit_tokens += matched as u64;
        }
        if !s.admit(matched) {
            c.count_resumption(s.resumed(matched, bs));
        } else {
            c.requests_started += 1;
            c.prompt_tokens_cached += matched as u64;
            c.prompt_tokens_computed += (s.prompt_len() - matched) as u64;
            self.released[s.class()].record(&s, Some(now));
            self.fair[s.class()].leave(&s, true);
        }
        self.next_start += 1;
        s.mark_started(self.step, self.next_start, aged);
        self.running.push(s);
    }
}
