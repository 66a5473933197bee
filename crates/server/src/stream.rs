//! The Server-Sent Events answer of a generation: `data: {json}\n\n` chunks (chat
//! first sends the assistant role), the finish chunk, an optional usage chunk, then
//! `data: [DONE]`; an engine failure mid-stream becomes an error event. With tools,
//! the text goes through the tool-call parser: content deltas never hold part of a
//! `<tool_call>` tag, each call is a delta with its index, id and name, then one with
//! its arguments. Frames go through a bounded channel; a reader stalled past the
//! write timeout is cancelled.

use std::collections::VecDeque;

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sloserve_api::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChoice, CompletionChunk, Usage,
};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendTimeoutError;

use crate::error::ServerError;
use crate::generate::{wire_finish_reason, Kind, Out};
use crate::generation::logprobs::{chat_logprobs, completion_logprobs, TokenLogprob};
use crate::generation::{Delta, Generation};
use crate::tools::ToolOutput;

/// One chunk: text (or a chat role / finish), its logprobs, finish reason, usage.
fn chunk(
    out: &Out,
    gen: &Generation,
    delta: Option<Delta>,
    role: bool,
    finish: Option<String>,
    usage: Option<Usage>,
) -> String {
    let no_choice = usage.is_some();
    let (text, lps) = match delta {
        Some(d) => (Some(d.text), Some(d.logprobs)),
        None => (None, None),
    };
    let lp_present = gen.wants_logprobs() && lps.as_ref().is_some_and(|l| !l.is_empty());
    let json = match out.kind {
        Kind::Completion => serde_json::to_string(&CompletionChunk {
            id: gen.id().to_string(),
            object: "text_completion".into(),
            created: out.created,
            model: out.model.clone(),
            choices: if no_choice {
                Vec::new()
            } else {
                vec![CompletionChoice {
                    index: 0,
                    text: text.unwrap_or_default(),
                    logprobs: lp_present.then(|| {
                        completion_logprobs(gen.tokenizer(), lps.as_deref().unwrap_or(&[]))
                    }),
                    finish_reason: finish,
                }]
            },
            usage,
        }),
        Kind::Chat => {
            let delta = ChatDelta {
                role: role.then(|| "assistant".to_string()),
                content: if role { Some(String::new()) } else { text },
                tool_calls: None,
            };
            let lps = lps.filter(|_| lp_present);
            return chat_chunk(out, gen, delta, lps.as_deref(), finish, usage);
        }
    };
    format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
}

/// One chat chunk: a delta (role, content, tool calls), its logprobs, finish
/// reason, or usage (then no choice).
fn chat_chunk(
    out: &Out,
    gen: &Generation,
    delta: ChatDelta,
    lps: Option<&[TokenLogprob]>,
    finish: Option<String>,
    usage: Option<Usage>,
) -> String {
    let json = serde_json::to_string(&ChatCompletionChunk {
        id: gen.id().to_string(),
        object: "chat.completion.chunk".into(),
        created: out.created,
        model: out.model.clone(),
        choices: if usage.is_some() {
            Vec::new()
        } else {
            vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs: lps.map(|l| chat_logprobs(gen.tokenizer(), l)),
                finish_reason: finish,
            }]
        },
        usage,
    });
    format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
}

/// The frames of one output with tools: its content and call deltas (the
/// delta's logprobs go with the first; alone if it released nothing).
fn tool_frames(s: &mut SseState, d: Option<Delta>) -> Vec<String> {
    let (text, lps) = match d {
        Some(d) => (Some(d.text), d.logprobs),
        None => (None, Vec::new()),
    };
    let Some(tools) = s.tools.as_mut() else {
        return Vec::new();
    };
    let mut deltas = tools.deltas(text.as_deref());
    let lps = (s.gen.wants_logprobs() && !lps.is_empty()).then_some(lps);
    if deltas.is_empty() && lps.is_some() {
        deltas.push(ChatDelta {
            content: Some(String::new()),
            ..ChatDelta::default()
        });
    }
    let mut lps = lps;
    deltas
        .into_iter()
        .map(|delta| chat_chunk(&s.out, &s.gen, delta, lps.take().as_deref(), None, None))
        .collect()
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
    /// The first output, taken before the status line was sent.
    first: Option<Delta>,
    out: Out,
    phase: Phase,
    include_usage: bool,
    /// The tool-call parser, when the request has tools.
    tools: Option<ToolOutput>,
    /// Frames made, not yet sent (one output can make several).
    pending: VecDeque<String>,
}

