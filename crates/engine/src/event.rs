//! What the engine sends back for one request: a stream of token events, then one
//! `Finished` with the reason, token counts and the request's timings.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::{error::TryRecvError, UnboundedReceiver};

use crate::request::{Admitted, SloTargets};
use crate::stats::SloAttainment;

/// One event of a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token. `logprob` is `Some` only when the request asked for
    /// logprobs; `top_logprobs` holds the asked-for alternatives, best first.
    /// `time` is when the engine sampled it (inter-token latency = difference of
    /// consecutive times).
    Token {
        id: u32,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
        time: Instant,
    },
    /// Scores of prompt tokens (only when the request asked: `prompt_logprobs`),
    /// in prompt order from the second token on, sent as each prefill chunk
    /// comes back and all before the first `Token`.
    PromptLogprobs(Vec<PromptLogprob>),
    /// A pooled request's output (`Request::pooling`), sent once when its
    /// prompt is done, just before `Finished`: the pooled hidden state (not
    /// normalised), or the asked-for tokens' logits.
    Pooled(Vec<f32>),
    /// The last event of every stream.
    Finished(FinishInfo),
}

/// One prompt token's score under the model given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt token.
    pub id: u32,
    /// Its log-softmax of the raw logits.
    pub logprob: f32,
    /// 1 + how many tokens have a strictly larger logit (vLLM's `rank`).
    pub rank: u32,
    /// The asked-for best alternatives, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop or EOS token was generated (and emitted).
    Stop,
    /// `max_tokens` reached, or the model's context length, or (alone on the engine)
    /// the KV cache is exhausted.
    Length,
    /// The caller matched one of the request's stop strings in the detokenized text
    /// and ended the request with [`crate::EngineHandle::cancel`].
    StopString,
    /// The client dropped its stream.
    Cancelled,
    /// The request's deadline passed (the server's request timeout).
    TimedOut,
    /// The client stopped reading its stream for longer than the write timeout.
    ClientStalled,
    /// It could no longer start in time (an interactive request past its TTFT
    /// target times `ttft_reject_factor`, another interactive one past twice
    /// `max_queue_wait_s`; batch requests are never shed): shed from the queue
    /// under overload (the server answers 503 + `Retry-After`).
    Shed,
    /// Every request was ended at once ([`crate::EngineHandle::abort`], e.g. a forced
    /// shutdown).
    Aborted,
    /// The model runner failed (or the engine died).
    Error(String),
    /// The request's own constraint (its grammar) could not go on: past the grammar
    /// engine's limits while decoding, or it allowed no token. The client's fault,
    /// not the engine's (the server answers 400); no token drawn without the mask
    /// was sent before it.
    Constraint(String),
}

impl FinishReason {
    /// OpenAI's `finish_reason` (vLLM's for the failures, and its `finished_reason`
    /// metric label): "stop" (stop token or stop string), "length", "abort"
    /// (client disconnected or aborted), "error".
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled
            | FinishReason::Aborted
            | FinishReason::TimedOut
            | FinishReason::ClientStalled
            | FinishReason::Shed => "abort",
            FinishReason::Error(_) | FinishReason::Constraint(_) => "error",
        }
    }

    /// A distinct name per variant, for logs: "stop", "length", "stop_string",
    /// "client_disconnected", "aborted", "timeout", "client_stalled", "shed", "error",
    /// "constraint".
    pub fn label(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::StopString => "stop_string",
            FinishReason::Cancelled => "client_disconnected",
            FinishReason::Aborted => "aborted",
            FinishReason::TimedOut => "timeout",
            FinishReason::ClientStalled => "client_stalled",
            FinishReason::Shed => "shed",
            FinishReason::Error(_) => "error",
            FinishReason::Constraint(_) => "constraint",
        }
    }
}

/// Summary of a finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishInfo {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache at the request's first admission
    /// (OpenAI `usage.prompt_tokens_details.cached_tokens`).
    pub cached_prompt_tokens: usize,
    pub timings: RequestTimings,
    /// How the request did against its targets.
    pub slo: SloReport,
}

