//! `POST /v1/responses` (OpenAI's Responses API, stateless): the request mapped
//! onto a chat request (`sloserve_api::responses`), generated like chat (the same
//! template, tools, grammar, SLO contract and engine submission), answered as a
//! response object whose `output` holds a `message` item and / or `function_call`
//! items, or streamed as the documented events (`response.created`,
//! `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta` …,
//! `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, function calls as `response.output_item.added`,
//! a model's reasoning first as a `reasoning` item (`summary: []`, its text one
//! `reasoning_text` content part, streamed as `response.reasoning_text.delta` /
//! `.done`, OpenAI's shape for reasoning text),
//! `response.function_call_arguments.delta` / `.done`, `response.output_item.done`,
//! then `response.completed`, or `response.incomplete` when `max_output_tokens`
//! cut it), each with `type` and an increasing `sequence_number`.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sloserve_api::{
    Echo, IncompleteDetails, OutputItem, OutputText, ResponseObject, ResponseUsage,
    ResponsesRequest,
};

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::generate::{collect_choice, start, wire_finish_reason, Kind, Started, WireChoice};
use crate::generation::{Delta, Generation};
use crate::state::{unix_now, AppState};
use crate::stream::{sse_body, Frames};
use crate::tool_parser::{ParsedCall, ToolCallParser, ToolEvent};
use sloserve_model::reasoning::{ReasoningSplitter, Split};

/// What every response object of one request shares.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
}

impl Head {
    fn response(
        &self,
        status: &str,
        output: Vec<OutputItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response".into(),
            created_at: self.created_at,
            status: status.into(),
            incomplete_details: (status == "incomplete").then(|| IncompleteDetails {
                reason: "max_output_tokens".into(),
            }),
            error: None,
            model: self.model.clone(),
            output,
            usage,
            store: false,
            previous_response_id: None,
            truncation: "disabled".into(),
            echo: self.echo.clone(),
        }
    }
}

/// `resp_…`, `msg_…`, `fc_…`: the server's ids with OpenAI's prefixes.
fn new_id(state: &AppState, prefix: &str) -> String {
    state.new_id(prefix).replacen('-', "_", 1)
}

/// "completed", or "incomplete" when the length limit ended it.
fn status_of(gen: &Generation) -> &'static str {
    match wire_finish_reason(gen).as_deref() {
        Some("length") => "incomplete",
        _ => "completed",
    }
}

pub async fn handle(a: Accepted<ResponsesRequest>) -> Result<Response, ServerError> {
    let Accepted {
        state,
        req,
        caller,
        headers,
    } = a;
    let chat = req.to_chat()?;
    let head = Head {
        id: new_id(&state, "resp"),
        created_at: unix_now(),
        model: state.model_name.clone(),
        echo: req.echo(),
    };
    let (prompt, params) = crate::chat::prompt_and_params(&state, chat).await?;
    let stream = params.stream;
    let write_timeout = state.stream_write_timeout;
    let Started {
        mut gens,
        first,
        out,
    } = start(state.clone(), &headers, &caller, prompt, params, Kind::Chat).await?;
    let gen = gens.pop().expect("one choice (n is 1)");
    if !stream {
        return answer(&state, head, gen, first, out).await;
    }
    // The status line waits for the first output (an engine refusal or failure
    // before it is a plain HTTP error).
    let mut gen = gen;
    let first = match first {
        Some(d) => Some(d),
        None => {
            let d = gen.next().await;
            if d.is_none() {
                if let Some(e) = gen.failure() {
                    return Err(e);
                }
            }
            d
        }
    };
    let events = Events {
        state,
        parser: out.tools.clone().map(ToolCallParser::new),
        reasoning: out.reasoning.clone(),
        split: Split::default(),
        gen,
        first,
        head,
        seq: 0,
        pending: VecDeque::new(),
        phase: Phase::Start,
        output: Vec::new(),
        open: None,
        open_reasoning: None,
    };
    Ok(sse_body(events, write_timeout))
}