/// Frames produced ahead of what the connection has taken.
const FRAME_BUFFER: usize = 8;

/// The next output: the one taken before the status line, then the stream's.
async fn next_delta(s: &mut SseState) -> Option<Delta> {
    match s.first.take() {
        Some(d) => Some(d),
        None => s.gen.next().await,
    }
}

/// The next SSE frame, `None` after `[DONE]`.
async fn next_frame(s: &mut SseState) -> Option<String> {
    loop {
        if let Some(f) = s.pending.pop_front() {
            return Some(f);
        }
        return Some(match s.phase {
            Phase::Role => {
                s.phase = Phase::Tokens;
                chunk(&s.out, &s.gen, None, true, None, None)
            }
            Phase::Tokens => match next_delta(s).await {
                Some(d) if s.tools.is_some() => {
                    let frames = tool_frames(s, Some(d));
                    s.pending.extend(frames);
                    continue;
                }
                Some(d) => chunk(&s.out, &s.gen, Some(d), false, None, None),
                None => match s.gen.failure() {
                    Some(e) => {
                        s.phase = Phase::Done;
                        format!("data: {}\n\n", e.to_api().0.to_json())
                    }
                    None => {
                        s.phase = if s.include_usage {
                            Phase::Usage
                        } else {
                            Phase::Done
                        };
                        let mut reason = wire_finish_reason(&s.gen);
                        let frames = tool_frames(s, None);
                        s.pending.extend(frames);
                        if let Some(t) = &s.tools {
                            reason = crate::tools::finish_reason(reason, t.calls());
                        }
                        // Completions end with empty text; chat with an empty delta `{}`.
                        let d = (s.out.kind == Kind::Completion).then(Delta::default);
                        s.pending
                            .push_back(chunk(&s.out, &s.gen, d, false, reason, None));
                        continue;
                    }
                },
            },
            Phase::Usage => {
                s.phase = Phase::Done;
                let usage = s.gen.usage();
                chunk(&s.out, &s.gen, None, false, None, Some(usage))
            }
            Phase::Done => {
                s.phase = Phase::End;
                "data: [DONE]\n\n".to_string()
            }
            Phase::End => return None,
        });
    }
}

/// Produces the frames into the body's bounded channel. A client that takes none
/// for `write_timeout` is stalled: the request is cancelled (`client_stalled`);
/// one that went away (the body was dropped) cancels it too.
async fn produce(mut s: SseState, tx: mpsc::Sender<Bytes>, write_timeout: Option<Duration>) {
    loop {
        let frame = tokio::select! {
            f = next_frame(&mut s) => f,
            _ = tx.closed() => None,
        };
        let Some(frame) = frame else { break };
        let frame = Bytes::from(frame);
        let sent = match write_timeout {
            Some(t) => tx.send_timeout(frame, t).await.map_err(|e| match e {
                SendTimeoutError::Timeout(_) => true,
                SendTimeoutError::Closed(_) => false,
            }),
            None => tx.send(frame).await.map_err(|_| false),
        };
        match sent {
            Ok(()) => {}
            Err(stalled) => {
                if stalled {
                    tracing::warn!(
                        id = s.gen.id(),
                        timeout_s = write_timeout.unwrap_or_default().as_secs_f64(),
                        "stream not read for the write timeout; cancelling it (client_stalled)"
                    );
                    s.gen.stall();
                }
                break;
            }
        }
    }
}

/// The streaming response: a task produces the frames (it owns the `Generation`,
/// and so the engine's `RequestStream`) into a bounded channel the body reads.
/// The status line waits for the first output, so a request the engine ends
/// before producing any (shed from an overloaded queue, timed out, failed) gets
/// a plain HTTP error that a client or router can act on (retry elsewhere).
pub(crate) async fn sse_response(
    mut gen: Generation,
    out: Out,
    include_usage: bool,
    write_timeout: Option<Duration>,
) -> Result<Response, ServerError> {
    let first = gen.next().await;
    if first.is_none() {
        if let Some(e) = gen.failure() {
            return Err(e);
        }
    }
    let phase = match out.kind {
        Kind::Chat => Phase::Role,
        Kind::Completion => Phase::Tokens,
    };
    let tools = out.tools.clone().map(ToolOutput::new);
    let st = SseState {
        gen,
        first,
        out,
        phase,
        include_usage,
        tools,
        pending: VecDeque::new(),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(FRAME_BUFFER);
    tokio::spawn(produce(st, tx, write_timeout));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((Ok::<Bytes, Infallible>(b), rx))
    });
    Ok((
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
        .into_response())
}
