//! Tools in chat templates: what a template renders of them ([`ToolSupport`],
//! probed by rendering a small example), the fallback for templates without a
//! tools section ([`with_fallback`]), and the template filter `tojson` as
//! transformers defines it (Python's `json.dumps`: `", "` and `": "` separators,
//! no HTML escaping, `indent`).
//!
//! The fallback (docs/tool-calling.md): the tools go into a system message (the
//! first one, or a new one) as a preamble in the Qwen / Hermes wording, with the
//! model's call format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>` where
//! the template shows none; the format's own example where it does, e.g. R1 distills
//! and Phi-4-mini, whose templates render no tools); where the template does not
//! render `tool_calls` either, an assistant message's calls become calls in that
//! format in its text and `tool` messages (consecutive ones merged) a user message of
//! `<tool_response>` blocks.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::chat_message::ChatMessage;
use crate::error::Result;
use crate::tool_format::{ToolCallFormat, TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

/// What a template renders natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// It writes the request's `tools` into the prompt.
    pub tools: bool,
    /// It writes assistant `tool_calls` and `tool` messages.
    pub tool_calls: bool,
}

const PROBE_TOOL: &str = "sloserve_probe_tool";
const PROBE_CALL: &str = "sloserve_probe_call";
const PROBE_RESULT: &str = "sloserve_probe_result";

impl ToolSupport {
    /// Renders a tool list and a call round trip with `render`; a template that
    /// fails on them or leaves them out does not support them.
    pub(crate) fn probe(render: impl Fn(&[ChatMessage], Option<&Json>) -> Result<String>) -> Self {
        let user = ChatMessage::new("user", "probe");
        let tools = json!([{"type": "function", "function": {"name": PROBE_TOOL,
            "description": "probe", "parameters": {"type": "object", "properties": {}}}}]);
        let tools =
            render(std::slice::from_ref(&user), Some(&tools)).is_ok_and(|s| s.contains(PROBE_TOOL));
        let call = ChatMessage {
            tool_calls: Some(json!([{"id": "call_probe", "type": "function",
                "function": {"name": PROBE_CALL, "arguments": {"x": 1}}}])),
            ..ChatMessage::new("assistant", "")
        };
        let result = ChatMessage {
            tool_call_id: Some("call_probe".into()),
            ..ChatMessage::new("tool", PROBE_RESULT)
        };
        let tool_calls = render(&[user, call, result], None)
            .is_ok_and(|s| s.contains(PROBE_CALL) && s.contains(PROBE_RESULT));
        ToolSupport { tools, tool_calls }
    }
}

/// The messages and tools to render: as given where the template supports them
/// (`support` is asked only when tools or calls are present), else the fallback, in
/// the model's call `format`.
pub fn with_fallback(
    format: ToolCallFormat,
    support: impl FnOnce() -> ToolSupport,
    messages: &[ChatMessage],
    tools: Option<&[Json]>,
) -> (Vec<ChatMessage>, Option<Json>) {
    let has_calls = messages
        .iter()
        .any(|m| m.tool_calls.is_some() || m.role == "tool");
    if tools.is_none() && !has_calls {
        return (messages.to_vec(), None);
    }
    let s = support();
    let mut out = if has_calls && !s.tool_calls {
        calls_as_text(format, messages)
    } else {
        messages.to_vec()
    };
    match tools {
        Some(t) if s.tools => (out, Some(Json::Array(t.to_vec()))),
        Some(t) => {
            let preamble = tools_preamble(format, t);
            match out.first_mut() {
                Some(m) if m.role == "system" => {
                    m.content = format!("{}\n\n{preamble}", m.content);
                }
                _ => out.insert(0, ChatMessage::new("system", preamble)),
            }
            (out, None)
        }
        None => (out, None),
    }
}

