//! `Sequence`: one request inside the engine: its tokens (prompt + generated), how
//! many have KV, its block table, sampler, stop conditions, event sender and timings.
//! Owned by exactly one queue of the scheduler at a time (no shared state). Its
//! lifecycle is one [`SeqState`], moved only by the transition methods below; its
//! draft (grammar-forced and n-gram tokens to verify) in `draft.rs`.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::block_pool::BlockTable;
use crate::event::{Event, FinishInfo, FinishReason, RequestTimings, SloReport};
use crate::request::{FlowKey, SloClass, SloTargets, StopConditions};
use crate::sampler::Sampler;
use crate::speculate::Acceptance;
use crate::stats::{Counters, SloAttainment};

/// Every field is private: the scheduler reads them through the accessors below
/// and changes them only through the named methods, each keeping its invariant
/// (`scheduled` is `1 + draft.len()` for a row with a draft, `num_computed` never
/// passes the tokens, the blocks offered to the prefix cache are full and computed).
pub(crate) struct Sequence {
    id: u64,
    /// Resolved class (the default when the request named none or classes are off).
    class: SloClass,
    /// Resolved latency targets (none for batch).
    targets: SloTargets,
    /// The step this sequence last ran in (or was admitted in): batch rows left
    /// out of steps rotate by it.
    last_run_step: u64,
    /// A batch request admitted by aging (it waited `batch_aging_ms` while no batch
    /// sequence ran): scheduled as interactive.
    promoted: bool,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Leading tokens whose KV is in the sequence's blocks.
    num_computed: usize,
    blocks: BlockTable,
    /// Leading full blocks already offered to the prefix cache.
    num_cache_inserted: usize,
    /// Tokens whose KV it released after its latest preemption (`None`: none
    /// released since its latest admission; `preempt.rs`).
    lost_kv: Option<usize>,
    sampler: Sampler,
    want_logprobs: bool,
    stop: StopConditions,
    /// Stop with `Length` at this many tokens (prompt + max_tokens, capped by the
    /// model's context length).
    max_len: usize,
    tx: UnboundedSender<Event>,
    timings: RequestTimings,
    cached_prompt_tokens: usize,
    /// Which prefix-cache trie it reads and feeds (0: the shared one).
    cache_salt: u64,
    /// The client's own deadline, from arrival (`Request::deadline`): a batch
    /// sequence still waiting to start when it passes finishes `TimedOut`.
    deadline: Option<std::time::Duration>,
    /// The TTFT target it is shed for when still waiting (its own; see
    /// `Admitted::refuse_ttft_ms`).
    refuse_ttft_ms: Option<f64>,
    /// The flow it is queued fairly in (`Request::fairness`; empty: the one flow
    /// of requests without an id).
    flow: Box<str>,
    flow_key: FlowKey,
    /// Its start tag in its class's fair order (start-time fair queuing), given
    /// once when it joins the waiting queue: the queue is ordered by it.
    fair_tag: u64,
    /// Where it is in its life (the transitions check their precondition).
    state: SeqState,
    /// Order of its latest admission to the running set ("most recently started").
    start_order: u64,
    /// Tokens planned for the current step (0: not scheduled); a verification
    /// row's count includes its draft.
    scheduled: usize,
    /// The speculative draft planned after the newest token this step (empty:
    /// none); cleared when the step's results come back.
    draft: Vec<u32>,
    /// How many leading tokens of `draft` the grammar forces (fast-forward); the
    /// rest is an n-gram draft.
    forced: usize,
    /// How often its drafts are accepted.
    acceptance: Acceptance,
    /// Its prompt's scoring, when the request asked (`Request::prompt_logprobs`).
    scoring: Option<scoring::PromptScoring>,
    /// Its pooled output so far, when it is a pooled request (`Request::pooling`).
    pooling: Option<crate::pooling::PoolState>,
}

