//! The Server-Sent Events answer of a generation: `data: {json}\n\n` chunks (chat
//! first sends the assistant role), the finish chunk, an optional usage chunk, then
//! `data: [DONE]`; an engine failure mid-stream becomes an error event. With `n` > 1
//! the choices' chunks interleave as their tokens come, each naming its `index`
//! (each choice its role chunk first, its finish chunk when it ends), and one usage
//! chunk covers them all. With tools,
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

use crate::echo::prompt_part;
use crate::error::ServerError;
use crate::generate::{wire_finish_reason, Kind, Out};
use crate::generation::logprobs::{chat_logprobs, completion_logprobs, TokenLogprob};
use crate::generation::{Delta, Generation};
use crate::tools::ToolOutput;
use sloserve_model::reasoning::{ReasoningSplitter, Split};

/// One choice of a streamed request (`n` > 1: several, each chunk names its
/// index).
struct Choice {
    index: u32,
    gen: Generation,
    /// An output taken before the status line was sent.
    first: Option<Delta>,
    /// The tool-call parser, when the request has tools.
    tools: Option<ToolOutput>,
    /// The reasoning splitter, when the model thinks (its content part goes on to
    /// the tool-call parser or out as content).
    reasoning: Option<ReasoningSplitter>,
    /// Its finish chunk was made.
    done: bool,
    /// Completions with `echo` or `prompt_logprobs`: its prompt chunk was made;
    /// the echoed text's length shifts its tokens' `text_offset`.
    prompt_sent: bool,
    shift: usize,
}

/// A completion choice's prompt chunk (`echo`'s text and logprobs, vLLM's
/// `prompt_logprobs`), once, before its first output: the prompt's scores came
/// before its first token (vLLM streams the echoed prompt first too).
fn prompt_frame(out: &Out, c: &mut Choice) -> Option<String> {
    if c.prompt_sent || out.kind != Kind::Completion || !out.prompt.any() {
        return None;
    }
    c.prompt_sent = true;
    let ids = out.prompt.echo.as_deref().unwrap_or(&[]);
    let part = prompt_part(c.gen.tokenizer(), &out.prompt, ids, c.gen.prompt_scores());
    c.shift = part.text.len();
    let json = serde_json::to_string(&CompletionChunk {
        id: c.gen.id().to_string(),
        object: "text_completion".into(),
        created: out.created,
        model: out.model.clone(),
        choices: vec![CompletionChoice {
            index: c.index,
            text: part.text,
            logprobs: part.logprobs,
            finish_reason: None,
            prompt_logprobs: part.prompt_logprobs,
        }],
        usage: None,
    });
    Some(format!(
        "data: {}\n\n",
        json.unwrap_or_else(|_| "{}".into())
    ))
}

/// One chunk of choice `c`: text (or a chat role / finish), its logprobs, finish
/// reason.
fn chunk(
    out: &Out,
    c: &Choice,
    delta: Option<Delta>,
    role: bool,
    finish: Option<String>,
) -> String {
    let gen = &c.gen;
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
            choices: vec![CompletionChoice {
                index: c.index,
                text: text.unwrap_or_default(),
                logprobs: lp_present.then(|| {
                    let mut l = completion_logprobs(gen.tokenizer(), lps.as_deref().unwrap_or(&[]));
                    l.text_offset.iter_mut().for_each(|o| *o += c.shift);
                    l
                }),
                finish_reason: finish,
                prompt_logprobs: None,
            }],
            usage: None,
        }),
        Kind::Chat => {
            let delta = ChatDelta {
                role: role.then(|| "assistant".to_string()),
                content: if role { Some(String::new()) } else { text },
                ..ChatDelta::default()
            };
            let lps = lps.filter(|_| lp_present);
            return chat_chunk(out, c, delta, lps.as_deref(), finish);
        }
    };
    format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
}

/// The last chunk with `stream_options.include_usage`: the request's usage (all
/// its choices), no choice.
fn usage_chunk(out: &Out, id: &str, usage: Usage) -> String {
    let json = match out.kind {
        Kind::Completion => serde_json::to_string(&CompletionChunk {
            id: id.to_string(),
            object: "text_completion".into(),
            created: out.created,
            model: out.model.clone(),
            choices: Vec::new(),
            usage: Some(usage),
        }),
        Kind::Chat => serde_json::to_string(&ChatCompletionChunk {
            id: id.to_string(),
            object: "chat.completion.chunk".into(),
            created: out.created,
            model: out.model.clone(),
            choices: Vec::new(),
            usage: Some(usage),
        }),
    };
    format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
}

/// One chat chunk of choice `c`: a delta (role, content, tool calls), its
/// logprobs, finish reason.
fn chat_chunk(
    out: &Out,
    c: &Choice,
    delta: ChatDelta,
    lps: Option<&[TokenLogprob]>,
    finish: Option<String>,
) -> String {
    let json = serde_json::to_string(&ChatCompletionChunk {
        id: c.gen.id().to_string(),
        object: "chat.completion.chunk".into(),
        created: out.created,
        model: out.model.clone(),
        choices: vec![ChatChunkChoice {
            index: c.index,
            delta,
            logprobs: lps.map(|l| chat_logprobs(c.gen.tokenizer(), l)),
            finish_reason: finish,
        }],
        usage: None,
    });
    format!("data: {}\n\n", json.unwrap_or_else(|_| "{}".into()))
}

