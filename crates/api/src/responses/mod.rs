//! `/v1/responses` (OpenAI's Responses API, stateless): the request, mapped onto a
//! chat request ([`ResponsesRequest::to_chat`]) so sampling, tools, structured
//! output and the SLO fields are validated once, by chat's own checks; the response
//! object, its output items and usage, and the stream events' shapes.
//!
//! Mapping: `instructions` is a system message first; `input` is a string (one user
//! message) or a list of items: messages (`role`, `content` a string or
//! `input_text` / `output_text` parts), `function_call` items (the assistant's
//! calls, consecutive ones in one assistant message) and `function_call_output`
//! items (tool messages); `reasoning` items are skipped. `tools` are the flat
//! function shape, `tool_choice` `none` | `auto` | `required` |
//! `{type: "function", name}`, `text.format` becomes `response_format`,
//! `max_output_tokens` the length limit. Nothing is stored: `store` is accepted and
//! taken as false, `previous_response_id` (and `conversation`) are a 400.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::chat::{ChatCompletionRequest, ChatMessage, MessageContent, ROLES};
use crate::common::RequestFields;
use crate::error::ApiError;
use crate::sampling::SamplingFields;
use crate::tools::{FunctionCall, FunctionDef, Tool, ToolCall, ToolChoice, ToolFields};

mod object;
pub use object::*;

/// A `POST /v1/responses` body. The fields whose shapes differ from chat's are
/// kept as JSON here and checked by [`ResponsesRequest::to_chat`], each error
/// naming its field.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string (one user message) or a list of input items.
    #[schema(value_type = Object)]
    pub input: Value,
    /// A system message put first.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub instructions: Option<Value>,
    /// Flat function tools: `{type: "function", name, description, parameters, strict}`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": ...}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub parallel_tool_calls: Option<Value>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", name, schema, strict}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<i64>)]
    pub max_output_tokens: Option<Value>,
    /// Accepted and taken as false: nothing is stored.
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub store: Option<Value>,
    /// Refused (400): the server is stateless.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub previous_response_id: Option<Value>,
    /// Refused (400): the server is stateless.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// Refused when true (no background runs).
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub background: Option<Value>,
    /// Echoed in the response.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `{"effort": ...}`: chat's `reasoning_effort` (the summary is not written).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub fields: RequestFields,
}

fn bad(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(param, format!("{param}: {why}"))
}

fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(bad(param, "expected a string")),
    }
}

