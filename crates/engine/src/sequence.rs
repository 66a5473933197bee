//! `Sequence`: one request inside the engine: its tokens (prompt + generated), how
//! many have KV, its block table, sampler, stop conditions, event sender and timings.
//! Owned by exactly one queue of the scheduler at a time (no shared state). Its
//! lifecycle is one [`SeqState`], moved only by the transition methods below.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::block_pool::BlockTable;
use crate::event::{Event, FinishInfo, FinishReason, RequestTimings, SloReport};
use crate::request::{SloClass, SloTargets, StopConditions};
use crate::sampler::Sampler;
use crate::speculate::Acceptance;
use crate::stats::SloAttainment;

pub(crate) struct Sequence {
    pub id: u64,
    /// Resolved class (the default when the request named none or classes are off).
    pub class: SloClass,
    /// Resolved latency targets (none for batch).
    pub targets: SloTargets,
    /// The step this sequence last ran in (or was admitted in): batch rows left
    /// out of steps rotate by it.
    pub last_run_step: u64,
    /// A batch request admitted by aging (it waited `batch_aging_ms` while no batch
    /// sequence ran): scheduled as interactive.
    pub promoted: bool,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is in the sequence's blocks.
    pub num_computed: usize,
    pub blocks: BlockTable,
    /// Leading full blocks already offered to the prefix cache.
    pub num_cache_inserted: usize,
    pub sampler: Sampler,
    pub want_logprobs: bool,
    pub stop: StopConditions,
    /// Stop with `Length` at this many tokens (prompt + max_tokens, capped by the
    /// model's context length).
    pub max_len: usize,
    pub tx: UnboundedSender<Event>,
    pub timings: RequestTimings,
    pub cached_prompt_tokens: usize,
    /// Which prefix-cache trie it reads and feeds (0: the shared one).
    pub cache_salt: u64,
    /// The client's own deadline, from arrival (`Request::deadline`): a batch
    /// sequence still waiting to start when it passes finishes `TimedOut`.
    pub deadline: Option<std::time::Duration>,
    /// The TTFT target it is shed for when still waiting (its own; see
    /// `Admitted::refuse_ttft_ms`).
    pub refuse_ttft_ms: Option<f64>,
    /// Where it is in its life (private: the transitions check their precondition).
    state: SeqState,
    /// Order of its latest admission to the running set ("most recently started").
    pub start_order: u64,
    /// Tokens planned for the current step (0: not scheduled); a verification
    /// row's count includes its draft.
    pub scheduled: usize,
    /// The speculative draft planned after the newest token this step (empty:
    /// none); cleared when the step's results come back.
    pub draft: Vec<u32>,
    /// How many leading tokens of `draft` the grammar forces (fast-forward); the
    /// rest is an n-gram draft.
    pub forced: usize,
    /// How often its drafts are accepted.
    pub acceptance: Acceptance,
}

/// A sequence's lifecycle:
///
/// ```text
///  Waiting --admit--> Running --preempt--> Preempted --requeue--> Requeued --admit--> Running
///                        |
///                        +--finish--> Finished(reason)  (then reaped: `Finished` event sent, dropped)
/// ```
///
/// A waiting or requeued sequence that leaves from its queue (shed, cancelled,
/// timed out) sends `Finished` directly. Running covers prefilling and decoding
/// ([`Sequence::phase`] tells which, from the counts).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SeqState {
    /// In the waiting queue, never admitted (counted against its class's bounds).
    Waiting,
    /// In the running set.
    Running,
    /// Preempted during the current step: leaves the running set after planning.
    Preempted,
    /// Waiting again after a preemption (admitted before: not shed for its wait).
    Requeued,
    /// Leaving the running set with this reason.
    Finished(FinishReason),
}

/// What a sequence is doing: its state with the running phase spelled out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase<'a> {
    Waiting,
    /// Running with prompt (or, after preemption, recomputed) tokens left: `done`
    /// of `of` have KV.
    Prefilling {
        done: usize,
        of: usize,
    },
    /// Running; only the newest token lacks KV.
    Decoding,
    Preempted,
    Requeued,
    Finished(&'a FinishReason),
}