/// The frames of one output of a choice with tools: its content and call deltas
/// (the delta's logprobs go with the first; alone if it released nothing).
fn tool_frames(out: &Out, c: &mut Choice, d: Option<Delta>) -> Vec<String> {
    let (text, lps) = match d {
        Some(d) => (Some(d.text), d.logprobs),
        None => (None, Vec::new()),
    };
    let Some(tools) = c.tools.as_mut() else {
        return Vec::new();
    };
    let mut deltas = tools.deltas(text.as_deref());
    let lps = (c.gen.wants_logprobs() && !lps.is_empty()).then_some(lps);
    if deltas.is_empty() && lps.is_some() {
        deltas.push(ChatDelta {
            content: Some(String::new()),
            ..ChatDelta::default()
        });
    }
    let mut lps = lps;
    deltas
        .into_iter()
        .map(|delta| chat_chunk(out, c, delta, lps.take().as_deref(), None))
        .collect()
}

/// The frames of one output of a choice (`None`: its end, which flushes what the
/// reasoning splitter and the tool-call parser held): reasoning deltas first, then
/// the content through the tool-call parser where there is one, else as content.
fn token_frames(out: &Out, c: &mut Choice, d: Option<Delta>) -> Vec<String> {
    let mut frames = Vec::new();
    let ending = d.is_none();
    let mut d = d;
    if let Some(sp) = c.reasoning.as_mut() {
        let mut split = Split::default();
        let lps = match d.take() {
            Some(x) => {
                sp.push(&x.text, &mut split);
                x.logprobs
            }
            None => {
                sp.finish(&mut split);
                Vec::new()
            }
        };
        let mut lps = Some(lps).filter(|l| !l.is_empty());
        if !split.reasoning.is_empty() {
            let r = split.reasoning;
            let lp = lps.take().filter(|_| c.gen.wants_logprobs());
            let delta = ChatDelta {
                reasoning_content: Some(r.clone()),
                reasoning: Some(r),
                ..ChatDelta::default()
            };
            frames.push(chat_chunk(out, c, delta, lp.as_deref(), None));
        }
        if !split.content.is_empty() || lps.is_some() {
            d = Some(Delta {
                text: split.content,
                logprobs: lps.unwrap_or_default(),
            });
        }
    }
    if c.tools.is_some() {
        if d.is_some() {
            frames.extend(tool_frames(out, c, d));
        }
        if ending {
            frames.extend(tool_frames(out, c, None));
        }
    } else if let Some(d) = d {
        frames.push(chunk(out, c, Some(d), false, None));
    }
    frames
}

enum Phase {
    Role,
    Tokens,
    Usage,
    Done,
    End,
}

struct SseState {
    choices: Vec<Choice>,
    out: Out,
    phase: Phase,
    include_usage: bool,
    /// Frames made, not yet sent (one output can make several).
    pending: VecDeque<String>,
}

/// Frames produced ahead of what the connection has taken.
const FRAME_BUFFER: usize = 8;

/// The next output of a running choice (its index; `None`: that choice ended),
/// as the choices' tokens come. `gen.next()` is cancel-safe (it awaits the
/// engine's channel), so the outputs of the choices not picked are not lost.
async fn next_output(choices: &mut [Choice]) -> (usize, Option<Delta>) {
    if let Some(found) = choices
        .iter_mut()
        .enumerate()
        .find_map(|(i, c)| c.first.take().map(|d| (i, d)))
    {
        return (found.0, Some(found.1));
    }
    let mut running: Vec<_> = choices
        .iter_mut()
        .enumerate()
        .filter(|(_, c)| !c.done)
        .collect();
    if running.len() == 1 {
        let (i, c) = running.pop().expect("one running choice");
        return (i, c.gen.next().await);
    }
    let futs = running
        .into_iter()
        .map(|(i, c)| Box::pin(async move { (i, c.gen.next().await) }));
    futures_util::future::select_all(futs).await.0
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
                for c in &s.choices {
                    s.pending.push_back(chunk(&s.out, c, None, true, None));
                }
                continue;
            }
            Phase::Tokens if s.choices.iter().all(|c| c.done) => {
                s.phase = if s.include_usage {
                    Phase::Usage
                } else {
                    Phase::Done
                };
                continue;
            }
            Phase::Tokens => match next_output(&mut s.choices).await {
                (_, Some(d)) if d.text.is_empty() && d.logprobs.is_empty() => continue,
                (i, Some(d)) => {
                    s.pending.extend(prompt_frame(&s.out, &mut s.choices[i]));
                    let frames = token_frames(&s.out, &mut s.choices[i], Some(d));
                    s.pending.extend(frames);
                    continue;
                }
                (i, None) => match s.choices[i].gen.failure() {
                    Some(e) => {
                        // One choice failed: the request did; the others end now.
                        for c in &mut s.choices {
                            c.gen.cancel();
                        }
                        s.phase = Phase::Done;
                        format!("data: {}\n\n", e.to_api().0.to_json())
                    }
                    None => {
                        s.pending.extend(prompt_frame(&s.out, &mut s.choices[i]));
                        let c = &mut s.choices[i];
                        c.done = true;
                        let mut reason = wire_finish_reason(&c.gen);
                        let frames = token_frames(&s.out, c, None);
                        s.pending.extend(frames);
                        if let Some(t) = &c.tools {
                            reason = crate::tools::finish_reason(reason, t.calls());
                        }
                        // Completions end with empty text; chat with an empty delta `{}`.
                        let d = (s.out.kind == Kind::Completion).then(Delta::default);
                        s.pending.push_back(chunk(&s.out, c, d, false, reason));
                        continue;
                    }
                },
            },
            Phase::Usage => {
                s.phase = Phase::Done;
                let usage = crate::generation::usage::merge_choices(
                    s.choices.iter().map(|c| c.gen.usage()).collect(),
                );
                usage_chunk(&s.out, s.choices[0].gen.id(), usage)
            }
            Phase::Done => {
                s.phase = Phase::End;
                "data: [DONE]\n\n".to_string()
            }
            Phase::End => return None,
        });
    }
}

