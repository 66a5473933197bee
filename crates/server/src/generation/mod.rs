//! [`Generation`]: one submitted request, driven by `next().await`, from engine token
//! events to text. Its pieces: detokenizing ([`TextDecoder`]), stop strings
//! ([`stop`]), logprobs ([`logprobs`]) and accounting ([`usage`]). A matched stop
//! string is reported to the engine (`cancel` with `StopString`), whose `Finished`
//! then ends the request with the engine's counts and timings. It owns the
//! `RequestStream`, so dropping it (a client disconnect drops the response body)
//! cancels the request at the engine's next step.

pub mod logprobs;
pub mod stop;
pub mod stop_automaton;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use sloserve_api::Usage;
use sloserve_engine::{Event, FinishInfo, FinishReason, PromptLogprob, RequestStream, SloClass};
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::tokenizer::Tokenizer;

use crate::error::ServerError;
use crate::limits::CountGuard;
use crate::state::{AppState, InflightGuard};
use logprobs::{LogprobBuffer, TokenLogprob};
use stop::{StopMatcher, StopOutcome};
use stop_automaton::StopAutomaton;
use usage::Accounting;

/// New output: text and the logprobs of the tokens it covers (when asked).
#[derive(Debug, Default)]
pub struct Delta {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

/// Generated ids to text, with the byte offset of each token's text.
#[derive(Debug)]
pub struct TextDecoder {
    decoder: StreamDecoder,
    len: usize,
}

impl TextDecoder {
    fn new() -> Self {
        TextDecoder {
            decoder: StreamDecoder::new(true),
            len: 0,
        }
    }

    /// The text `id` completes, and the offset where the token's text starts.
    fn push(&mut self, tok: &Tokenizer, id: u32) -> (usize, String) {
        let offset = self.len;
        let piece = self.decoder.push(tok, id).to_string();
        self.len += piece.len();
        (offset, piece)
    }

    /// What is still held back (an incomplete UTF-8 sequence).
    fn flush(&mut self) -> String {
        self.decoder.flush()
    }
}

/// One request in flight.
pub struct Generation {
    state: Arc<AppState>,
    id: String,
    stream: Option<RequestStream>,
    decoder: TextDecoder,
    stop: StopMatcher,
    /// `Some` when the request asked for logprobs.
    logprobs: Option<LogprobBuffer>,
    /// The prompt's scores, when the request asked the engine for them.
    prompt_scores: Vec<PromptLogprob>,
    acct: Accounting,
    /// A stop string matched: the engine was told, later tokens are dropped.
    stopped: bool,
    /// How it ended, once it did.
    reason: Option<FinishReason>,
    /// When it must have finished, and the timeout that set it.
    deadline: Option<(tokio::time::Instant, Duration)>,
    /// The deadline passed: the engine was told, its `Finished` is awaited.
    timed_out: bool,
    /// Which choice of its request this is (`n` > 1), for the log line.
    choice: u32,
    /// `next` returns at the first token even when it released no text.
    until_first: bool,
    /// The field its constraint came from, named when the constraint fails.
    constraint_param: &'static str,
    /// A chat answer of a model that reasons: its reasoning tokens counted.
    reasoning: Option<crate::reasoning::ReasoningCount>,
    /// Its count in the in-flight limit (a later choice; the first is counted
    /// for its whole request by the middleware).
    _slot: Option<CountGuard>,
    _inflight: InflightGuard,
}

impl Generation {
    pub fn new(
        state: &Arc<AppState>,
        id: String,
        stream: RequestStream,
        class: SloClass,
        prompt_tokens: usize,
        stops: Option<Arc<StopAutomaton>>,
        want_logprobs: bool,
    ) -> Self {
        Generation {
            state: state.clone(),
            id,
            stream: Some(stream),
            decoder: TextDecoder::new(),
            stop: StopMatcher::shared(stops),
            logprobs: want_logprobs.then(LogprobBuffer::default),
            prompt_scores: Vec::new(),
            acct: Accounting::new(class, prompt_tokens),
            stopped: false,
            reason: None,
            deadline: None,
            timed_out: false,
            choice: 0,
            until_first: false,
            constraint_param: "response_format",
            reasoning: None,
            _slot: None,
            _inflight: InflightGuard::new(state),
        }
    }

    /// Ends the request `timeout` from now (the engine frees its blocks then).
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.deadline = timeout.map(|t| (tokio::time::Instant::now() + t, t));
        self
    }

