//! `ServerError` and the ONE mapping from every error (API validation, engine
//! refusals, tokenizer and template failures, draining) to an HTTP status and
//! OpenAI's error body.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sloserve_api::ApiError;
use sloserve_engine::EngineError;
use sloserve_slo::headers::{ErrorOrigin, ERROR_ORIGIN};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Parsing or validation of the request.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The engine refused the request; `prompt_param` is the field holding the
    /// prompt ("prompt" or "messages").
    #[error("{source}")]
    Engine {
        source: EngineError,
        prompt_param: &'static str,
    },
    /// A prompt text too long in bytes to fit the context however it tokenizes
    /// (decided before tokenizing: [`crate::prompt_bound`]).
    #[error("the prompt is {bytes} bytes, at least {min_tokens} tokens; at most {max} fit")]
    PromptTooManyBytes {
        bytes: usize,
        min_tokens: usize,
        max_token_bytes: usize,
        max: usize,
        prompt_param: &'static str,
    },
    /// The body exceeds the limit.
    #[error("request body too large")]
    BodyTooLarge { limit: usize },
    /// The body could not be read.
    #[error("cannot read the request body: {0}")]
    Body(String),
    /// The model's chat template failed on these messages.
    #[error("chat template: {0}")]
    Template(String),
    /// Past the in-flight request limit.
    #[error("too many requests in flight (limit {max}); retry later")]
    InflightLimit { max: usize },
    /// A request's `n` choices (each counts as a request in flight) would pass
    /// the in-flight limit: 429 + `Retry-After`, before any choice runs.
    #[error(
        "the request's {n} choices would pass the limit of {max} requests in flight; retry later"
    )]
    ChoicesInflight { n: usize, max: usize },
    /// The server is draining (shutting down).
    #[error("the server is shutting down")]
    Draining,
    /// The engine aborted the request mid-generation (forced shutdown).
    #[error("the request was cancelled (server shutting down)")]
    Aborted,
    /// The engine failed while running the request (its log has the details;
    /// the client gets a generic message).
    #[error("engine failure: {0}")]
    EngineFailure(String),
    /// The request's own constraint (`param`: `response_format` or `tools`) could
    /// not go on while decoding (past the grammar engine's limits, or no token
    /// allowed): the client's fault, a 400 (an error event on a started stream).
    #[error("{param}: the constraint failed while decoding: {message}")]
    ConstraintFailed {
        param: &'static str,
        message: String,
    },
    /// Every grammar compile worker is busy and their queue is full (429 with
    /// `Retry-After`: load, not the client's constraint).
    #[error("the grammar compiler is busy: {0}")]
    GrammarBusy(String),
    /// The engine shed the request: it waited too long in the queue to start.
    #[error("the server is overloaded: the request waited too long to start")]
    Shed,
    /// The request's deadline (`--request-timeout` / `x-request-timeout-ms`) passed.
    #[error("the request timed out after {ms} ms")]
    TimedOut { ms: u64 },
    #[error("internal error: {0}")]
    Internal(String),
}

/// `Retry-After` for a request shed from the queue (the queue was overloaded for
/// far longer than a second).
const SHED_RETRY_AFTER_S: u64 = 5;

impl From<EngineError> for ServerError {
    fn from(source: EngineError) -> Self {
        ServerError::Engine {
            source,
            prompt_param: "prompt",
        }
    }
}

impl ServerError {
    pub fn engine(source: EngineError, prompt_param: &'static str) -> Self {
        ServerError::Engine {
            source,
            prompt_param,
        }
    }