/// A sequence's lifecycle:
///
/// ```text
///  Waiting --admit--> Running --preempt--> Preempted --requeue--> Requeued --admit--> Running
///                        |             (its KV kept or released: `preempt.rs`)
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
            lost_kv: None,
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
            flow: Box::default(),
            flow_key: FlowKey::of(""),
            fair_tag: 0,
            state: SeqState::Waiting,
            start_order: 0,
            scheduled: 0,
            draft: Vec::new(),
            forced: 0,
            acceptance: Acceptance::default(),
            scoring: None,
            pooling: None,
        }
    }

    /// Feeds and reads the prefix-cache trie of `salt` (0: the shared one).
    pub fn with_cache_salt(mut self, salt: u64) -> Self {
        self.cache_salt = salt;
        self
    }

    /// The client's own deadline, from arrival.
    pub fn with_deadline(mut self, deadline: Option<std::time::Duration>) -> Self {
        self.deadline = deadline;
        self
    }

    /// The TTFT target it is shed for while still waiting.
    pub fn with_refuse_ttft_ms(mut self, ms: Option<f64>) -> Self {
        self.refuse_ttft_ms = ms;
        self
    }

    /// Queued fairly in flow `id` (the gateway's fairness id; `None` or empty:
    /// the flow of requests without one).
    pub fn with_flow(mut self, id: Option<String>) -> Self {
        self.flow = id.map(String::into_boxed_str).unwrap_or_default();
        self.flow_key = FlowKey::of(&self.flow);
        self
    }

    /// Its start tag in its class's fair order, given when it joins the queue.
    pub fn set_fair_tag(&mut self, tag: u64) {
        debug_assert_eq!(self.state, SeqState::Waiting, "seq {}: tagged", self.id);
        self.fair_tag = tag;
    }

    #[inline]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Resolved class (the default when the request named none or classes are off).
    #[inline]
    pub fn class(&self) -> SloClass {
        self.class
    }

    /// Resolved latency targets (none for batch).
    #[inline]
    pub fn targets(&self) -> &SloTargets {
        &self.targets
    }

    /// Prompt then generated tokens.
    #[inline]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    #[inline]
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Leading tokens whose KV is in its blocks.
    #[inline]
    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    #[inline]
    pub fn blocks(&self) -> &BlockTable {
        &self.blocks
    }

    /// Stop with `Length` at this many tokens (prompt + max_tokens, capped by the
    /// model's context length).
    #[inline]
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    #[inline]
    pub fn timings(&self) -> &RequestTimings {
        &self.timings
    }

    /// The client's own deadline, from arrival.
    #[inline]
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.deadline
    }

    /// The TTFT target it is shed for while still waiting.
    #[inline]
    pub fn refuse_ttft_ms(&self) -> Option<f64> {
        self.refuse_ttft_ms
    }

    /// The flow it is queued fairly in (empty: requests without a fairness id).
    #[inline]
    pub fn flow(&self) -> &str {
        &self.flow
    }

    /// Its flow's key in admission's per-flow counts.
    #[inline]
    pub(crate) fn flow_key(&self) -> FlowKey {
        self.flow_key
    }

    /// Its start tag in its class's fair order.
    #[inline]
    pub fn fair_tag(&self) -> u64 {
        self.fair_tag
    }

    /// Promoted by aging (a batch request scheduled as interactive).
    #[cfg(test)]
    pub fn is_promoted(&self) -> bool {
        self.promoted
    }

    /// The step it last ran in (or was admitted in).
    #[inline]
    pub fn last_run_step(&self) -> u64 {
        self.last_run_step
    }

    /// Order of its latest admission to the running set.
    #[inline]
    pub fn start_order(&self) -> u64 {
        self.start_order
    }

    /// Tokens planned for the current step (0: not scheduled), a verification
    /// row's draft included.
    #[inline]
    pub fn scheduled(&self) -> usize {
        self.scheduled
    }

    /// The speculative draft planned after the newest token this step (empty: none).
    #[inline]
    pub fn draft(&self) -> &[u32] {
        &self.draft
    }

    /// How many leading tokens of the draft the grammar forces.
    #[inline]
    pub fn num_forced(&self) -> usize {
        self.forced
    }

    /// How often its drafts are accepted.
    #[inline]
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
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

    /// Waiting or Requeued -> Running; true on its first admission, which
    /// records `cached` prompt tokens as served by the prefix cache (what its
    /// `Finished` reports; a readmission's hits are recomputation saved, not that).
    pub fn admit(&mut self, cached: usize) -> bool {
        debug_assert!(
            matches!(self.state, SeqState::Waiting | SeqState::Requeued),
            "seq {}: admitted from {:?}",
            self.id,
            self.state
        );
        let first = self.state == SeqState::Waiting;
        self.state = SeqState::Running;
        if first {
            self.cached_prompt_tokens = cached;
        }
        first
    }

    /// The bookkeeping of an admission to the running set: the `order`-th start,
    /// in step `step`; `aged` promotes it (a promotion lasts).
    pub fn mark_started(&mut self, step: u64, order: u64, aged: bool) {
        self.promoted |= aged;
        self.last_run_step = step;
        self.start_order = order;
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

    /// Appends `n` fresh blocks from the pool; `None` if it ran out first (the
    /// blocks taken so far stay).
    #[must_use]
    pub fn push_new_blocks(&mut self, n: usize) -> Option<()> {
        for _ in 0..n {
            self.blocks.push_new()?;
        }
        Some(())
    }

    /// Releases its blocks past the first `n` (KV written past its accepted
    /// tokens: a rejected speculative draft).
    pub fn release_blocks_past(&mut self, n: usize) {
        self.blocks.truncate(n);
    }

    /// The next `n` tokens' KV was written (the step that ran them came back).
    #[inline]
    pub fn advance_computed(&mut self, n: usize) {
        self.num_computed += n;
        debug_assert!(
            self.num_computed <= self.tokens.len(),
            "seq {}: computed past its tokens",
            self.id
        );
    }

    /// Plans `n` tokens of it for the current step (their blocks taken).
    #[inline]
    pub fn plan_tokens(&mut self, n: usize) {
        self.scheduled = n;
    }

    /// The step's results came back: nothing is planned for it.
    #[inline]
    pub fn clear_scheduled(&mut self) {
        self.scheduled = 0;
    }

    /// A step planned with it is built: it ran (first) at `now`, in step `step`.
    #[inline]
    pub fn mark_scheduled(&mut self, now: Instant, step: u64) {
        self.timings.first_scheduled.get_or_insert(now);
        self.last_run_step = step;
    }

    /// Charges it `d` of a step's machine time (its share by tokens).
    #[inline]
    pub fn charge_engine_time(&mut self, d: std::time::Duration) {
        self.timings.engine_time += d;
    }

    /// Samples its next token from `row` with its own sampler, appends and sends
    /// it, and finishes on a stop (the grammar's end, a stop token, its length)
    /// or a closed stream. A draw at which its constraint failed is not sent: it
    /// finishes `Constraint`. Returns whether it goes on.
    pub fn emit(&mut self, row: &[f32], t: Instant, c: &mut Counters) -> bool {
        if self.max_tokens() == 0 {
            // A scoring-only request (`max_tokens` 0): nothing is sampled.
            self.finish(FinishReason::Length);
            return false;
        }
        let sampled = self.sampler.sample_lean(row);
        if let Some(d) = self.sampler.last_mask_time() {
            c.mask_times.observe(d);
        }
        // The constraint failed at this draw (its mask, or the commit): the token
        // was not drawn under a working mask and is never sent; the client's
        // constraint ends the request.
        if let Some(end @ FinishReason::Constraint(_)) = self.sampler.constraint_end() {
            self.finish(end);
            return false;
        }
        let id = sampled.id;
        self.tokens.push(id);
        self.timings.on_token(t);
        c.generation_tokens += 1;
        let ev = Event::Token {
            id,
            logprob: self.want_logprobs.then_some(sampled.logprob),
            top_logprobs: sampled.top_logprobs,
            time: t,
        };
        if self.tx.send(ev).is_err() {
            self.finish(FinishReason::Cancelled);
        } else if let Some(end) = self.sampler.constraint_end() {
            self.finish(end);
        } else if self.stop.is_stop_token(id) {
            self.finish(FinishReason::Stop);
        } else if self.num_generated() >= self.max_tokens() || self.tokens.len() >= self.max_len {
            self.finish(FinishReason::Length);
        }
        self.finish_reason().is_none()
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

mod cache;
mod draft;
mod pooled;
mod preempt;
mod scoring;

pub(crate) use preempt::Resumed;

#[cfg(test)]
mod tests;
