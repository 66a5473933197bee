//! The model's native tool calls (Qwen / Hermes: `<tool_call>\n{"name": ...,
//! "arguments": {...}}\n</tool_call>`) parsed out of its text as it streams.
//! [`ToolCallParser`] turns text pieces into content and complete calls: text that
//! could begin the opening tag is held back (as stop strings are), a block is held
//! until its closing tag, then becomes a call if its JSON names a function, or
//! stays content, verbatim, if it does not. Whitespace that only separates calls
//! from each other or from the text is dropped.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A complete call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a piece of text releases, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    Call(ParsedCall),
}

/// Splits one generation's text into content and calls.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Text not released yet: a possible start of the opening tag, or the body
    /// of an open block.
    buf: String,
    in_block: bool,
    /// Trailing whitespace of the content so far (dropped if a call follows).
    held_ws: String,
    /// A call just ended: the content's leading whitespace is dropped.
    after_call: bool,
    calls: usize,
}

/// The call a block's body (between the tags) holds, if it is one.
pub fn parse_call(body: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

impl ToolCallParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next piece of text.
    pub fn push(&mut self, piece: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.buf.push_str(piece);
        loop {
            if self.in_block {
                let Some(j) = self.buf.find(CLOSE) else { break };
                let body: String = self.buf.drain(..j + CLOSE.len()).collect();
                let body = &body[..j];
                self.in_block = false;
                match parse_call(body) {
                    Some(call) => {
                        self.calls += 1;
                        self.held_ws.clear();
                        self.after_call = true;
                        out.push(ToolEvent::Call(call));
                    }
                    None => self.content(&format!("{OPEN}{body}{CLOSE}"), &mut out),
                }
            } else if let Some(i) = self.buf.find(OPEN) {
                let text: String = self.buf.drain(..i + OPEN.len()).collect();
                self.content(&text[..i], &mut out);
                self.in_block = true;
            } else {
                // Hold back the longest tail that could begin the tag (ASCII, so a
                // char boundary).
                let keep = (1..OPEN.len().min(self.buf.len() + 1))
                    .rev()
                    .find(|&n| self.buf.ends_with(&OPEN[..n]))
                    .unwrap_or(0);
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.content(&text, &mut out);
                break;
            }
        }
        out
    }

    /// The generation ended: what is held back is content (an unclosed block
    /// verbatim); trailing whitespace is kept only when no call was made.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.in_block {
            self.in_block = false;
            self.content(&format!("{OPEN}{rest}"), &mut out);
        } else {
            self.content(&rest, &mut out);
        }
        let ws = std::mem::take(&mut self.held_ws);
        if self.calls == 0 && !ws.is_empty() {
            out.push(ToolEvent::Content(ws));
        }
        out
    }

    /// Releases content text, holding back its trailing whitespace (a call that
    /// follows drops it).
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        let mut text = text;
        if self.after_call {
            text = text.trim_start();
            if text.is_empty() {
                return;
            }
            self.after_call = false;
        }
        let all = std::mem::take(&mut self.held_ws) + text;
        let body = all.trim_end();
        if !body.is_empty() {
            out.push(ToolEvent::Content(body.to_string()));
        }
        self.held_ws = all[body.len()..].to_string();
    }
}

#[cfg(test)]
#[path = "tool_parser_tests.rs"]
mod tests;