/// A finished request's latency targets and whether it met them (`None`: no
/// absolute target, or nothing to judge, e.g. TPOT of a one-token answer).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloReport {
    pub targets: SloTargets,
    pub ttft_met: Option<bool>,
    pub tpot_met: Option<bool>,
}

impl SloReport {
    /// Judges `timings` (with `completion_tokens` generated) against `targets`.
    pub fn judge(targets: &SloTargets, timings: &RequestTimings, completion_tokens: usize) -> Self {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        SloReport {
            targets: *targets,
            ttft_met: targets.ttft_ms.and_then(|t| Some(ms(timings.ttft()?) <= t)),
            tpot_met: targets
                .tpot_ms
                .and_then(|t| Some(ms(timings.mean_inter_token(completion_tokens)?) <= t)),
        }
    }

    /// Adds this report to the attainment counters.
    pub fn count_into(&self, c: &mut SloAttainment) {
        match self.ttft_met {
            Some(true) => c.ttft_met += 1,
            Some(false) => c.ttft_missed += 1,
            None => {}
        }
        match self.tpot_met {
            Some(true) => c.tpot_met += 1,
            Some(false) => c.tpot_missed += 1,
            None => {}
        }
    }

    /// The targets missed, for log lines: "" or e.g. "ttft,tpot".
    pub fn missed(&self) -> &'static str {
        match (self.ttft_met == Some(false), self.tpot_met == Some(false)) {
            (false, false) => "",
            (true, false) => "ttft",
            (false, true) => "tpot",
            (true, true) => "ttft,tpot",
        }
    }
}

/// A request's timeline on the engine's clock (`Instant`s), plus derived durations.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTimings {
    /// When `submit` accepted the request.
    pub arrival: Instant,
    /// First step that ran any of its tokens.
    pub first_scheduled: Option<Instant>,
    /// When its first token was sampled.
    pub first_token: Option<Instant>,
    /// When its latest token was sampled.
    pub last_token: Option<Instant>,
    /// When it finished (any reason).
    pub finish: Option<Instant>,
    /// Longest gap between two consecutive tokens.
    pub max_inter_token: Duration,
    /// Times it was preempted (its KV freed and recomputed later).
    pub preemptions: u32,
    /// Its share of the engine steps it ran in (each step's time split by tokens):
    /// the machine time it used, for pricing.
    pub engine_time: Duration,
}

fn since(later: Option<Instant>, earlier: Option<Instant>) -> Option<Duration> {
    Some(later?.saturating_duration_since(earlier?))
}

impl RequestTimings {
    pub fn new(arrival: Instant) -> Self {
        RequestTimings {
            arrival,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            finish: None,
            max_inter_token: Duration::ZERO,
            preemptions: 0,
            engine_time: Duration::ZERO,
        }
    }

    /// Arrival to first scheduled step.
    pub fn queue_time(&self) -> Option<Duration> {
        since(self.first_scheduled, Some(self.arrival))
    }
    /// Arrival to first token (TTFT).
    pub fn ttft(&self) -> Option<Duration> {
        since(self.first_token, Some(self.arrival))
    }
    /// First scheduled step to first token: the prompt's (possibly chunked) prefill.
    pub fn prefill_time(&self) -> Option<Duration> {
        since(self.first_token, self.first_scheduled)
    }
    /// First token to last token.
    pub fn decode_time(&self) -> Option<Duration> {
        since(self.last_token, self.first_token)
    }
    /// Arrival to finish (end-to-end latency).
    pub fn e2e(&self) -> Option<Duration> {
        since(self.finish, Some(self.arrival))
    }
    /// Mean inter-token latency (time per output token after the first).
    pub fn mean_inter_token(&self, completion_tokens: usize) -> Option<Duration> {
        if completion_tokens < 2 {
            return None;
        }
        Some(self.decode_time()? / (completion_tokens as u32 - 1))
    }

