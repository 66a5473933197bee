//! What both generation endpoints share after parsing: submitting the request and
//! answering with one JSON response or a Server-Sent Events stream
//! (`data: {json}\n\n` chunks, optional usage chunk, `data: [DONE]`), in the
//! completions or the chat shape.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sloserve_api::{
    ApiError, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatTokenLogprob, CompletionChoice, CompletionChunk, CompletionLogprobs,
    CompletionResponse, GenParams, ResponseMessage, TopLogprob, TopLogprobsMap, Usage,
};

use crate::error::{api_response, ServerError};
use crate::state::{unix_now, AppState};
use crate::stream::{Delta, Generation, TokenLogprob};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// Validates against the context, submits to the engine and answers.
pub async fn generate(
    state: Arc<AppState>,
    headers: &HeaderMap,
    prompt: Vec<u32>,
    params: GenParams,
    kind: Kind,
) -> Result<Response, ServerError> {
    let prompt_param = match kind {
        Kind::Completion => "prompt",
        Kind::Chat => "messages",
    };
    let prompt_len = prompt.len();
    let req = state.build_request(prompt, &params, headers)?;
    state.check_accepting()?;
    let stream = state
        .engine
        .submit(req)
        .map_err(|e| ServerError::engine(e, prompt_param))?;
    let class = stream.admitted().class;
    let id = state.new_id(match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    });
    let gen = Generation::new(
        &state,
        id,
        stream,
        class,
        prompt_len,
        params.stop.clone(),
        params.logprobs.is_some(),
    );
    let out = Out {
        kind,
        created: unix_now(),
        model: state.model_name.clone(),
    };
    if params.stream {
        Ok(sse_response(gen, out, params.include_usage))
    } else {
        Ok(collect(gen, out).await)
    }
}

/// Shapes chunks and responses of one request.
struct Out {
    kind: Kind,
    created: u64,
    model: String,
}

fn completion_logprobs(gen: &Generation, lps: &[TokenLogprob]) -> CompletionLogprobs {
    CompletionLogprobs {
        tokens: lps.iter().map(|t| gen.token_text(t.id)).collect(),
        token_logprobs: lps.iter().map(|t| t.logprob).collect(),
        top_logprobs: lps
            .iter()
            .map(|t| {
                TopLogprobsMap(
                    t.top
                        .iter()
                        .map(|&(id, lp)| (gen.token_text(id), lp))
                        .collect(),
                )
            })
            .collect(),
        text_offset: lps.iter().map(|t| t.offset).collect(),
    }
}

fn chat_logprobs(gen: &Generation, lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|t| ChatTokenLogprob {
                token: gen.token_text(t.id),
                logprob: t.logprob,
                bytes: gen.token_bytes(t.id),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|&(id, lp)| TopLogprob {
                        token: gen.token_text(id),
                        logprob: lp,
                        bytes: gen.token_bytes(id),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn failure(gen: &Generation) -> ApiError {
    let msg = gen
        .error
        .clone()
        .unwrap_or_else(|| "generation failed".into());
    if gen.finish_reason == Some("cancelled") {
        ApiError::unavailable(msg)
    } else {
        ApiError::internal(msg)
    }
}

async fn collect(mut gen: Generation, out: Out) -> Response {
    let mut text = String::new();
    let mut lps = Vec::new();
    let want_lp = gen.wants_logprobs();
    while let Some(Delta { text: t, logprobs }) = gen.next().await {
        text.push_str(&t);
        lps.extend(logprobs);
    }
    if gen.failed() {
        return api_response(&failure(&gen), None);
    }
    let usage = gen.usage();
    let finish_reason = gen.finish_reason.map(str::to_string);
    let body = match out.kind {
        Kind::Completion => serde_json::to_string(&CompletionResponse {
            id: gen.id.clone(),
            object: "text_completion".into(),
            created: out.created,
            model: out.model,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: want_lp.then(|| completion_logprobs(&gen, &lps)),
                finish_reason,
            }],
            usage,
        }),
        Kind::Chat => serde_json::to_string(&ChatCompletionResponse {
            id: gen.id.clone(),
            object: "chat.completion".into(),
            created: out.created,
            model: out.model,
            choices: vec![ChatChoice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant".into(),
                    content: Some(text),
                },
                logprobs: want_lp.then(|| chat_logprobs(&gen, &lps)),
                finish_reason,
            }],
            usage,
        }),
    };
    match body {
        Ok(b) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            b,
        )
            .into_response(),
        Err(e) => api_response(&ApiError::internal(format!("cannot serialize: {e}")), None),
    }
}