/// The system-message text that describes `tools` (the Qwen / Hermes wording; in
/// another `format`, its call written for an example function).
pub fn tools_preamble(format: ToolCallFormat, tools: &[Json]) -> String {
    let list: Vec<String> = tools.iter().map(|t| python_json(t, None)).collect();
    if format != ToolCallFormat::Hermes {
        return format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
             For each function call, write it in this format:\n{}",
            list.join("\n"),
            format.write_call("function_name", &json!({"argument": "value"}))
        );
    }
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within \
         {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n{TOOL_CALL_OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{TOOL_CALL_CLOSE}",
        list.join("\n")
    )
}

/// Calls as text in `format` in their assistant message; tool results as a user
/// message of `<tool_response>` blocks.
fn calls_as_text(format: ToolCallFormat, messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut prev_tool = false;
    for m in messages {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(last) if prev_tool => last.content = format!("{}\n{block}", last.content),
                _ => out.push(ChatMessage::new("user", block)),
            }
            prev_tool = true;
            continue;
        }
        prev_tool = false;
        let mut m = m.clone();
        if let Some(Json::Array(calls)) = m.tool_calls.take() {
            let mut parts: Vec<String> = Vec::new();
            if !m.content.is_empty() {
                parts.push(m.content.clone());
            }
            for c in &calls {
                let f = c.get("function").unwrap_or(c);
                let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
                let args = f.get("arguments").cloned().unwrap_or_else(|| json!({}));
                parts.push(format.write_call(name, &args));
            }
            m.content = parts.join("\n");
        }
        out.push(m);
    }
    out
}

/// Python's `json.dumps(v, ensure_ascii=False, indent=indent)`.
pub fn python_json(v: &impl Serialize, indent: Option<usize>) -> String {
    let mut buf = Vec::new();
    let res = match indent {
        None => v.serialize(&mut serde_json::Serializer::with_formatter(
            &mut buf,
            PyFormatter,
        )),
        Some(n) => {
            let ind = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&ind);
            v.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, f))
        }
    };
    match res {
        Ok(()) => String::from_utf8(buf).unwrap_or_default(),
        Err(_) => "null".into(),
    }
}

/// One line, `", "` between items and `": "` after keys.
struct PyFormatter;

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// The `tojson` filter of transformers' chat templates (`indent` as a keyword;
/// `ensure_ascii`, `separators`, `sort_keys` accepted, the defaults apply).
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(python_json(&v, indent)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_json_spacing() {
        let v = json!({"b": [1, 2.5, "x<y>"], "a": {}, "c": "é"});
        assert_eq!(
            python_json(&v, None),
            r#"{"b": [1, 2.5, "x<y>"], "a": {}, "c": "é"}"#
        );
        assert_eq!(python_json(&json!([1]), Some(2)), "[\n  1\n]");
    }

    #[test]
    fn fallback_preamble_and_calls_as_text() {
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        let none = ToolSupport {
            tools: false,
            tool_calls: false,
        };
        let call = ChatMessage {
            tool_calls: Some(json!([{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": {"a": 1}}}])),
            ..ChatMessage::new("assistant", "")
        };
        let msgs = [
            ChatMessage::new("user", "q"),
            call,
            ChatMessage::new("tool", "r1"),
            ChatMessage::new("tool", "r2"),
        ];
        let (out, t) = with_fallback(ToolCallFormat::Hermes, || none, &msgs, Some(&tools));
        assert!(t.is_none());
        assert_eq!(out[0].role, "system");
        assert!(out[0]
            .content
            .contains(r#"{"type": "function", "function": {"name": "f"}}"#));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content,
            "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
        );
        assert_eq!(out.len(), 4);
        // A native template gets everything as is; plain chats never probe.
        let all = ToolSupport {
            tools: true,
            tool_calls: true,
        };
        let (out, t) = with_fallback(ToolCallFormat::Hermes, || all, &msgs, Some(&tools));
        assert_eq!(
            (out.as_slice(), t),
            (&msgs[..], Some(Json::Array(tools.to_vec())))
        );
        let plain = [ChatMessage::new("user", "q")];
        let (out, _) = with_fallback(ToolCallFormat::Hermes, || panic!("probed"), &plain, None);
        assert_eq!(out, plain);
    }
}