/// A source of SSE frames: what [`sse_body`] sends (chat and completion chunks
/// here, the Responses API's events in [`crate::responses`]).
pub(crate) trait Frames: Send + 'static {
    /// The next frame, `None` at the end. Dropped (and the source with it) when
    /// the client goes away.
    fn next_frame(&mut self) -> impl std::future::Future<Output = Option<String>> + Send;
    /// The client stopped reading: cancel the generation (`client_stalled`).
    fn stall(&mut self);
    /// The response id, for the log line.
    fn id(&self) -> &str;
}

impl Frames for SseState {
    fn next_frame(&mut self) -> impl std::future::Future<Output = Option<String>> + Send {
        next_frame(self)
    }
    fn stall(&mut self) {
        for c in &mut self.choices {
            c.gen.stall();
        }
    }
    fn id(&self) -> &str {
        self.choices[0].gen.id()
    }
}

/// Produces the frames into the body's bounded channel. A client that takes none
/// for `write_timeout` is stalled: the request is cancelled (`client_stalled`);
/// one that went away (the body was dropped) cancels it too.
async fn produce<F: Frames>(mut s: F, tx: mpsc::Sender<Bytes>, write_timeout: Option<Duration>) {
    loop {
        let frame = tokio::select! {
            f = s.next_frame() => f,
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
                        id = s.id(),
                        timeout_s = write_timeout.unwrap_or_default().as_secs_f64(),
                        "stream not read for the write timeout; cancelling it (client_stalled)"
                    );
                    s.stall();
                }
                break;
            }
        }
    }
}

/// The 200 `text/event-stream` answer whose body a task fills from `frames`
/// through a bounded channel.
pub(crate) fn sse_body<F: Frames>(frames: F, write_timeout: Option<Duration>) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(FRAME_BUFFER);
    tokio::spawn(produce(frames, tx, write_timeout));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((Ok::<Bytes, Infallible>(b), rx))
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

/// The streaming response: a task produces the frames (it owns the choices'
/// `Generation`s, and so the engine's `RequestStream`s) into a bounded channel
/// the body reads. The status line waits for the first choice's first output
/// (`first`, when the caller already took it), so a request the engine ends
/// before producing any (shed from an overloaded queue, timed out, failed) gets
/// a plain HTTP error that a client or router can act on (retry elsewhere).
pub(crate) async fn sse_response(
    mut gens: Vec<Generation>,
    first: Option<Delta>,
    out: Out,
    include_usage: bool,
    write_timeout: Option<Duration>,
) -> Result<Response, ServerError> {
    let first = match first {
        Some(d) => Some(d),
        None => {
            let d = gens[0].next().await;
            if d.is_none() {
                if let Some(e) = gens[0].failure() {
                    return Err(e);
                }
            }
            d
        }
    };
    let phase = match out.kind {
        Kind::Chat => Phase::Role,
        Kind::Completion => Phase::Tokens,
    };
    let mut first = first;
    let choices = gens
        .into_iter()
        .enumerate()
        .map(|(i, gen)| Choice {
            index: i as u32,
            gen,
            first: if i == 0 { first.take() } else { None },
            tools: out.tools.clone().map(ToolOutput::new),
            reasoning: out.reasoning.clone(),
            done: false,
            prompt_sent: false,
            shift: 0,
        })
        .collect();
    let st = SseState {
        choices,
        out,
        phase,
        include_usage,
        pending: VecDeque::new(),
    };
    Ok(sse_body(st, write_timeout))
}
