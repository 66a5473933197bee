//! `Sequence`: one request inside the engine: its tokens (prompt + generated), how
//! many have KV, its block table, sampler, stop conditions, event sender and timings.
//! Owned by exactly one queue of the scheduler at a time (no shared state).

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::block_pool::BlockTable;
use crate::event::{Event, FinishInfo, FinishReason, RequestTimings, SloReport};
use crate::request::{SloClass, SloTargets, StopConditions};
use crate::sampler::Sampler;
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
    /// Admitted at least once (it left the admission-bounded waiting queue).
    pub started: bool,
    /// Order of its latest admission to the running set ("most recently started").
    pub start_order: u64,
    /// Tokens planned for the current step (0: not scheduled).
    pub scheduled: usize,
    /// Preempted during the current step: leaves the running set after planning.
    pub preempted: bool,
    pub finish: Option<FinishReason>,
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
            started: false,
            start_order: 0,
            scheduled: 0,
            preempted: false,
            finish: None,
        }
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

    /// Running and not leaving (not preempted, no finish reason).
    pub fn is_active(&self) -> bool {
        !self.preempted && self.finish.is_none()
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
