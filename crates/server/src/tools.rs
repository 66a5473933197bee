//! Tool calling (issue #32 item 3): a request's `tools` given to the chat template,
//! `tool_choice` `required` / named compiled into the grammar that makes the output
//! one or more calls in the model's format (`sloserve_model::tool_format`) (sloserve-grammar, arguments following each
//! function's `parameters`; under `auto` only when a function is `strict`, in every
//! format whose `constrains_auto`), and the model's calls parsed out of its text
//! ([`crate::tool_parser`]) into OpenAI's `tool_calls`, with ids `call_<random>`
//! and `finish_reason: "tool_calls"`.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use sloserve_api::{
    ChatDelta, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta, ToolMode, ToolParams,
};
use sloserve_engine::sampler::constraint::SharedConstraint;
use sloserve_grammar::{tool_call_constraint_in, ToolChoice, ToolFunction};

use crate::error::ServerError;
use crate::state::AppState;
use crate::tool_parser::{Functions, ParsedCall, ToolCallParser, ToolEvent};
use sloserve_model::tool_format::ToolCallFormat;

/// The tools as the template receives them: each `{"type": "function",
/// "function": {...}}` as the client sent it.
pub fn template_tools(tools: &ToolParams) -> Vec<Value> {
    tools
        .tools
        .iter()
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .collect()
}

/// An assistant message's calls for the template: `arguments` as an object where
/// their text parses as JSON (as vLLM and llama.cpp pass them), else the text.
pub fn template_calls(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<Value>(&c.function.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| Value::String(c.function.arguments.clone()));
                serde_json::json!({"id": c.id, "type": c.kind,
                    "function": {"name": c.function.name, "arguments": args}})
            })
            .collect(),
    )
}

/// The grammar of the calls: `required` or a named function (the output is the
/// calls), or `auto` when a function is `strict` (free text, or text then calls
/// whose arguments follow the strict functions' `parameters`; a non-strict
/// function's arguments are any object). `None` for `auto` without a strict
/// function: nothing is constrained and the model's own calls are parsed.
/// Blocking (compiles).
pub fn constraint(
    state: &AppState,
    tools: &ToolParams,
    tenant: Option<&str>,
) -> Result<Option<SharedConstraint>, ServerError> {
    let format = call_format(state);
    let choice = match &tools.mode {
        // Strict functions under `auto` are constrained where the format's grammar of
        // text-or-calls exists; elsewhere (harmony) the calls are parsed unconstrained.
        ToolMode::Auto
            if !format.constrains_auto()
                || !tools.tools.iter().any(|t| t.function.strict == Some(true)) =>
        {
            return Ok(None)
        }
        ToolMode::Auto => ToolChoice::Auto,
        ToolMode::Required => ToolChoice::Required,
        ToolMode::Named(n) => ToolChoice::Named(n.clone()),
    };
    let functions: Vec<ToolFunction> = tools
        .tools
        .iter()
        .map(|t| ToolFunction {
            name: t.function.name.clone(),
            parameters: match choice {
                ToolChoice::Auto if t.function.strict != Some(true) => None,
                _ => t.function.parameters.clone(),
            },
        })
        .collect();
    let spec = tool_call_constraint_in(
        format,
        &marker_ids(state, format),
        &functions,
        &choice,
        tools.parallel,
    )
    .map_err(|e| {
        ServerError::from(sloserve_api::ApiError::invalid(
            "tool_choice",
            format!("tool_choice: {e}"),
        ))
    })?;
    let n_vocab = state.engine.info().vocab_size;
    state
        .structured
        .compile(&state.tokenizer, n_vocab, &spec, "tools", tenant)
        .map(Some)
}

/// A new call id, `call_` and 24 letters and digits.
pub fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut id = String::from("call_");
    for half in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(half);
        let mut x = h.finish();
        for _ in 0..12 {
            id.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
            x /= ALPHABET.len() as u64;
        }
    }
    id
}

/// The finish reason of a generation that made `calls` calls: `tool_calls` unless
/// it ran out of tokens.
pub fn finish_reason(engine: Option<String>, calls: usize) -> Option<String> {
    match engine {
        Some(r) if calls > 0 && r != "length" => Some("tool_calls".into()),
        r => r,
    }
}

/// One request's parsing: events to stream deltas, or the whole message.
#[derive(Debug)]
pub struct ToolOutput {
    parser: ToolCallParser,
}

/// The model's tool-call format: its chat template's (`sloserve_model::tool_format`),
/// Hermes without a template.
pub fn call_format(state: &AppState) -> ToolCallFormat {
    state
        .chat_template
        .as_ref()
        .map_or(ToolCallFormat::Hermes, |t| t.tool_call_format())
}

/// `format`'s markers that are control tokens of the model's vocabulary, with their ids
/// (decoded into a tool-using chat answer's text for the parser; asked for as tokens by
/// the grammar).
pub fn marker_ids(state: &AppState, format: ToolCallFormat) -> Vec<(&'static str, u32)> {
    format
        .rendered_markers()
        .iter()
        .filter_map(
            |&m| match state.tokenizer.encode(m, true).ok()?.as_slice() {
                // Harmony's header tokens are user-defined, not control: one token each.
                &[id] if state.tokenizer.is_special(id) || format == ToolCallFormat::Harmony => {
                    Some((m, id))
                }
                _ => None,
            },
        )
        .collect()
}

