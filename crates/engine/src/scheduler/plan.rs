//! Planning a step: which decodes and prefill chunks run, in what order, within
//! the step's token and time budget.

use std::time::{Duration, Instant};

use super::Scheduler;
use crate::budget::StepBudget;
use crate::request::SloClass;
use crate::step_cost::StepShape;

/// Unused interference allowance carries over for at least this many steps' worth.
const CREDIT_STEPS: f64 = 4.0;

impl Scheduler {
    /// The earlier policy (`step_budget = "tokens"`, and FCFS without classes):
    /// every decode, interactive prefill and admission, then batch prefill up to
    /// `interactive_max_batched_tokens` while interactive work is present.
    pub(super) fn plan_token_capped(&mut self, now: Instant, budget: &mut StepBudget) {
        for rank in SloClass::ALL {
            self.plan_decodes(rank, budget);
        }
        self.plan_drafts(budget);
        self.plan_prefills(SloClass::Interactive, budget);
        if self.cfg.slo_classes {
            self.admit(now, budget, true);
            if let Some(cap) = self.cfg.interactive_max_batched_tokens {
                if self.interactive_present() {
                    // Batch prefill fills a shorter step, but always moves.
                    budget.cap(cap.max(budget.used() + self.pool.block_size()));
                }
            }
        }
        self.plan_prefills(SloClass::Batch, budget);
        self.admit(now, budget, false);
    }

    /// The SLO-aware policy (`step_budget = "time"`): interactive work first, then
    /// batch work only as far as the step's time limit allows.
    pub(super) fn plan_slo_aware(&mut self, now: Instant, budget: &mut StepBudget) {
        self.plan_decodes(SloClass::Interactive, budget);
        self.plan_drafts(budget);
        self.plan_prefills(SloClass::Interactive, budget);
        self.admit(now, budget, true);
        let bounded = self.time_limit(now, budget);
        let limit = match bounded {
            Some((limit, base)) => {
                if limit <= base {
                    self.counters.slo_unreachable_steps += 1;
                }
                self.last_interactive = Some((now, base));
                // This step's allowance joins what earlier steps left unused, so
                // batch work too large for one step's allowance still runs, at the
                // bound on average.
                self.step_bound = Some(limit);
                let allowance = limit - base;
                // Enough to pay, now and then, for batch work that costs more than
                // one step's allowance (a row that moves the runner off its
                // small-batch path costs about a whole small step).
                let cap = (allowance * CREDIT_STEPS).max(base);
                self.interference_credit = (self.interference_credit + allowance).min(cap);
                if budget.shape().prefill_tokens > 0 || self.followup_expected(now) {
                    // An interactive prefill is its request's TTFT, and so is the
                    // step an expected follow-up arrives during: no carried-over
                    // allowance is spent on it.
                    Some(limit)
                } else {
                    Some(base + self.interference_credit)
                }
            }
            None => {
                self.interference_credit = 0.0;
                let cap = self.cfg.max_step_ms.map(|ms| ms / 1e3);
                self.step_bound = match (self.linger_limit(now), cap) {
                    (Some(l), Some(c)) => Some(l.min(c)),
                    (None, Some(c)) => {
                        // No interactive work, none lately: every running batch
                        // decode row joins (as in a step of the interactive class
                        // alone, so the batch class alone gets the same
                        // throughput); `max_step_ms` bounds the prefill added on
                        // top, the part that makes a step long.
                        self.plan_batch_decodes(budget);
                        Some(self.cost.predict(budget.shape()) + c)
                    }
                    (l, None) => l,
                };
                self.step_bound
            }
        };
        budget.set_limit(limit);
        self.plan_batch_decodes(budget);
        self.plan_prefills(SloClass::Batch, budget);
        self.admit(now, budget, false);
        if budget.used() == 0 {
            self.plan_one_batch_unit(now, budget);
        }
        if let Some((_, base)) = bounded {
            let extra = (self.cost.predict(budget.shape()) - base).max(0.0);
            self.interference_credit = (self.interference_credit - extra).max(0.0);
        }
    }

