//! A sequence's draft: the tokens verified after its newest one in one row (the
//! grammar's forced tokens first, then an n-gram lookup's), how its row grows
//! for them, and the acceptance that decides whether n-gram drafts pay.

use super::Sequence;
use crate::speculate::{self, NgramParams};

impl Sequence {
    /// The tokens its grammar forces next (a query: the matcher is not
    /// advanced); `None` without a grammar.
    pub fn grammar_forced_tokens(&mut self) -> Option<Vec<u32>> {
        self.sampler.constraint_mut().map(|m| m.forced_tokens())
    }

    /// Makes `forced` (tokens its grammar forces) its draft: the decode row
    /// planned for its one token grows to `1 + forced.len()` tokens.
    pub fn force_draft(&mut self, forced: &[u32]) {
        debug_assert!(
            self.scheduled == 1 && self.draft.is_empty(),
            "seq {}: forced tokens join a one-token decode row",
            self.id
        );
        self.scheduled = 1 + forced.len();
        self.draft.extend_from_slice(forced);
        self.forced = forced.len();
    }

    /// Appends the n-gram draft `p` finds after its tokens and its draft so far
    /// (the forced tokens) to its draft, as candidates until [`Self::keep_draft`]
    /// (`scratch`: the lookup's buffer).
    pub fn extend_ngram_draft(&mut self, p: &NgramParams, scratch: &mut Vec<u32>) {
        let mark = self.tokens.len();
        self.tokens.extend_from_slice(&self.draft);
        speculate::draft(&self.tokens, p, scratch);
        self.tokens.truncate(mark);
        self.draft.extend_from_slice(scratch);
    }

    /// Keeps the first `len` tokens of its draft (at least the forced ones) and
    /// plans them after its newest token.
    pub fn keep_draft(&mut self, len: usize) {
        debug_assert!(
            self.forced <= len && len <= self.draft.len(),
            "seq {}: keeps {len} of a {}-token draft",
            self.id,
            self.draft.len()
        );
        self.draft.truncate(len);
        self.scheduled = 1 + self.draft.len();
    }

    /// Takes its draft to verify, with how many leading tokens are forced (give
    /// the buffer back with [`Self::return_draft_buffer`]).
    pub fn take_draft(&mut self) -> (Vec<u32>, usize) {
        (
            std::mem::take(&mut self.draft),
            std::mem::take(&mut self.forced),
        )
    }

    /// Takes back a verified draft's buffer, emptied, for its next draft.
    pub fn return_draft_buffer(&mut self, mut draft: Vec<u32>) {
        draft.clear();
        self.draft = draft;
    }

    /// A step without an n-gram draft (none found, or not worth it).
    pub fn relax_acceptance(&mut self) {
        self.acceptance.relax();
    }

    /// A verification accepted `accepted` of `drafted` n-gram draft tokens.
    pub fn observe_acceptance(&mut self, drafted: usize, accepted: usize) {
        self.acceptance.observe(drafted, accepted);
    }

    /// Tokens this step is expected to emit for it: the forced draft tokens (the
    /// grammar allows only them), then the newest token's sample and each n-gram
    /// draft token accepted (`1 + a + ... + a^k`).
    pub fn expected_step_tokens(&self) -> f64 {
        let ngram = self.draft.len().saturating_sub(self.forced);
        self.forced as f64 + self.acceptance.expected_tokens(ngram)
    }
}