/// What the parser needs of a request's functions: the model's format, their names (a
/// bare JSON call must name one) and their string parameters (raw in Qwen3-Coder's XML).
pub fn functions(format: ToolCallFormat, tools: &ToolParams) -> Functions {
    let mut string_params = Vec::new();
    for t in &tools.tools {
        let props = t
            .function
            .parameters
            .as_ref()
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        for (p, schema) in props.into_iter().flatten() {
            if schema.get("type").and_then(Value::as_str) == Some("string") {
                string_params.push((t.function.name.clone(), p.clone()));
            }
        }
    }
    Functions {
        format,
        names: tools
            .tools
            .iter()
            .map(|t| t.function.name.clone())
            .collect(),
        string_params,
    }
}

impl ToolOutput {
    pub fn new(functions: impl Into<Functions>) -> Self {
        ToolOutput {
            parser: ToolCallParser::new(functions),
        }
    }

    pub fn calls(&self) -> usize {
        self.parser.calls()
    }

    /// The stream deltas of a piece of text (`None`: the end): content first,
    /// then each new call as two deltas, its id and name, then its arguments.
    pub fn deltas(&mut self, text: Option<&str>) -> Vec<ChatDelta> {
        let before = self.parser.calls();
        let events = match text {
            Some(t) => self.parser.push(t),
            None => self.parser.finish(),
        };
        let mut out = Vec::new();
        let mut index = before as u32;
        for e in events {
            match e {
                ToolEvent::Content(t) => out.push(ChatDelta {
                    content: Some(t),
                    ..ChatDelta::default()
                }),
                ToolEvent::Call(ParsedCall { name, arguments }) => {
                    let first = ToolCallDelta {
                        index,
                        id: Some(call_id()),
                        kind: Some("function".into()),
                        function: FunctionCallDelta {
                            name: Some(name),
                            arguments: Some(String::new()),
                        },
                    };
                    let args = ToolCallDelta {
                        index,
                        function: FunctionCallDelta {
                            name: None,
                            arguments: Some(arguments),
                        },
                        ..ToolCallDelta::default()
                    };
                    for d in [first, args] {
                        out.push(ChatDelta {
                            tool_calls: Some(vec![d]),
                            ..ChatDelta::default()
                        });
                    }
                    index += 1;
                }
            }
        }
        out
    }

    /// The whole text's content (`None` when the model only called tools) and calls.
    pub fn message(functions: impl Into<Functions>, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let mut p = ToolCallParser::new(functions);
        let mut events = p.push(text);
        events.extend(p.finish());
        let mut content = String::new();
        let mut calls = Vec::new();
        for e in events {
            match e {
                ToolEvent::Content(t) => content.push_str(&t),
                ToolEvent::Call(c) => calls.push(ToolCall {
                    id: call_id(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: c.name,
                        arguments: c.arguments,
                    },
                }),
            }
        }
        let content = (calls.is_empty() || !content.is_empty()).then_some(content);
        (content, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_shaped() {
        let a = call_id();
        assert_eq!(a.len(), 5 + 24);
        assert!(a.starts_with("call_") && a[5..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(a, call_id());
    }

    #[test]
    fn message_and_deltas_agree() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let fns = || vec!["f".to_string(), "g".to_string()];
        let (content, calls) = ToolOutput::message(fns(), text);
        assert_eq!(content.as_deref(), Some("Checking."));
        let names: Vec<_> = calls.iter().map(|c| c.function.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
        let mut out = ToolOutput::new(fns());
        let mut deltas = Vec::new();
        for piece in text.as_bytes().chunks(5) {
            deltas.extend(out.deltas(Some(std::str::from_utf8(piece).unwrap())));
        }
        deltas.extend(out.deltas(None));
        let streamed: String = deltas.iter().filter_map(|d| d.content.clone()).collect();
        assert_eq!(streamed, "Checking.");
        let tc: Vec<&ToolCallDelta> = deltas
            .iter()
            .flat_map(|d| d.tool_calls.iter().flatten())
            .collect();
        assert_eq!(tc.len(), 4);
        assert_eq!((tc[0].index, tc[2].index), (0, 1));
        assert_eq!(tc[0].function.name.as_deref(), Some("f"));
        assert_eq!(tc[0].function.arguments.as_deref(), Some(""));
        assert!(tc[0].id.is_some() && tc[1].id.is_none());
        assert_eq!(tc[1].function.arguments.as_deref(), Some(r#"{"x":1}"#));
        assert_eq!(out.calls(), 2);
        // Only calls: content is null; no call: content as generated.
        assert_eq!(
            ToolOutput::message(fns(), "<tool_call>{\"name\":\"f\"}</tool_call>\n").0,
            None
        );
        assert_eq!(ToolOutput::message(fns(), "").0.as_deref(), Some(""));
        assert_eq!(
            finish_reason(Some("stop".into()), 1).as_deref(),
            Some("tool_calls")
        );
        assert_eq!(
            finish_reason(Some("length".into()), 1).as_deref(),
            Some("length")
        );
        assert_eq!(
            finish_reason(Some("stop".into()), 0).as_deref(),
            Some("stop")
        );
    }
}
