//! `EngineError`: every way the engine refuses or fails a request at submit time.

use crate::request::SloClass;

/// Why [`crate::EngineHandle::submit`] (or [`crate::Engine::start`]) refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The waiting queue of `class` is full, or the request's predicted TTFT exceeds
    /// its SLO: HTTP 429 / 503 with `Retry-After: retry_after_s`.
    #[error("engine overloaded for {class} requests; retry after {retry_after_s} s")]
    Overloaded { class: SloClass, retry_after_s: u64 },
    /// The prompt alone does not fit: `len` tokens, at most `max` (the model's context
    /// length minus one, or the whole KV pool, whichever is smaller).
    #[error("prompt too long: {len} tokens, at most {max}")]
    PromptTooLong { len: usize, max: usize },
    /// The engine was shut down (or its thread died); no new requests are accepted.
    #[error("engine stopped")]
    EngineStopped,
    /// A malformed request (empty prompt, max_tokens 0, prompt + max_tokens over the
    /// context length, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The configuration cannot run (given at `Engine::start`).
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
}