    pub fn from_body_rejection(r: BytesRejection, limit: usize) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ServerError::BodyTooLarge { limit }
        } else {
            ServerError::Body(r.body_text())
        }
    }

    /// Why a request was refused or shed for load or state (the
    /// `x-sloserve-shed-reason` header the gateway reads); `None` for the client's
    /// own errors and internal failures.
    pub fn shed_reason(&self) -> Option<&'static str> {
        match self {
            ServerError::Draining => Some("draining"),
            ServerError::Shed => Some("shed"),
            ServerError::GrammarBusy(_) => Some("grammar-busy"),
            ServerError::Engine { source, .. } => match source {
                EngineError::QueueFull { .. } => Some("queue-full"),
                EngineError::QueueWaitTooLong { .. } => Some("queue-wait"),
                EngineError::DeadlineUnreachable { .. } => Some("deadline"),
                EngineError::TtftUnreachable { .. } => Some("ttft"),
                EngineError::EngineStopped => Some("stopped"),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whose failure this is (the `x-sloserve-error-origin` header a router reads):
    /// a client error is the request's, an overload or a drain is load, an
    /// internal failure or a stopped engine is the replica's.
    pub fn origin(&self) -> ErrorOrigin {
        match self {
            ServerError::Engine {
                source: EngineError::EngineStopped | EngineError::InvalidConfig(_),
                ..
            }
            | ServerError::EngineFailure(_)
            | ServerError::Internal(_) => ErrorOrigin::Replica,
            ServerError::Draining | ServerError::Shed | ServerError::Aborted => ErrorOrigin::Load,
            e => ErrorOrigin::of_status(e.to_api().0.status),
        }
    }

    /// The client's view of this error, and the `Retry-After` seconds if any.
    pub fn to_api(&self) -> (ApiError, Option<u64>) {
        match self {
            ServerError::Api(e) => (e.clone(), None),
            ServerError::BodyTooLarge { limit } => (ApiError::too_large(*limit), None),
            ServerError::PromptTooManyBytes {
                bytes,
                min_tokens,
                max_token_bytes,
                max,
                prompt_param,
            } => (
                ApiError::invalid(
                    *prompt_param,
                    format!(
                        "{prompt_param}: the prompt is {bytes} bytes long, so at least {min_tokens} tokens (no token of this model is over {max_token_bytes} bytes), but at most {max} fit this model's context"
                    ),
                )
                .with_code("context_length_exceeded"),
                None,
            ),
            ServerError::Body(m) => (ApiError::bad_request(m.clone()), None),
            ServerError::Template(m) => (
                ApiError::invalid(
                    "messages",
                    format!("messages: cannot apply the chat template: {m}"),
                ),
                None,
            ),
            ServerError::Draining => (
                ApiError::unavailable("the server is shutting down and accepts no new requests"),
                Some(1),
            ),
            ServerError::Aborted => (ApiError::unavailable(self.to_string()), None),
            ServerError::InflightLimit { .. } => (ApiError::unavailable(self.to_string()), Some(1)),
            ServerError::ChoicesInflight { .. } => {
                (ApiError::overloaded(self.to_string()), Some(1))
            }
            ServerError::Internal(m) => (ApiError::internal(m.clone()), None),
            ServerError::EngineFailure(_) => (
                ApiError::internal("the server had an internal error while processing the request"),
                None,
            ),
            ServerError::TimedOut { .. } => (ApiError::timed_out(self.to_string()), None),
            ServerError::GrammarBusy(_) => (ApiError::overloaded(self.to_string()), Some(1)),
            ServerError::ConstraintFailed { param, .. } => (
                ApiError::invalid(*param, self.to_string()).with_code("constraint_failed"),
                None,
            ),
            ServerError::Shed => (
                ApiError::unavailable(self.to_string()),
                Some(SHED_RETRY_AFTER_S),
            ),
            ServerError::Engine {
                source,
                prompt_param,
            } => (engine_error(source, prompt_param), source.retry_after_s()),
        }
    }
}

/// The client's view of an engine refusal; `prompt_param` names the field that
/// holds the prompt ("prompt" or "messages").
fn engine_error(e: &EngineError, prompt_param: &str) -> ApiError {
    let context = "context_length_exceeded";
    match e {
        EngineError::QueueFull { class, retry_after_s } => ApiError::overloaded(format!(
            "the server is overloaded for {class} requests (waiting queue full); retry after {retry_after_s} s"
        )),
        EngineError::QueueWaitTooLong {
            class,
            predicted_s,
            retry_after_s,
        } => ApiError::overloaded(format!(
            "the server is overloaded for {class} requests: this request would wait about {predicted_s:.0} s to start; retry after {retry_after_s} s"
        )),
        EngineError::DeadlineUnreachable {
            class,
            predicted_s,
            deadline_s,
            retry_after_s,
        } => ApiError::overloaded(format!(
            "the server is overloaded for {class} requests: this request would wait about {predicted_s:.0} s to start, past its own deadline ({deadline_s:.1} s, x-request-timeout-ms); retry after {retry_after_s} s"
        )),
        EngineError::TtftUnreachable {
            predicted_ms,
            target_ms,
            retry_after_s,
        } => ApiError::overloaded(format!(
            "the server is overloaded: the predicted time to first token ({predicted_ms:.0} ms) is far over the target ({target_ms:.0} ms); retry after {retry_after_s} s"
        )),
        EngineError::EmptyPrompt => {
            ApiError::invalid(prompt_param, format!("{prompt_param}: the prompt is empty"))
        }
        EngineError::PooledOnly => ApiError::invalid("model", e.to_string()),
        EngineError::PromptTooLong { len, max } => ApiError::invalid(
            prompt_param,
            format!(
                "{prompt_param}: the prompt is {len} tokens long, but at most {max} fit this model's context"
            ),
        )
        .with_code(context),
        EngineError::ContextLengthExceeded {
            prompt,
            max_tokens,
            max_model_len,
            ..
        } => ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens: this model's maximum context length is {max_model_len} tokens, but {} were requested ({prompt} in the prompt, {max_tokens} for the completion); reduce the prompt or max_tokens",
                prompt + max_tokens
            ),
        )
        .with_code(context),
        EngineError::ZeroMaxTokens => ApiError::invalid("max_tokens", e.to_string()),
        EngineError::TokenOutOfVocab { id, vocab_size } => ApiError::invalid(
            prompt_param,
            format!("{prompt_param}: token id {id} is outside the vocabulary (size {vocab_size})"),
        ),
        EngineError::InvalidTarget { field } => ApiError::invalid(*field, e.to_string()),
        EngineError::EngineStopped => {
            ApiError::unavailable("the engine has stopped and accepts no new requests")
        }
        EngineError::InvalidConfig(m) => ApiError::internal(m.clone()),
    }
}