    /// Nothing fit the step's time limit: one unit of batch work runs (a decode
    /// row, else a prefill chunk of at most a block), so the engine always moves.
    fn plan_one_batch_unit(&mut self, now: Instant, budget: &mut StepBudget) {
        let decoding = self
            .running
            .iter()
            .any(|s| s.is_active() && s.rank() == SloClass::Batch && s.is_decoding());
        budget.set_limit(None);
        if decoding || !self.whole_prompts {
            // An encoder's unit is a whole prompt (within the token budget).
            budget.cap(if decoding { 1 } else { self.pool.block_size() });
        }
        self.plan_batch_decodes(budget);
        self.plan_prefills(SloClass::Batch, budget);
        self.admit(now, budget, false);
    }

    /// Plans a decode for every running sequence of `rank` (oldest first).
    fn plan_decodes(&mut self, rank: SloClass, budget: &mut StepBudget) {
        for i in 0..self.running.len() {
            if budget.remaining() == 0 {
                break;
            }
            let s = &self.running[i];
            if s.is_active() && s.rank() == rank && s.is_decoding() && s.scheduled() == 0 {
                self.plan_running(i, 1, budget);
            }
        }
    }

    /// Plans batch decode rows in rotation (least recently run first) while the
    /// step's time limit allows; a row skipped `batch_max_skip_steps` steps in a
    /// row joins regardless (one such row a step).
    fn plan_batch_decodes(&mut self, budget: &mut StepBudget) {
        self.order.clear();
        for (i, s) in self.running.iter().enumerate() {
            if s.is_active() && s.rank() == SloClass::Batch && s.is_decoding() && s.scheduled() == 0
            {
                self.order.push(i);
            }
        }
        let running = &self.running;
        self.order
            .sort_unstable_by_key(|&i| (running[i].last_run_step(), running[i].start_order()));
        let mut forced = false;
        for k in 0..self.order.len() {
            if budget.remaining() == 0 {
                break;
            }
            let i = self.order[k];
            let s = &self.running[i];
            if !s.is_active() || s.scheduled() > 0 {
                continue; // preempted while planning an earlier row
            }
            let row = StepShape::of_seq(1, s.num_computed(), true);
            if budget.fits(&self.cost, row) {
                self.plan_batch_row(i, budget);
            } else if !forced && self.is_starving(s.last_run_step()) {
                // One starving row a step: rows skipped together are forced on
                // consecutive steps, and stay staggered after.
                forced = true;
                self.plan_batch_row(i, budget);
            } else {
                self.counters.batch_rows_deferred += 1;
            }
        }
    }

    /// Plans batch decode row `i` with the tokens its grammar forces, if any
    /// (fast-forward: both classes; n-gram drafts are interactive only).
    fn plan_batch_row(&mut self, i: usize, budget: &mut StepBudget) {
        if self.plan_running(i, 1, budget) {
            self.plan_forced(i, budget);
        }
    }

    /// Whether a batch sequence last run at `last` has waited too many steps.
    fn is_starving(&self, last: u64) -> bool {
        self.step.saturating_sub(last) > self.cfg.batch_max_skip_steps
    }