/// A message's or an output's content: a string, or text parts joined by newlines.
fn content_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let p = format!("{param}[{j}]");
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_text" | "output_text" | "text" | "refusal" => {
                        let key = if kind == "refusal" { "refusal" } else { "text" };
                        match part.get(key) {
                            Some(Value::String(t)) => texts.push(t.clone()),
                            _ => {
                                let p = format!("{p}.{key}");
                                return Err(bad(&p, "field is required (a string)"));
                            }
                        }
                    }
                    other => {
                        let p = format!("{p}.type");
                        return Err(bad(
                            &p,
                            format!("only 'input_text' and 'output_text' content is supported, got '{other}'"),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(bad(param, "expected a string or a list of content parts")),
    }
}

/// The input items as chat messages.
fn input_messages(input: &Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            out.push(message("user", s.clone()));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad("input", "expected a string or a list of input items")),
    };
    if items.is_empty() {
        return Err(bad("input", "must contain at least one item"));
    }
    for (i, item) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        if !item.is_object() {
            return Err(bad(&p, "expected an input item object"));
        }
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.get("role").is_some() => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(bad(&format!("{p}.type"), "field is required")),
        };
        match kind {
            "message" => {
                let role = text_of(item.get("role").unwrap_or(&Value::Null), &format!("{p}.role"))?;
                if !ROLES.contains(&role.as_str()) || role == "tool" {
                    let p = format!("{p}.role");
                    return Err(bad(
                        &p,
                        format!(
                            "unknown role '{role}' (expected user, assistant, system or developer)"
                        ),
                    ));
                }
                let content =
                    content_text(item.get("content").unwrap_or(&Value::Null), &format!("{p}.content"))?;
                match out.last_mut() {
                    // The answer after its reasoning item: one assistant message.
                    Some(m) if role == "assistant" && reasoning_only(m) => {
                        m.content = Some(MessageContent::Text(content))
                    }
                    _ => out.push(message(&role, content)),
                }
            }
            "function_call" => {
                let field = |f: &str| -> Result<String, ApiError> {
                    text_of(item.get(f).unwrap_or(&Value::Null), &format!("{p}.{f}"))
                };
                let call = ToolCall {
                    id: field("call_id")?,
                    kind: "function".into(),
                    function: FunctionCall {
                        name: field("name")?,
                        arguments: match item.get("arguments") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v @ Value::Object(_)) => v.to_string(),
                            _ => return Err(bad(&format!("{p}.arguments"), "expected a JSON text")),
                        },
                    },
                };
                // Consecutive calls (and a call after the assistant's text) are one
                // assistant message.
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => {
                        m.tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => out.push(ChatMessage {
                        tool_calls: Some(vec![call]),
                        ..message("assistant", String::new())
                    }),
                }
            }
            "function_call_output" => {
                let id = text_of(item.get("call_id").unwrap_or(&Value::Null), &format!("{p}.call_id"))?;
                let output =
                    content_text(item.get("output").unwrap_or(&Value::Null), &format!("{p}.output"))?;
                out.push(ChatMessage {
                    tool_call_id: Some(id),
                    ..message("tool", output)
                });
            }
            // A reasoning item: the reasoning of the assistant message that follows (its
            // `reasoning_text` parts; the summary is not the reasoning), which the
            // template may render (gpt-oss's does before a call).
            "reasoning" => {
                let text: Vec<&str> = item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|c| c.get("type").and_then(Value::as_str) == Some("reasoning_text"))
                    .filter_map(|c| c.get("text").and_then(Value::as_str))
                    .collect();
                if !text.is_empty() {
                    out.push(ChatMessage {
                        reasoning_content: Some(text.concat()),
                        ..message("assistant", String::new())
                    });
                }
            }
            other => {
                return Err(bad(
                    &format!("{p}.type"),
                    format!(
                        "unsupported input item type '{other}' (expected message, function_call or function_call_output)"
                    ),
                ))
            }
        }
    }
    // A reasoning item with nothing after it has no turn to go with.
    if out.last().is_some_and(reasoning_only) {
        out.pop();
    }
    Ok(())
}

/// An assistant message that holds only a reasoning item's text so far.
fn reasoning_only(m: &ChatMessage) -> bool {
    m.role == "assistant"
        && m.reasoning_content.is_some()
        && m.tool_calls.is_none()
        && matches!(&m.content, Some(MessageContent::Text(t)) if t.is_empty())
}

fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content: Some(MessageContent::Text(content)),
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
    }
}

/// The flat function tools as chat's tools.
fn chat_tools(tools: &Value) -> Result<Vec<Tool>, ApiError> {
    let Value::Array(items) = tools else {
        return Err(bad("tools", "expected a list of tools"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = format!("tools[{i}]");
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(bad(
                    &format!("{p}.type"),
                    format!("only 'function' tools are supported, got '{kind}'"),
                ));
            }
            let name = text_of(t.get("name").unwrap_or(&Value::Null), &format!("{p}.name"))?;
            let description = match t.get("description") {
                None | Some(Value::Null) => None,
                Some(d) => Some(text_of(d, &format!("{p}.description"))?),
            };
            let strict = match t.get("strict") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => return Err(bad(&format!("{p}.strict"), "expected a boolean")),
            };
            Ok(Tool {
                kind: "function".into(),
                function: FunctionDef {
                    name,
                    description,
                    parameters: t.get("parameters").cloned().filter(|v| !v.is_null()),
                    strict,
                },
            })
        })
        .collect()
}

/// `tool_choice` in chat's shape.
fn chat_tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    match v {
        Value::String(s) => Ok(ToolChoice::Mode(s.clone())),
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function"), Some(Value::String(name))) => Ok(ToolChoice::Function(
                json!({"type": "function", "function": {"name": name}}),
            )),
            (Some("function"), _) => Err(bad("tool_choice", "missing name")),
            (t, _) => Err(bad(
                "tool_choice",
                format!(
                    "expected \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}}, got type {}",
                    t.unwrap_or("(none)")
                ),
            )),
        },
        _ => Err(bad(
            "tool_choice",
            "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut js = Map::new();
            for k in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(k) {
                    js.insert(k.into(), v.clone());
                }
            }
            if !js.contains_key("schema") {
                return Err(bad("text.format.schema", "field is required"));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        other => Err(bad(
            "text.format.type",
            format!(
                "expected 'text', 'json_object' or 'json_schema', got {}",
                other.map_or("(none)".to_string(), |t| format!("'{t}'"))
            ),
        )),
    }
}

