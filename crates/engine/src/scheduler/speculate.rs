//! Speculative drafts in a step: which decode rows carry a draft (the tokens a
//! grammar forces, `forced.rs`; for interactive rows an n-gram draft after them)
//! and how long, and taking a verification row's results back (the accepted
//! prefix of the draft, the KV past it released).

use std::time::Instant;

use super::forced::extra_positions;
use super::Scheduler;
use crate::budget::StepBudget;
use crate::request::SloClass;
use crate::runner::Logits;
use crate::sequence::Sequence;
use crate::speculate;

/// A draft joins a step only if it raises the step's expected tokens per second
/// by at least this factor over the step without it (room for the step-time
/// model's error, so a draft that barely pays is left out).
const MIN_GAIN: f64 = 1.05;

/// Every this many steps a row with a draft that does not pay verifies a short
/// one anyway (`PROBE_LEN` tokens): the step-time model only learns what a
/// longer row costs from steps that carry one, and the acceptance estimate only
/// from drafts verified (a few tokens one step in 32: under 1% of the work).
const PROBE_EVERY: u64 = 32;
const PROBE_LEN: usize = 2;

/// Whether `s` may carry an n-gram draft this step: an interactive-class decode
/// row planned (a batch request promoted by aging stays batch).
fn may_draft(s: &Sequence) -> bool {
    s.is_active() && s.class() == SloClass::Interactive && s.is_decoding() && s.scheduled() > 0
}

impl Scheduler {
    /// Gives the decode rows planned so far their drafts: first the tokens a
    /// grammar forces (`forced.rs`, both classes), then for interactive rows an
    /// n-gram draft after them, as long as pays: the length `k` that maximises the
    /// step's expected tokens per predicted second (its rows' tokens, each
    /// drafting row's expected `1 + a + ... + a^k` for its acceptance `a`), with
    /// the KV blocks the pool has free (no eviction, no preemption for a draft). In
    /// a large batch an n-gram draft's tokens cost more than they add, so none joins.
    pub(super) fn plan_drafts(&mut self, budget: &mut StepBudget) {
        let params = self.cfg.ngram_params();
        if params.max_draft == 0 && self.cfg.grammar_max_forced == 0 {
            return;
        }
        // Tokens the step is expected to emit: one per planned decode row so far.
        let mut expected = budget.shape().decode_rows as f64;
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if !(s.is_active() && s.is_decoding() && s.scheduled() == 1) {
                continue;
            }
            let f = self.plan_forced(i, budget);
            expected += f as f64;
            if params.max_draft == 0 || !may_draft(&self.running[i]) {
                continue;
            }
            let s = &mut self.running[i];
            // The draft ends before the context length and the last token asked for.
            let room = s.max_len().saturating_sub(s.tokens().len() + f);
            let left = s.max_tokens().saturating_sub(s.num_generated() + 1 + f);
            let cap = params.max_draft.min(room).min(left).min(budget.remaining());
            let p = speculate::NgramParams {
                max_draft: cap,
                ..params
            };
            // Looked up after the forced tokens.
            s.extend_ngram_draft(&p, &mut self.ngram);
            let k = self.pick_draft_len(i, expected, budget);
            let s = &mut self.running[i];
            s.keep_draft(f + k);
            if k == 0 {
                s.relax_acceptance();
                continue;
            }
            let nc = s.num_computed();
            let need = self.pool.blocks_for(nc + 1 + f + k) - s.blocks().len();
            s.push_new_blocks(need)
                .expect("pick_draft_len checked free blocks");
            budget.take(extra_positions(nc, 1 + f, k));
            expected += s.acceptance().expected_tokens(k) - 1.0;
        }
    }

    /// The n-gram draft length for running row `i` (its forced tokens planned,
    /// its n-gram draft found after them) that maximises the step's expected
    /// tokens per predicted second, given the `expected` tokens of the step
    /// planned so far; 0 if no length gains `MIN_GAIN` (but a probe now and
    /// then) or the pool lacks blocks.
    fn pick_draft_len(&self, i: usize, expected: f64, budget: &StepBudget) -> usize {
        let s = &self.running[i];
        let (nc, f) = (s.num_computed(), s.num_forced());
        let bs = self.pool.block_size();
        // Positions the held blocks and the free pool can take.
        let free_slots = (s.blocks().len() + self.pool.num_free()) * bs;
        let max_k = (s.draft().len() - f).min(free_slots.saturating_sub(nc + 1 + f));
        let rate = |k: usize| {
            let shape = *budget.shape() + extra_positions(nc, 1 + f, k);
            let e = expected - 1.0 + s.acceptance().expected_tokens(k);
            e / self.cost.predict(&shape).max(1e-9)
        };
        let base = rate(0);
        let (mut best, mut best_rate) = (0, base * MIN_GAIN);
        for k in 1..=max_k {
            let r = rate(k);
            if r > best_rate {
                (best, best_rate) = (k, r);
            }
        }
        if best == 0 && (self.step + s.start_order()).is_multiple_of(PROBE_EVERY) {
            return max_k.min(PROBE_LEN);
        }
        best
    }

    /// Takes back verification row `i`'s results (its logits rows from `first`):
    /// samples each position in order with the sequence's own sampler ([`emit`]),
    /// stops at the first sample that differs from the draft (or a stop), and keeps
    /// the KV of the accepted prefix only. The forced and the n-gram part of the
    /// draft are counted apart; an n-gram part the verification never reached (a
    /// forced token rejected, or a stop) teaches the acceptance estimate nothing.
    pub(super) fn verify(&mut self, i: usize, logits: &Logits, first: usize, t: Instant) {
        let s = &mut self.running[i];
        let (draft, f) = s.take_draft();
        let (mut accepted, mut emitted) = (0, 0);
        for j in 0..=draft.len() {
            let before = s.tokens().len();
            let goes_on = s.emit(logits.row(first + j), t, &mut self.counters);
            if s.tokens().len() == before {
                // Nothing sent: its constraint failed at this draw (it finished).
                break;
            }
            emitted += 1;
            let id = *s.tokens().last().expect("a token was emitted");
            if !goes_on || j == draft.len() || id != draft[j] {
                break;
            }
            accepted += 1;
        }
        // The newest token and the accepted draft tokens have their KV; what was
        // written past them goes with the blocks it alone occupied.
        s.advance_computed(1 + accepted);
        s.release_blocks_past(self.pool.blocks_for(s.tokens().len()));
        let forced = &mut self.counters.forced[s.class()];
        forced.drafted_tokens += f as u64;
        forced.accepted_tokens += accepted.min(f) as u64;
        let ngram = draft.len() - f;
        if ngram > 0 && accepted >= f {
            let ngram_accepted = accepted - f;
            s.observe_acceptance(ngram, ngram_accepted);
            let c = &mut self.counters.spec[s.class()];
            c.verify_rows += 1;
            c.drafted_tokens += ngram as u64;
            c.accepted_tokens += ngram_accepted as u64;
            c.emitted_tokens += (emitted - f) as u64;
        }
        s.return_draft_buffer(draft);
    }
}