impl Out {
    /// One chunk: text (or a chat role / finish), its logprobs, finish reason, usage.
    fn chunk(
        &self,
        gen: &Generation,
        delta: Option<Delta>,
        role: bool,
        finish: Option<&str>,
        usage: Option<Usage>,
    ) -> String {
        let no_choice = usage.is_some();
        let (text, lps) = match delta {
            Some(d) => (Some(d.text), Some(d.logprobs)),
            None => (None, None),
        };
        let lp_present = gen.wants_logprobs() && lps.as_ref().is_some_and(|l| !l.is_empty());
        let json = match self.kind {
            Kind::Completion => serde_json::to_string(&CompletionChunk {
                id: gen.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: if no_choice {
                    Vec::new()
                } else {
                    vec![CompletionChoice {
                        index: 0,
                        text: text.unwrap_or_default(),
                        logprobs: lp_present
                            .then(|| completion_logprobs(gen, lps.as_deref().unwrap_or(&[]))),
                        finish_reason: finish.map(str::to_string),
                    }]
                },
                usage,
            }),
            Kind::Chat => serde_json::to_string(&ChatCompletionChunk {
                id: gen.id.clone(),
                object: "chat.completion.chunk".into(),
                created: self.created,
                model: self.model.clone(),
                choices: if no_choice {
                    Vec::new()
                } else {
                    vec![ChatChunkChoice {
                        index: 0,
                        delta: ChatDelta {
                            role: role.then(|| "assistant".to_string()),
                            content: if role { Some(String::new()) } else { text },
                        },
                        logprobs: lp_present
                            .then(|| chat_logprobs(gen, lps.as_deref().unwrap_or(&[]))),
                        finish_reason: finish.map(str::to_string),
                    }]
                },
                usage,
            }),
        };
        format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
    }
}

enum Phase {
    Role,
    Tokens,
    Usage,
    Done,
    End,
}

struct SseState {
    gen: Generation,
    out: Out,
    phase: Phase,
    include_usage: bool,
}

/// The streaming response. The body stream owns the `Generation` (and so the
/// engine's `RequestStream`): when the client disconnects, hyper drops the body and
/// the request is cancelled.
fn sse_response(gen: Generation, out: Out, include_usage: bool) -> Response {
    let phase = match out.kind {
        Kind::Chat => Phase::Role,
        Kind::Completion => Phase::Tokens,
    };
    let st = SseState {
        gen,
        out,
        phase,
        include_usage,
    };
    let stream = futures_util::stream::unfold(st, |mut s| async move {
        let frame = match s.phase {
            Phase::Role => {
                s.phase = Phase::Tokens;
                s.out.chunk(&s.gen, None, true, None, None)
            }
            Phase::Tokens => match s.gen.next().await {
                Some(d) => s.out.chunk(&s.gen, Some(d), false, None, None),
                None if s.gen.failed() => {
                    s.phase = Phase::Done;
                    format!("data: {}\n\n", failure(&s.gen).to_json())
                }
                None => {
                    s.phase = if s.include_usage {
                        Phase::Usage
                    } else {
                        Phase::Done
                    };
                    let reason = s.gen.finish_reason;
                    // Completions end with empty text; chat with an empty delta `{}`.
                    let d = (s.out.kind == Kind::Completion).then(Delta::default);
                    s.out.chunk(&s.gen, d, false, reason, None)
                }
            },
            Phase::Usage => {
                s.phase = Phase::Done;
                let usage = s.gen.usage();
                s.out.chunk(&s.gen, None, false, None, Some(usage))
            }
            Phase::Done => {
                s.phase = Phase::End;
                "data: [DONE]\n\n".to_string()
            }
            Phase::End => return None,
        };
        Some((Ok::<Bytes, Infallible>(Bytes::from(frame)), s))
    });
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