/// The JSON answer: the choice run to its end, its text and calls as output items.
async fn answer(
    state: &AppState,
    head: Head,
    gen: Generation,
    first: Option<Delta>,
    out: crate::generate::Out,
) -> Result<Response, ServerError> {
    let (choice, usage) = collect_choice(gen, 0, first, &out).await?;
    let WireChoice::Chat(choice, _) = choice else {
        return Err(ServerError::Internal("a chat choice was expected".into()));
    };
    let status = match choice.finish_reason.as_deref() {
        Some("length") => "incomplete",
        _ => "completed",
    };
    let calls = choice.message.tool_calls.unwrap_or_default();
    let mut output = Vec::new();
    if let Some(r) = choice.message.reasoning_content {
        output.push(OutputItem::reasoning(new_id(state, "rs"), status, Some(r)));
    }
    match choice.message.content {
        Some(text) if !text.is_empty() || calls.is_empty() => output.push(OutputItem::message(
            new_id(state, "msg"),
            status,
            vec![OutputText::new(text)],
        )),
        _ => {}
    }
    for c in calls {
        output.push(OutputItem::function_call(
            new_id(state, "fc"),
            "completed",
            c.id,
            c.function.name,
            c.function.arguments,
        ));
    }
    let body = serde_json::to_string(&head.response(status, output, Some(usage.into())))
        .map_err(|e| ServerError::Internal(format!("cannot serialize: {e}")))?;
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

enum Phase {
    Start,
    Tokens,
    End,
}

/// The message item being streamed: its id, output index and text so far.
struct OpenMessage {
    id: String,
    index: usize,
    text: String,
}

/// The stream's state: the generation, the tool-call parser (with tools), the
/// items done so far and the message item open.
struct Events {
    state: Arc<AppState>,
    gen: Generation,
    first: Option<Delta>,
    parser: Option<ToolCallParser>,
    head: Head,
    seq: u64,
    pending: VecDeque<String>,
    phase: Phase,
    output: Vec<OutputItem>,
    open: Option<OpenMessage>,
    /// The model's reasoning splitter, when it reasons; its output, reused.
    reasoning: Option<ReasoningSplitter>,
    split: Split,
    /// The reasoning item being streamed.
    open_reasoning: Option<OpenMessage>,
}

impl Events {
    /// Queues one event: `event: TYPE` and its data with `type` and `sequence_number`.
    fn emit(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.pending
            .push_back(format!("event: {kind}\ndata: {data}\n\n"));
    }

    fn emit_response(&mut self, kind: &str, status: &str, usage: Option<ResponseUsage>) {
        let r = self.head.response(status, self.output.clone(), usage);
        self.emit(kind, json!({ "response": r }));
    }

    /// Reasoning text: the reasoning item (opened on its first text).
    fn reasoning_text(&mut self, t: &str) {
        if self.open_reasoning.is_none() {
            let m = OpenMessage {
                id: new_id(&self.state, "rs"),
                index: self.output.len(),
                text: String::new(),
            };
            let item = OutputItem::reasoning(m.id.clone(), "in_progress", None);
            self.emit(
                "response.output_item.added",
                json!({"output_index": m.index, "item": item}),
            );
            self.emit(
                "response.content_part.added",
                json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                       "part": OutputText::reasoning(String::new())}),
            );
            self.open_reasoning = Some(m);
        }
        let m = self.open_reasoning.as_mut().expect("opened above");
        m.text.push_str(t);
        let data = json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                          "delta": t});
        self.emit("response.reasoning_text.delta", data);
    }

    /// Closes the open reasoning item.
    fn close_reasoning(&mut self, status: &str) {
        let Some(m) = self.open_reasoning.take() else {
            return;
        };
        self.emit(
            "response.reasoning_text.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "text": m.text}),
        );
        self.emit(
            "response.content_part.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "part": OutputText::reasoning(m.text.clone())}),
        );
        let item = OutputItem::reasoning(m.id, status, Some(m.text));
        self.emit(
            "response.output_item.done",
            json!({"output_index": m.index, "item": item}),
        );
        self.output.push(item);
    }

    /// Text of the message item (opened on its first text).
    fn text(&mut self, t: &str) {
        self.close_reasoning("completed");
        if self.open.is_none() {
            let m = OpenMessage {
                id: new_id(&self.state, "msg"),
                index: self.output.len(),
                text: String::new(),
            };
            let item = OutputItem::message(m.id.clone(), "in_progress", Vec::new());
            self.emit(
                "response.output_item.added",
                json!({"output_index": m.index, "item": item}),
            );
            self.emit(
                "response.content_part.added",
                json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                       "part": OutputText::new(String::new())}),
            );
            self.open = Some(m);
        }
        if t.is_empty() {
            return;
        }
        let m = self.open.as_mut().expect("opened above");
        m.text.push_str(t);
        let data = json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                          "delta": t, "logprobs": []});
        self.emit("response.output_text.delta", data);
    }

    /// Closes the open message item (`status` its final status).
    fn close_message(&mut self, status: &str) {
        let Some(m) = self.open.take() else {
            return;
        };
        let part = OutputText::new(m.text.clone());
        self.emit(
            "response.output_text.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "text": m.text, "logprobs": []}),
        );
        self.emit(
            "response.content_part.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0, "part": part}),
        );
        let item = OutputItem::message(m.id, status, vec![part]);
        self.emit(
            "response.output_item.done",
            json!({"output_index": m.index, "item": item}),
        );
        self.output.push(item);
    }

    /// One function call: its item added, its arguments, its item done.
    fn call(&mut self, c: ParsedCall) {
        self.close_reasoning("completed");
        self.close_message("completed");
        let index = self.output.len();
        let id = new_id(&self.state, "fc");
        let call_id = crate::tools::call_id();
        let added = OutputItem::function_call(
            id.clone(),
            "in_progress",
            call_id.clone(),
            c.name.clone(),
            String::new(),
        );
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        );
        self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": c.name, "arguments": c.arguments}),
        );
        let item = OutputItem::function_call(id, "completed", call_id, c.name, c.arguments);
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// A piece of generated text (`None`: the end): its reasoning to the reasoning
    /// item, the rest through the tool-call parser.
    fn push(&mut self, text: Option<&str>) {
        if let Some(sp) = self.reasoning.as_mut() {
            let mut split = std::mem::take(&mut self.split);
            split.clear();
            match text {
                Some(t) => sp.push(t, &mut split),
                None => sp.finish(&mut split),
            }
            if !split.reasoning.is_empty() {
                self.reasoning_text(&split.reasoning);
            }
            if !split.content.is_empty() {
                self.content(Some(&split.content));
            }
            self.split = split;
            if text.is_none() {
                self.content(None);
            }
            return;
        }
        self.content(text);
    }

    /// Answer text (`None`: the end), through the tool-call parser.
    fn content(&mut self, text: Option<&str>) {
        let events = match (&mut self.parser, text) {
            (Some(p), Some(t)) => p.push(t),
            (Some(p), None) => p.finish(),
            (None, Some(t)) => vec![ToolEvent::Content(t.to_string())],
            (None, None) => Vec::new(),
        };
        for e in events {
            match e {
                ToolEvent::Content(t) => self.text(&t),
                ToolEvent::Call(c) => self.call(c),
            }
        }
    }

    async fn step(&mut self) {
        match self.phase {
            Phase::Start => {
                self.phase = Phase::Tokens;
                self.emit_response("response.created", "in_progress", None);
                self.emit_response("response.in_progress", "in_progress", None);
            }
            Phase::Tokens => {
                let d = match self.first.take() {
                    Some(d) => Some(d),
                    None => self.gen.next().await,
                };
                if let Some(d) = d {
                    self.push(Some(&d.text));
                    return;
                }
                self.phase = Phase::End;
                if let Some(e) = self.gen.failure() {
                    let (e, _) = e.to_api();
                    self.emit(
                        "error",
                        json!({"code": e.code, "message": e.message, "param": e.param}),
                    );
                    let mut r = self.head.response("failed", self.output.clone(), None);
                    r.error = Some(json!({"code": e.code.unwrap_or_else(|| e.kind.to_string()),
                                          "message": e.message}));
                    self.emit("response.failed", json!({ "response": r }));
                    return;
                }
                let status = status_of(&self.gen);
                self.push(None);
                self.close_reasoning(status);
                if self.open.is_none() && self.output.iter().all(|i| i.kind == "reasoning") {
                    // Nothing generated: still one (empty) message.
                    self.text("");
                }
                self.close_message(status);
                let usage = self.gen.usage().into();
                let kind = match status {
                    "incomplete" => "response.incomplete",
                    _ => "response.completed",
                };
                self.emit_response(kind, status, Some(usage));
            }
            Phase::End => {}
        }
    }
}

impl Frames for Events {
    async fn next_frame(&mut self) -> Option<String> {
        loop {
            if let Some(f) = self.pending.pop_front() {
                return Some(f);
            }
            if let Phase::End = self.phase {
                return None;
            }
            self.step().await;
        }
    }

    fn stall(&mut self) {
        self.gen.stall();
    }

    fn id(&self) -> &str {
        &self.head.id
    }
}