impl ResponsesRequest {
    /// The chat request this response is generated from (validated further by
    /// chat's own `params`).
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, ApiError> {
        if self
            .previous_response_id
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(bad(
                "previous_response_id",
                "this server's /v1/responses is stateless (responses are not stored); send the whole conversation in input",
            ));
        }
        if self.conversation.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(
                "conversation",
                "this server's /v1/responses is stateless (no conversations are stored); send the whole conversation in input",
            ));
        }
        if self.background == Some(Value::Bool(true)) {
            return Err(bad("background", "background responses are not supported"));
        }
        if let Some(s) = self
            .store
            .as_ref()
            .filter(|v| !v.is_null() && !v.is_boolean())
        {
            return Err(bad("store", format!("expected a boolean, got {s}")));
        }
        if self.sampling.n.is_some_and(|n| n != 1) {
            return Err(bad(
                "n",
                "the Responses API returns one output (n must be 1)",
            ));
        }
        let mut messages = Vec::new();
        match &self.instructions {
            None | Some(Value::Null) => {}
            Some(v) => messages.push(message("system", text_of(v, "instructions")?)),
        }
        input_messages(&self.input, &mut messages)?;
        let mut fields = self.fields.clone();
        match &self.max_output_tokens {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_i64() {
                Some(m) if m >= 1 => fields.max_completion_tokens = Some(m),
                _ => {
                    return Err(bad(
                        "max_output_tokens",
                        format!("must be an integer of at least 1, got {v}"),
                    ))
                }
            },
        }
        if let Some(text) = self.text.as_ref().filter(|t| !t.is_null()) {
            if !text.is_object() {
                return Err(bad("text", "expected an object {\"format\": ...}"));
            }
            fields.response_format = response_format(text)?;
        }
        let tools = match &self.tools {
            None | Some(Value::Null) => None,
            Some(t) => Some(chat_tools(t)?),
        };
        let tool_choice = match &self.tool_choice {
            None | Some(Value::Null) => None,
            Some(c) => Some(chat_tool_choice(c)?),
        };
        let parallel_tool_calls = match &self.parallel_tool_calls {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(bad("parallel_tool_calls", "expected a boolean")),
        };
        let req = ChatCompletionRequest {
            model: self.model.clone(),
            messages,
            sampling: self.sampling.clone(),
            fields,
            tool_fields: ToolFields {
                tools,
                tool_choice,
                parallel_tool_calls,
            },
            logprobs: None,
            top_logprobs: None,
            prompt_logprobs: None,
            add_generation_prompt: None,
            chat_template_kwargs: None,
            reasoning_effort: match &self.reasoning {
                None | Some(Value::Null) => None,
                Some(r) => match r.get("effort") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(e)) => Some(e.clone()),
                    Some(_) => return Err(bad("reasoning.effort", "expected a string")),
                },
            },
        };
        // Chat's tool errors name `tools[i].function.x`; here the tools are flat.
        req.params().map_err(|mut e| {
            if let Some(p) = &mut e.param {
                *p = p.replace(".function.", ".");
            }
            e.message = e.message.replace(".function.", ".");
            e
        })?;
        Ok(req)
    }

    /// The request fields a response echoes (the SDK reads them).
    pub fn echo(&self) -> Echo {
        Echo {
            instructions: self.instructions.clone().filter(|v| !v.is_null()),
            metadata: self
                .metadata
                .clone()
                .filter(|v| !v.is_null())
                .unwrap_or_else(|| json!({})),
            tools: self
                .tools
                .clone()
                .filter(|v| !v.is_null())
                .unwrap_or_else(|| json!([])),
            tool_choice: self
                .tool_choice
                .clone()
                .filter(|v| !v.is_null())
                .unwrap_or_else(|| json!("auto")),
            temperature: self.sampling.temperature.unwrap_or(1.0),
            top_p: self.sampling.top_p.unwrap_or(1.0),
            parallel_tool_calls: self
                .parallel_tool_calls
                .as_ref()
                .and_then(Value::as_bool)
                .unwrap_or(true),
            text: self
                .text
                .clone()
                .filter(|v| v.get("format").is_some_and(|f| !f.is_null()))
                .unwrap_or_else(|| json!({"format": {"type": "text"}})),
            max_output_tokens: self.max_output_tokens.as_ref().and_then(Value::as_i64),
            user: self.fields.user.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
