//! A sequence's preemption: paused with its KV kept (its blocks held while it
//! waits, so it resumes where it stopped) or with its KV released (its full
//! blocks stay in the prefix cache and its disk tier; the rest is recomputed),
//! and what its resumption says of that.

use super::{SeqState, Sequence};

/// What became of a preempted sequence's KV, told when it resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resumed {
    /// It kept its blocks while it waited: nothing is recomputed.
    Kept,
    /// Its blocks were released, and every full one was found again in the prefix
    /// cache (RAM or disk); at most its partial last block is recomputed.
    Spilled { recomputed: usize, prompt: usize },
    /// Its blocks were released and some full ones are recomputed.
    Recomputed { recomputed: usize, prompt: usize },
}

impl Sequence {
    /// Running -> Preempted (generated tokens and sampler kept). With `keep` it
    /// is paused: it keeps the blocks of its computed tokens (those planned for
    /// this step past them are released, the plan dropped); else its KV is
    /// released. `block_size`: the pool's.
    pub fn preempt(&mut self, keep: bool, block_size: usize) {
        debug_assert_eq!(self.state, SeqState::Running, "seq {}: preempted", self.id);
        if keep {
            self.blocks
                .truncate(self.num_computed.div_ceil(block_size.max(1)));
            self.scheduled = 0;
            self.draft.clear();
            self.forced = 0;
        } else {
            self.release_kv();
        }
        self.state = SeqState::Preempted;
        self.timings.preemptions += 1;
    }

    /// Preempted -> Requeued (back to its class's waiting queue).
    pub fn requeue(&mut self) {
        debug_assert_eq!(self.state, SeqState::Preempted, "seq {}: requeued", self.id);
        self.state = SeqState::Requeued;
    }

    /// Preempted or requeued and still holding KV blocks (paused): they are
    /// released first when memory is needed.
    pub fn is_paused(&self) -> bool {
        matches!(self.state, SeqState::Preempted | SeqState::Requeued) && !self.blocks.is_empty()
    }

    /// Releases the KV of a preempted (or paused) sequence, remembering how many
    /// tokens had it (what its resumption recomputes unless the prefix cache still
    /// holds their blocks).
    pub fn release_kv(&mut self) {
        let had = self.lost_kv.unwrap_or(0).max(self.num_computed);
        self.lost_kv = Some(had);
        self.reset_kv();
    }

    /// Frees the KV blocks and returns to "nothing computed" (the generated
    /// tokens and the sampler state are kept).
    pub fn reset_kv(&mut self) {
        self.blocks.clear();
        self.num_computed = 0;
        self.num_cache_inserted = 0;
        self.scheduled = 0;
        self.draft.clear();
        self.forced = 0;
        self.reset_pooled();
    }

    /// At its readmission with `matched` tokens of KV (kept, or found in the
    /// prefix cache) and blocks of `block_size`: what became of its KV since its
    /// preemption.
    pub fn resumed(&mut self, matched: usize, block_size: usize) -> Resumed {
        let Some(had) = self.lost_kv.take() else {
            return Resumed::Kept;
        };
        let recomputed = had.saturating_sub(matched);
        let prompt = had.min(self.prompt_len).saturating_sub(matched);
        if matched >= had / block_size.max(1) * block_size {
            Resumed::Spilled { recomputed, prompt }
        } else {
            Resumed::Recomputed { recomputed, prompt }
        }
    }
}
