//! Grammar fast-forward in a step: where a constrained decode row's grammar
//! allows only one continuation after its newest token (a tool call's
//! `{"name": "`, a schema's fixed keys), those forced tokens are the leading part
//! of the row's draft, verified as one multi-token row like an n-gram draft
//! (`speculate.rs`). Every position is still sampled in order by the row's own
//! sampler (a forced position is the sampler's one-allowed-token path: no draw
//! over the row, the seeded RNG advanced as a draw would), so the output is the
//! same as without fast-forward; the matcher only ever consumes sampled tokens.
//!
//! Both classes get them (a forced token's acceptance is all but certain, so it
//! costs less than a step of its own for anyone), bounded by `max_tokens`, the
//! context length, the KV blocks the pool has free (no eviction, no preemption
//! for them), `grammar_max_forced`, and for a row that joins a time-bounded step
//! the step's time limit. The step-time model charges each forced position as a
//! verification position: a row through the model with its own logits row.

use super::Scheduler;
use crate::budget::StepBudget;
use crate::step_cost::StepShape;

/// The budget a row of one token grown to `1 + k` tokens adds, after `nc`
/// computed tokens.
pub(super) fn extra_positions(nc: usize, from: usize, k: usize) -> StepShape {
    let mut extra = StepShape::of_seq(from + k, nc, true);
    extra -= StepShape::of_seq(from, nc, true);
    extra
}

impl Scheduler {
    /// Gives running row `i` (a constrained decode row planned for its one token,
    /// no draft yet) the tokens its grammar forces next as its draft, within the
    /// bounds above. Returns how many.
    pub(super) fn plan_forced(&mut self, i: usize, budget: &mut StepBudget) -> usize {
        let max = self.cfg.grammar_max_forced;
        let s = &mut self.running[i];
        if max == 0 || s.scheduled() != 1 || !s.draft().is_empty() || !s.is_decoding() {
            return 0;
        }
        // The grammar's forced tokens after every sampled token (a query: the
        // matcher is not advanced).
        let Some(forced) = s.grammar_forced_tokens() else {
            return 0;
        };
        if forced.is_empty() {
            return 0;
        }
        let nc = s.num_computed();
        // The row ends before the context length and the last token asked for.
        let room = s.max_len().saturating_sub(s.tokens().len());
        let left = s.max_tokens().saturating_sub(s.num_generated() + 1);
        let free_slots = (s.blocks().len() + self.pool.num_free()) * self.pool.block_size();
        let cap = forced
            .len()
            .min(max)
            .min(room)
            .min(left)
            .min(budget.remaining())
            .min(free_slots.saturating_sub(nc + 1));
        let k = self.fit_forced(nc, cap, budget);
        if k == 0 {
            return 0;
        }
        let s = &mut self.running[i];
        let need = self.pool.blocks_for(nc + 1 + k) - s.blocks().len();
        s.push_new_blocks(need).expect("free blocks were counted");
        budget.take(extra_positions(nc, 1, k));
        s.force_draft(&forced[..k]);
        k
    }

    /// How many of `cap` forced tokens a row after `nc` computed tokens carries:
    /// all that fit the step's time limit, and that keep a step that fits the
    /// runner's small-batch path on it. No gain test as for an n-gram draft: a
    /// forced position is one more row in a step that runs anyway, where the token
    /// it emits would otherwise take a step of its own (and the step-time model
    /// cannot judge longer rows before it has seen some).
    fn fit_forced(&self, nc: usize, cap: usize, budget: &StepBudget) -> usize {
        let small = self.cost.small_batch_tokens();
        let used = budget.used();
        let mut k = 0;
        while k < cap {
            if small > 0 && used <= small && used + k + 1 > small {
                break;
            }
            if !budget.fits(&self.cost, extra_positions(nc, 1, k + 1)) {
                break;
            }
            k += 1;
        }
        k
    }
}
