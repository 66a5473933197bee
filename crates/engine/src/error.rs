//! `EngineError`: every way the engine refuses or fails a request at submit time,
//! as structured variants (the server maps each to an HTTP status once).

use crate::request::SloClass;

/// Why [`crate::EngineHandle::submit`] (or [`crate::Engine::start`]) refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The waiting queue of `class` is full (requests or prompt tokens): HTTP 429
    /// with `Retry-After: retry_after_s`.
    #[error("the {class} waiting queue is full; retry after {retry_after_s} s")]
    QueueFull { class: SloClass, retry_after_s: u64 },
    /// An interactive request predicted to wait `predicted_s` before it starts
    /// (the requests ahead of it at its class's measured drain rate), more than
    /// `max_queue_wait_s`: HTTP 429. Never sent for batch requests (they queue).
    #[error(
        "the {class} queue is predicted to take {predicted_s:.0} s to reach this request; retry after {retry_after_s} s"
    )]
    QueueWaitTooLong {
        class: SloClass,
        predicted_s: f64,
        retry_after_s: u64,
    },
    /// An interactive request whose predicted TTFT (`predicted_ms`: its queue
    /// wait, its own prefill and one step) exceeds its target times
    /// `ttft_reject_factor`: HTTP 429.
    #[error(
        "predicted time to first token {predicted_ms:.0} ms exceeds the target {target_ms:.0} ms; retry after {retry_after_s} s"
    )]
    TtftUnreachable {
        predicted_ms: f64,
        target_ms: f64,
        retry_after_s: u64,
    },
    /// A batch request predicted to wait `predicted_s` before it starts, past the
    /// deadline the client set itself (`deadline_s`, `Request::deadline`): HTTP 429.
    #[error(
        "the {class} queue is predicted to take {predicted_s:.0} s to reach this request, past its own deadline of {deadline_s:.1} s; retry after {retry_after_s} s"
    )]
    DeadlineUnreachable {
        class: SloClass,
        predicted_s: f64,
        deadline_s: f64,
        retry_after_s: u64,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt alone does not fit: `len` tokens, at most `max` (the model's
    /// context length minus one, or the whole KV pool, whichever is smaller).
    #[error("prompt too long: {len} tokens, at most {max}")]
    PromptTooLong { len: usize, max: usize },
    /// The prompt fits but prompt + `max_tokens` does not: `room` tokens are left
    /// for the completion in a context of `max_model_len`.
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds the context length ({max_model_len}); {room} tokens are left for the completion"
    )]
    ContextLengthExceeded {
        prompt: usize,
        max_tokens: usize,
        max_model_len: usize,
        room: usize,
    },
    /// A generation request to an encoder (`RunnerInfo::encoder`): it only pools.
    #[error("this model is an encoder: it serves /v1/embeddings, /v1/rerank and /score (pooled requests), not generation")]
    PooledOnly,
    /// `max_tokens` was 0.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// A prompt token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocab { id: u32, vocab_size: usize },
    /// A latency target that is not a positive number of milliseconds.
    #[error("{field} must be a positive number of milliseconds")]
    InvalidTarget { field: &'static str },
    /// The engine was shut down (or its thread died); no new requests are accepted.
    #[error("engine stopped")]
    EngineStopped,
    /// The configuration cannot run (given at `Engine::start`).
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
}

impl EngineError {
    /// Seconds a client should wait before retrying, for refusals that are
    /// temporary.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            EngineError::QueueFull { retry_after_s, .. }
            | EngineError::QueueWaitTooLong { retry_after_s, .. }
            | EngineError::DeadlineUnreachable { retry_after_s, .. }
            | EngineError::TtftUnreachable { retry_after_s, .. } => Some(*retry_after_s),
            EngineError::EngineStopped => Some(1),
            _ => None,
        }
    }
}