    /// Plans the next prefill chunk of every running sequence of `rank` not yet in
    /// this step, oldest first, within the budget.
    fn plan_prefills(&mut self, rank: SloClass, budget: &mut StepBudget) {
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if !s.is_active() || s.rank() != rank || s.scheduled() > 0 || s.is_decoding() {
                continue; // decode rows are planned (or deferred) on their own
            }
            let n = s
                .num_uncomputed()
                .min(self.chunk_cap(s))
                .min(budget.remaining());
            let n = self.whole(s, n);
            let (cached, last) = (s.num_computed(), s.last_run_step());
            let n = match rank {
                SloClass::Interactive => n,
                SloClass::Batch => {
                    let fits = self.fit_batch_prefill(cached, n, last, budget);
                    self.whole(&self.running[i], fits)
                }
            };
            if n > 0 {
                self.plan_running(i, n, budget);
            }
        }
    }

    /// How many of `n` prefill tokens (after `cached` tokens of context) of a batch
    /// sequence last run at `last` fit the step's time limit; at least a block
    /// (an encoder: all `n`, a whole prompt) when batch prefill is starving.
    pub(super) fn fit_batch_prefill(
        &mut self,
        cached: usize,
        n: usize,
        last: u64,
        budget: &StepBudget,
    ) -> usize {
        if n == 0 || budget.limit().is_none() {
            if n > 0 {
                self.last_batch_prefill_step = self.step;
            }
            return n;
        }
        let chunk = |k| StepShape::of_seq(k, cached, false);
        // Largest k <= n that fits (the predicted time grows with k).
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if budget.fits(&self.cost, chunk(mid)) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let block = match self.whole_prompts {
            true => n,
            false => self.pool.block_size().min(n),
        };
        let starving = self.is_starving(last) || self.is_starving(self.last_batch_prefill_step);
        let k = if starving { lo.max(block) } else { lo };
        if k > 0 {
            self.last_batch_prefill_step = self.step;
        }
        k
    }

    /// Just after interactive work (within `interactive_linger_ms`), a step with
    /// none is bounded as if it carried the last interactive step's decode rows,
    /// so an interactive request arriving now waits for no longer a step than
    /// beside that work. `None` otherwise (a full step: throughput).
    fn linger_limit(&self, now: Instant) -> Option<f64> {
        let (at, base) = self.last_interactive?;
        if self.followup_expected(now) {
            return Some(self.with_margin(base, self.relative_bound(base)));
        }
        let linger = Duration::from_millis(self.cfg.interactive_linger_ms);
        (now.saturating_duration_since(at) < linger).then(|| {
            let bound = self
                .cfg
                .default_tpot_slo_ms
                .map_or(self.relative_bound(base), |t| self.stretched(base, t / 1e3));
            self.with_margin(base, bound)
        })
    }

    /// How long a step whose interactive work is predicted to take `base`
    /// seconds may take without a target: `base` times `1 + max_batch_interference`.
    fn relative_bound(&self, base: f64) -> f64 {
        base * (1.0 + self.cfg.max_batch_interference)
    }

    /// An absolute TPOT `bound` (seconds) on a step whose interactive work is
    /// predicted to take `base`, within `max_tpot_stretch` times `base`.
    fn stretched(&self, base: f64, bound: f64) -> f64 {
        self.cfg
            .max_tpot_stretch
            .map_or(bound, |k| bound.min(k * base))
    }

    /// The limit of a step with interactive work of `base` seconds and the
    /// tightest `bound`: `base` plus the allowance less `slo_margin` of it.
    fn with_margin(&self, base: f64, bound: f64) -> f64 {
        base + (bound - base).max(0.0) * (1.0 - self.cfg.slo_margin)
    }

    /// The step's time limit while interactive work runs or waits (`None`
    /// otherwise), and the predicted time of that interactive work: the tightest
    /// bound of its interactive requests, less the margin of the allowance over
    /// the interactive work alone. Never below the predicted time of the
    /// interactive work itself (which always runs).
    fn time_limit(&self, now: Instant, budget: &StepBudget) -> Option<(f64, f64)> {
        if !self.interactive_present() {
            return None;
        }
        let cost = &self.cost;
        let one_row = cost.predict(&StepShape::of_seq(1, 0, true));
        let base = cost.predict(budget.shape()).max(one_row);
        let relative = self.relative_bound(base);
        let mut bound =
            if self.waiting[SloClass::Interactive].is_empty() && !self.followup_expected(now) {
                f64::INFINITY
            } else {
                // An interactive request waits for room, or one just finished and
                // its client's next may arrive during this step: keep steps short.
                relative
            };
        for s in &self.running {
            if !s.is_active() || s.rank() != SloClass::Interactive {
                continue;
            }
            let b = if s.is_decoding() {
                // A drafting row's step emits more than one token on average: its
                // TPOT target bounds the time per expected token.
                let per_step = s.expected_step_tokens();
                s.targets()
                    .tpot_ms
                    .map_or(relative, |t| self.stretched(base, t / 1e3 * per_step))
            } else if let Some(t) = s.targets().ttft_ms {
                // Its share of the TTFT slack: this step and the chunks still left;
                // and no more than the relative bound, as without a target. A
                // prefill step is what a person waits for, and a rare one (a
                // stream's prefill is one step of dozens), so keeping it short
                // costs batch work little: on the default model the slack alone let
                // batch rows stretch the stream's TTFT to 8x alone (p50 276 ms of
                // 500) for no gain in the flood's rate.
                let waited = now.saturating_duration_since(s.timings().arrival);
                let slack = t / 1e3 - waited.as_secs_f64();
                let left = s.num_uncomputed() - s.scheduled();
                let steps = 1 + left.div_ceil(self.cfg.max_prefill_chunk);
                (slack / steps as f64).min(relative)
            } else {
                relative
            };
            bound = bound.min(b);
        }
        if !bound.is_finite() {
            return None;
        }
        Some((self.with_margin(base, bound), base))
    }
}