    /// Records a token sampled at `t`.
    pub fn on_token(&mut self, t: Instant) {
        match self.last_token {
            None => self.first_token = Some(t),
            Some(prev) => {
                self.max_inter_token = self.max_inter_token.max(t.saturating_duration_since(prev))
            }
        }
        self.last_token = Some(t);
    }
}

/// The receiving end of one request: token events, then `Finished`. Dropping it
/// cancels the request (the engine frees its KV blocks at its next step).
///
/// Works from async code (`recv().await`) and from sync code (`blocking_recv`, not
/// inside a tokio runtime).
#[derive(Debug)]
pub struct RequestStream {
    pub(crate) id: u64,
    pub(crate) admitted: Admitted,
    pub(crate) rx: UnboundedReceiver<Event>,
}

/// Everything a request produced, gathered by [`RequestStream::collect_blocking`].
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    /// One per token when logprobs were asked, else empty.
    pub logprobs: Vec<f32>,
    /// The prompt's scores when they were asked (`prompt_logprobs`), else empty.
    pub prompt_logprobs: Vec<PromptLogprob>,
    /// A pooled request's output (`Event::Pooled`).
    pub pooled: Option<Vec<f32>>,
    pub finish: FinishInfo,
}

impl RequestStream {
    /// The engine's id of this request (unique per engine).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// What the engine decided at submit: class, targets, `max_tokens`.
    pub fn admitted(&self) -> &Admitted {
        &self.admitted
    }
    /// Next event; `None` after `Finished` (or if the engine died).
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
    /// Blocking `recv` for sync code.
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        self.rx.try_recv()
    }
    /// The underlying channel (e.g. for `tokio_stream::wrappers::UnboundedReceiverStream`);
    /// dropping it still cancels the request.
    pub fn into_receiver(self) -> UnboundedReceiver<Event> {
        self.rx
    }

    /// Blocks until the request finishes and returns all its tokens. If the engine
    /// dies without a `Finished` event, the finish reason is `Error`.
    pub fn collect_blocking(mut self) -> Completion {
        let mut tokens = Vec::new();
        let mut logprobs = Vec::new();
        let mut prompt_logprobs = Vec::new();
        let mut pooled = None;
        while let Some(ev) = self.rx.blocking_recv() {
            match ev {
                Event::Token { id, logprob, .. } => {
                    tokens.push(id);
                    logprobs.extend(logprob);
                }
                Event::PromptLogprobs(scores) => prompt_logprobs.extend(scores),
                Event::Pooled(v) => pooled = Some(v),
                Event::Finished(finish) => {
                    return Completion {
                        tokens,
                        logprobs,
                        prompt_logprobs,
                        pooled,
                        finish,
                    };
                }
            }
        }
        let n = tokens.len();
        Completion {
            tokens,
            logprobs,
            prompt_logprobs,
            pooled,
            finish: FinishInfo {
                reason: FinishReason::Error("engine stopped without finishing the request".into()),
                prompt_tokens: 0,
                completion_tokens: n,
                cached_prompt_tokens: 0,
                timings: RequestTimings::new(Instant::now()),
                slo: SloReport::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_derive_durations() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = RequestTimings::new(t0);
        assert_eq!(t.ttft(), None);
        t.first_scheduled = Some(t0 + ms(5));
        t.on_token(t0 + ms(20));
        t.on_token(t0 + ms(30));
        t.on_token(t0 + ms(45));
        t.finish = Some(t0 + ms(46));
        assert_eq!(t.queue_time(), Some(ms(5)));
        assert_eq!(t.ttft(), Some(ms(20)));
        assert_eq!(t.prefill_time(), Some(ms(15)));
        assert_eq!(t.decode_time(), Some(ms(25)));
        assert_eq!(t.e2e(), Some(ms(46)));
        assert_eq!(t.max_inter_token, ms(15));
        assert_eq!(t.mean_inter_token(3), Some(Duration::from_micros(12500)));
    }
}