/// An OpenAI-shaped error response, its origin the status's
/// ([`ErrorOrigin::of_status`]; [`ServerError`] sets its own).
pub fn api_response(e: &ApiError, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        e.to_json(),
    )
        .into_response();
    if let Some(s) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    set_origin(&mut resp, ErrorOrigin::of_status(e.status));
    resp
}

fn set_origin(resp: &mut Response, origin: ErrorOrigin) {
    resp.headers_mut()
        .insert(ERROR_ORIGIN, HeaderValue::from_static(origin.as_str()));
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let (e, retry) = self.to_api();
        if e.status >= 500 && e.status != 503 {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(status = e.status, error = %e.message, "request refused");
        }
        let mut resp = api_response(&e, retry);
        set_origin(&mut resp, self.origin());
        if let Some(why) = self.shed_reason() {
            resp.headers_mut().insert(
                sloserve_slo::headers::SHED_REASON,
                HeaderValue::from_static(why),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sloserve_engine::SloClass;

    #[test]
    fn a_failed_constraint_is_the_client_s_400_and_busy_grammar_a_429() {
        let e = ServerError::ConstraintFailed {
            param: "tools",
            message: "lexer fuel exhausted".into(),
        };
        let (api, retry) = e.to_api();
        assert_eq!(
            (api.status, api.kind, retry),
            (400, "invalid_request_error", None)
        );
        assert_eq!(api.param.as_deref(), Some("tools"));
        assert_eq!(api.code.as_deref(), Some("constraint_failed"));
        assert!(
            api.message.contains("lexer fuel exhausted"),
            "{}",
            api.message
        );
        let (api, retry) = ServerError::GrammarBusy("2 running".into()).to_api();
        assert_eq!((api.status, retry), (429, Some(1)));
        assert_eq!(
            ServerError::GrammarBusy(String::new()).shed_reason(),
            Some("grammar-busy")
        );
    }

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (
                EngineError::QueueFull {
                    class: SloClass::Batch,
                    retry_after_s: 3,
                },
                429,
                Some(3),
            ),
            (
                EngineError::QueueWaitTooLong {
                    class: SloClass::Interactive,
                    predicted_s: 75.0,
                    retry_after_s: 60,
                },
                429,
                Some(60),
            ),
            (
                EngineError::DeadlineUnreachable {
                    class: SloClass::Batch,
                    predicted_s: 75.0,
                    deadline_s: 30.0,
                    retry_after_s: 60,
                },
                429,
                Some(60),
            ),
            (
                EngineError::TtftUnreachable {
                    predicted_ms: 900.0,
                    target_ms: 100.0,
                    retry_after_s: 2,
                },
                429,
                Some(2),
            ),
            (EngineError::PromptTooLong { len: 9, max: 5 }, 400, None),
            (
                EngineError::ContextLengthExceeded {
                    prompt: 4,
                    max_tokens: 9,
                    max_model_len: 10,
                    room: 6,
                },
                400,
                None,
            ),
            (EngineError::EmptyPrompt, 400, None),
            (EngineError::PooledOnly, 400, None),
            (EngineError::ZeroMaxTokens, 400, None),
            (
                EngineError::TokenOutOfVocab {
                    id: 7,
                    vocab_size: 5,
                },
                400,
                None,
            ),
            (
                EngineError::InvalidTarget {
                    field: "tpot_slo_ms",
                },
                400,
                None,
            ),
            (EngineError::EngineStopped, 503, Some(1)),
            (EngineError::InvalidConfig("x".into()), 500, None),
        ];
        for (err, status, retry) in cases {
            let (api, r) = ServerError::engine(err, "messages").to_api();
            assert_eq!((api.status, r), (status, retry));
        }
        let (api, _) =
            ServerError::engine(EngineError::PromptTooLong { len: 9, max: 5 }, "messages").to_api();
        assert_eq!(api.param.as_deref(), Some("messages"));
        assert_eq!(api.code.as_deref(), Some("context_length_exceeded"));
        let (api, _) = ServerError::engine(
            EngineError::ContextLengthExceeded {
                prompt: 4,
                max_tokens: 9,
                max_model_len: 10,
                room: 6,
            },
            "prompt",
        )
        .to_api();
        assert_eq!(api.param.as_deref(), Some("max_tokens"));
        assert_eq!(api.code.as_deref(), Some("context_length_exceeded"));
        let resp = ServerError::from(EngineError::QueueFull {
            class: SloClass::Interactive,
            retry_after_s: 2,
        })
        .into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            resp.headers()[sloserve_slo::headers::SHED_REASON],
            "queue-full"
        );
        assert_eq!(
            ServerError::Draining.into_response().headers()[sloserve_slo::headers::SHED_REASON],
            "draining"
        );
        let client_error = ServerError::engine(EngineError::EmptyPrompt, "prompt").into_response();
        assert!(client_error
            .headers()
            .get(sloserve_slo::headers::SHED_REASON)
            .is_none());
    }

    #[test]
    fn errors_say_whose_failure_they_are() {
        let origin = |e: ServerError| {
            let r = e.into_response();
            r.headers()[ERROR_ORIGIN].to_str().unwrap().to_owned()
        };
        assert_eq!(
            origin(ServerError::engine(EngineError::EmptyPrompt, "prompt")),
            "request"
        );
        assert_eq!(origin(ServerError::TimedOut { ms: 5 }), "request");
        assert_eq!(origin(ServerError::Template("x".into())), "request");
        assert_eq!(origin(ServerError::EngineFailure("x".into())), "replica");
        assert_eq!(origin(ServerError::Internal("x".into())), "replica");
        assert_eq!(origin(EngineError::EngineStopped.into()), "replica");
        assert_eq!(origin(ServerError::Shed), "load");
        assert_eq!(origin(ServerError::Draining), "load");
        let queue_full = EngineError::QueueFull {
            class: SloClass::Batch,
            retry_after_s: 1,
        };
        assert_eq!(origin(queue_full.into()), "load");
        let limit = api_response(&ApiError::unavailable("busy"), Some(1));
        assert_eq!(limit.headers()[ERROR_ORIGIN], "load");
        let bad = api_response(&ApiError::bad_request("x"), None);
        assert_eq!(bad.headers()[ERROR_ORIGIN], "request");
    }
}