impl Sequence {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        class: SloClass,
        targets: SloTargets,
        prompt: Vec<u32>,
        sampler: Sampler,
        stop: StopConditions,
        max_len: usize,
        tx: UnboundedSender<Event>,
        arrival: Instant,
        blocks: BlockTable,
    ) -> Self {
        let prompt_len = prompt.len();
        let want_logprobs = sampler.params().logprobs.is_some();
        let mut tokens = prompt;
        tokens.reserve(max_len.saturating_sub(prompt_len).min(4096));
        Sequence {
            id,
            class,
            targets,
            last_run_step: 0,
            promoted: false,
            tokens,
            prompt_len,
            num_computed: 0,
            blocks,
            num_cache_inserted: 0,
            sampler,
            want_logprobs,
            stop,
            max_len,
            tx,
            timings: RequestTimings::new(arrival),
            cached_prompt_tokens: 0,
            cache_salt: 0,
            deadline: None,
            refuse_ttft_ms: None,
            state: SeqState::Waiting,
            start_order: 0,
            scheduled: 0,
            draft: Vec::new(),
            forced: 0,
            acceptance: Acceptance::default(),
        }
    }

    #[cfg(test)]
    pub fn state(&self) -> &SeqState {
        &self.state
    }

    /// The state with the running phase spelled out.
    pub fn phase(&self) -> Phase<'_> {
        match &self.state {
            SeqState::Waiting => Phase::Waiting,
            SeqState::Running if self.is_decoding() => Phase::Decoding,
            SeqState::Running => Phase::Prefilling {
                done: self.num_computed,
                of: self.tokens.len(),
            },
            SeqState::Preempted => Phase::Preempted,
            SeqState::Requeued => Phase::Requeued,
            SeqState::Finished(r) => Phase::Finished(r),
        }
    }

    /// Admitted at least once (it left the admission-bounded waiting queue).
    pub fn has_started(&self) -> bool {
        self.state != SeqState::Waiting
    }

    /// Waiting or Requeued -> Running; true on its first admission.
    pub fn admit(&mut self) -> bool {
        debug_assert!(
            matches!(self.state, SeqState::Waiting | SeqState::Requeued),
            "seq {}: admitted from {:?}",
            self.id,
            self.state
        );
        let first = self.state == SeqState::Waiting;
        self.state = SeqState::Running;
        first
    }

    /// Running -> Preempted: its KV is freed (generated tokens and sampler kept).
    pub fn preempt(&mut self) {
        debug_assert_eq!(self.state, SeqState::Running, "seq {}: preempted", self.id);
        self.reset_kv();
        self.state = SeqState::Preempted;
        self.timings.preemptions += 1;
    }

    /// Preempted -> Requeued (back to its class's waiting queue).
    pub fn requeue(&mut self) {
        debug_assert_eq!(self.state, SeqState::Preempted, "seq {}: requeued", self.id);
        self.state = SeqState::Requeued;
    }

    /// Running (or preempted, failing) -> Finished(reason); the first reason wins.
    pub fn finish(&mut self, reason: FinishReason) {
        debug_assert!(
            !matches!(self.state, SeqState::Waiting | SeqState::Requeued),
            "seq {}: finished from a queue ({:?}); send_finished it",
            self.id,
            self.state
        );
        if !matches!(self.state, SeqState::Finished(_)) {
            self.state = SeqState::Finished(reason);
        }
    }

    /// The reason it is leaving, once finished.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        match &self.state {
            SeqState::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// Preempted during the current step.
    pub fn is_preempted(&self) -> bool {
        self.state == SeqState::Preempted
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run before the next token can be sampled.
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Running and only the newest token lacks KV: the next step is a decode.
    pub fn is_decoding(&self) -> bool {
        self.num_computed > 0 && self.num_uncomputed() == 1 && self.num_generated() > 0
    }

    /// The class it is scheduled as: interactive when promoted by aging.
    pub fn rank(&self) -> SloClass {
        if self.promoted {
            SloClass::Interactive
        } else {
            self.class
        }
    }

    /// Running and not leaving (not preempted, not finished).
    pub fn is_active(&self) -> bool {
        self.state == SeqState::Running
    }

    /// The most tokens this sequence may generate.
    pub fn max_tokens(&self) -> usize {
        self.stop.max_tokens.unwrap_or(usize::MAX)
    }

    /// Whether the client dropped its stream.
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Frees the KV blocks and returns to "nothing computed" (preemption; the
    /// generated tokens and the sampler state are kept).
    pub fn reset_kv(&mut self) {
        self.blocks.clear();
        self.num_computed = 0;
        self.num_cache_inserted = 0;
        self.scheduled = 0;
        self.draft.clear();
        self.forced = 0;
    }

    /// Tokens this step is expected to emit for it: the forced draft tokens (the
    /// grammar allows only them), then the newest token's sample and each n-gram
    /// draft token accepted (`1 + a + ... + a^k`).
    pub fn expected_step_tokens(&self) -> f64 {
        let ngram = self.draft.len().saturating_sub(self.forced);
        self.forced as f64 + self.acceptance.expected_tokens(ngram)
    }

    /// Sends `Finished` (ignoring a closed stream); the caller then drops the
    /// sequence, which frees its blocks.
    /// Judges the request against its targets (counted into `slo` for requests
    /// that were served: a stop token or string, or its length).
    pub fn send_finished(&mut self, reason: FinishReason, now: Instant, slo: &mut SloAttainment) {
        self.timings.finish = Some(now);
        let report = SloReport::judge(&self.targets, &self.timings, self.num_generated());
        if matches!(
            reason,
            FinishReason::Stop | FinishReason::StopString | FinishReason::Length
        ) {
            report.count_into(slo);
        }
        let info = FinishInfo {
            reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.num_generated(),
            cached_prompt_tokens: self.cached_prompt_tokens,
            timings: self.timings.clone(),
            slo: report,
        };
        let _ = self.tx.send(Event::Finished(info));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_pool::BlockPool;
    use crate::sampler::SamplingParams;

    fn seq(pool: &BlockPool) -> (Sequence, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let s = Sequence::new(
            1,
            SloClass::Interactive,
            SloTargets::default(),
            vec![1, 2, 3],
            Sampler::new(SamplingParams::default(), 16),
            StopConditions::max_tokens(8),
            16,
            tx,
            Instant::now(),
            pool.new_table(),
        );
        (s, rx)
    }

    #[test]
    fn the_lifecycle_moves_by_its_transitions() {
        let pool = BlockPool::new(8, 4);
        let (mut s, _rx) = seq(&pool);
        assert_eq!((s.phase(), s.has_started()), (Phase::Waiting, false));
        assert!(s.admit(), "first admission");
        assert_eq!(s.phase(), Phase::Prefilling { done: 0, of: 3 });
        s.num_computed = 3;
        s.tokens.push(9);
        assert_eq!(s.phase(), Phase::Decoding);
        assert!(s.is_active());
        s.preempt();
        assert_eq!(
            (s.phase(), s.num_computed, s.timings.preemptions),
            (Phase::Preempted, 0, 1)
        );
        assert!(!s.is_active() && s.is_preempted());
        s.requeue();
        assert_eq!((s.state(), s.has_started()), (&SeqState::Requeued, true));
        assert!(!s.admit(), "a readmission");
        assert_eq!(s.phase(), Phase::Prefilling { done: 0, of: 4 });
        s.finish(FinishReason::Stop);
        s.finish(FinishReason::Cancelled);
        assert_eq!(
            s.finish_reason(),
            Some(&FinishReason::Stop),
            "the first reason wins"
        );
        assert!(!s.is_active());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "admitted from Running")]
    fn a_transition_from_the_wrong_state_is_caught() {
        let pool = BlockPool::new(8, 4);
        let (mut s, _rx) = seq(&pool);
        s.admit();
        s.admit();
    }
}