    /// Its constraint came from `param` (`tools`; else `response_format`).
    /// Decodes the control tokens `ids` into the text (a tool-call format's markers).
    pub fn with_kept_tokens(mut self, ids: &[u32]) -> Self {
        if !ids.is_empty() {
            self.decoder.decoder.keep(ids.to_vec());
        }
        self
    }

    /// Counts the reasoning tokens of an answer `splitter` splits.
    pub fn with_reasoning(
        mut self,
        splitter: Option<&sloserve_model::reasoning::ReasoningSplitter>,
    ) -> Self {
        self.reasoning = splitter.map(|s| crate::reasoning::ReasoningCount::new(s.clone()));
        self
    }

    pub fn with_constraint_param(mut self, param: &'static str) -> Self {
        self.constraint_param = param;
        self
    }

    /// Holds `slot` (its count in the in-flight limit) while it lives.
    pub fn with_slot(mut self, slot: CountGuard) -> Self {
        self._slot = Some(slot);
        self
    }

    /// Choice `index` of its request (its log line says which).
    pub fn with_choice(mut self, index: u32) -> Self {
        self.choice = index;
        self
    }

    /// The client stopped reading: the engine ends the request (its blocks are
    /// freed) and the log line says `client_stalled`.
    pub fn stall(&mut self) {
        if let Some(s) = self.stream.take() {
            self.state
                .engine
                .cancel(s.id(), FinishReason::ClientStalled);
        }
        if self.reason.is_none() {
            self.reason = Some(FinishReason::ClientStalled);
        }
    }

    /// Ends the request now (another choice of its request failed): the engine
    /// frees its blocks; the log line says `cancelled`.
    pub fn cancel(&mut self) {
        if let Some(s) = self.stream.take() {
            self.state.engine.cancel(s.id(), FinishReason::Cancelled);
        }
        if self.reason.is_none() {
            self.reason = Some(FinishReason::Cancelled);
        }
    }

    /// Waits for the first token (the prompt has been prefilled, its full blocks
    /// are in the prefix cache): what `next` returns, but at the first token
    /// even when it released no text (then an empty delta). `None` once finished.
    pub async fn first_token(&mut self) -> Option<Delta> {
        self.until_first = self.acct.tokens() == 0;
        let d = self.next().await;
        self.until_first = false;
        d
    }

    /// The response id ("cmpl-…" / "chatcmpl-…").
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.state.tokenizer
    }

    /// The prompt's scores received so far (all of them once the first token
    /// came or the request ended; none unless asked).
    pub fn prompt_scores(&self) -> &[PromptLogprob] {
        &self.prompt_scores
    }

    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.is_some()
    }

    /// Why it ended; `None` while it runs.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.reason.as_ref()
    }

    /// The error to answer with when it ended without a usable completion (engine
    /// failure or abort).
    pub fn failure(&self) -> Option<ServerError> {
        match self.reason.as_ref()? {
            FinishReason::Error(m) => Some(ServerError::EngineFailure(m.clone())),
            FinishReason::Constraint(m) => Some(ServerError::ConstraintFailed {
                param: self.constraint_param,
                message: m.clone(),
            }),
            FinishReason::TimedOut => Some(ServerError::TimedOut {
                ms: self.deadline.map_or(0, |(_, d)| d.as_millis() as u64),
            }),
            FinishReason::Shed => Some(ServerError::Shed),
            FinishReason::Aborted | FinishReason::Cancelled | FinishReason::ClientStalled => {
                Some(ServerError::Aborted)
            }
            FinishReason::Stop | FinishReason::Length | FinishReason::StopString => None,
        }
    }

    /// Token counts, cached tokens and where the time went (the engine's timings).
    pub fn usage(&self) -> Usage {
        let mut u = self.acct.usage();
        if let Some(r) = &self.reasoning {
            u.completion_tokens_details = Some(sloserve_api::CompletionTokensDetails {
                reasoning_tokens: r.count(),
            });
        }
        u
    }

    fn take_delta(&mut self, text: String) -> Option<Delta> {
        let logprobs = match &mut self.logprobs {
            Some(b) if !b.is_empty() => b.take(),
            _ if text.is_empty() => return None,
            _ => Vec::new(),
        };
        Some(Delta { text, logprobs })
    }

    /// The next output, or `None` once finished (see `finish_reason`).
    pub async fn next(&mut self) -> Option<Delta> {
        loop {
            let stream = self.stream.as_mut()?;
            let event = match self.deadline {
                Some((at, _)) if !self.timed_out => {
                    match tokio::time::timeout_at(at, stream.recv()).await {
                        Ok(ev) => ev,
                        Err(_) => {
                            self.timed_out = true;
                            self.state
                                .engine
                                .cancel(stream.id(), FinishReason::TimedOut);
                            continue;
                        }
                    }
                }
                _ => stream.recv().await,
            };
            match event {
                // Sampled after the stop string, before the engine got the cancel.
                Some(Event::Token { .. }) if self.stopped => {}
                Some(Event::Token {
                    id,
                    logprob,
                    top_logprobs,
                    time,
                }) => {
                    if let Some(itl) = self.acct.on_token(time) {
                        self.state.metrics.observe_itl(self.acct.class(), itl);
                    }
                    let (offset, piece) = self.decoder.push(&self.state.tokenizer, id);
                    // A control token the text drops (harmony's `<|end|>`) is no
                    // reasoning.
                    if let Some(r) = &mut self.reasoning {
                        if !piece.is_empty() || !self.state.tokenizer.is_special(id) {
                            r.push(&piece);
                        }
                    }
                    if let Some(b) = &mut self.logprobs {
                        b.push(id, logprob, top_logprobs, offset);
                    }
                    let text = match self.stop.push(&piece) {
                        StopOutcome::Emit(t) => t,
                        StopOutcome::Stopped(t) => {
                            self.stopped = true;
                            let id = stream.id();
                            self.state.engine.cancel(id, FinishReason::StopString);
                            t
                        }
                    };
                    if let Some(d) = self.take_delta(text) {
                        return Some(d);
                    }
                    if self.until_first {
                        return Some(Delta::default());
                    }
                }
                Some(Event::PromptLogprobs(scores)) => self.prompt_scores.extend(scores),
                // A generation request never pools.
                Some(Event::Pooled(_)) => {}
                Some(Event::Finished(info)) => {
                    self.stream = None;
                    return self.finished(info);
                }
                None => {
                    self.stream = None;
                    self.reason = Some(FinishReason::Error(
                        "the engine stopped without finishing the request".into(),
                    ));
                    return None;
                }
            }
        }
    }

    /// The engine's `Finished`: the text still held back, and how it ended (a
    /// matched stop string wins over what the engine saw).
    fn finished(&mut self, mut info: FinishInfo) -> Option<Delta> {
        let mut text = String::new();
        if !self.stopped {
            let rest = self.decoder.flush();
            match self.stop.push(&rest) {
                StopOutcome::Emit(t) => text = t + &self.stop.finish(),
                StopOutcome::Stopped(t) => {
                    self.stopped = true;
                    text = t;
                }
            }
        }
        if self.stopped {
            info.reason = FinishReason::StopString;
        } else if self.timed_out && info.reason == FinishReason::Cancelled {
            info.reason = FinishReason::TimedOut;
        }
        self.acct.on_finished(&info);
        self.state
            .metrics
            .observe_finished(self.acct.class(), &info);
        self.reason = Some(info.reason);
        self.take_delta(text)
    }
}

impl Drop for Generation {
    /// One structured log line per request, however it ended.
    fn drop(&mut self) {
        let class = self.acct.class();
        let reason = self.reason.take().unwrap_or_else(|| {
            self.state.metrics.observe_disconnect(class);
            FinishReason::Cancelled
        });
        let u = self.acct.usage();
        let t = u.sloserve.unwrap_or_default();
        tracing::info!(
            target: "sloserve::request",
            id = %self.id,
            choice = self.choice,
            class = class.as_str(),
            prompt_tokens = u.prompt_tokens,
            completion_tokens = u.completion_tokens,
            cached_tokens = t.cached_prompt_tokens,
            queue_ms = t.queue_ms.unwrap_or(-1.0),
            ttft_ms = t.ttft_ms.unwrap_or(-1.0),
            e2e_ms = t.e2e_ms.unwrap_or_else(|| self.acct.elapsed().as_secs_f64() * 1e3),
            preemptions = t.preemptions,
            finish_reason = reason.label(),
            slo_missed = self.acct.missed_targets(),
            "request finished"
        );
    }
}
