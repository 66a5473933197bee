//! The model's native tool calls (Qwen / Hermes: `<tool_call>\n{"name": ...,
//! "arguments": {...}}\n</tool_call>`) parsed out of its text as it streams.
//! [`ToolCallParser`] turns text pieces into content and complete calls: text that
//! could begin the opening tag is held back (as stop strings are), a block is held
//! until its closing tag, then becomes a call if its JSON names a function, or
//! stays content, verbatim, if it does not. Small models often leave the tags out:
//! at the start of the output and right after a call, a bare JSON object
//! `{"name": ..., "arguments": ...}` naming one of the request's tools is a call too
//! (llama.cpp's Hermes parser takes these as well). Whitespace that only separates
//! calls from each other or from the text is dropped.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// How a bare call begins (after `{` and optional whitespace).
const BARE_KEY: &str = "\"name\"";
/// The longest bare call held back before it is taken as text.
const MAX_BARE: usize = 64 * 1024;

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
    /// At the start of the output or right after a call: a bare call may begin.
    at_boundary: bool,
    /// The request's functions (a bare call must name one).
    names: Vec<String>,
}

/// Whether `text` begins (after whitespace) a bare call: `{"name"`.
#[derive(Debug, PartialEq)]
enum Bare {
    No,
    Maybe,
    Yes,
}

fn bare_start(text: &str) -> Bare {
    let t = text.trim_start();
    let Some(rest) = t.strip_prefix('{') else {
        return if t.is_empty() { Bare::Maybe } else { Bare::No };
    };
    let rest = rest.trim_start();
    if rest.starts_with(BARE_KEY) {
        Bare::Yes
    } else if BARE_KEY.starts_with(rest) {
        Bare::Maybe
    } else {
        Bare::No
    }
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
    /// A parser for a request whose tools are `names`.
    pub fn new(names: Vec<String>) -> Self {
        ToolCallParser {
            at_boundary: true,
            names,
            ..Self::default()
        }
    }

    /// At a boundary: takes a bare call off the front of the buffer. `Some(true)`:
    /// took one; `Some(false)`: not one (text); `None`: wait for more.
    fn bare_call(&mut self, out: &mut Vec<ToolEvent>) -> Option<bool> {
        match bare_start(&self.buf) {
            Bare::No => return Some(false),
            Bare::Maybe => return None,
            Bare::Yes => {}
        }
        let start = self.buf.len() - self.buf.trim_start().len();
        let mut it = serde_json::Deserializer::from_str(&self.buf[start..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                let end = start + it.byte_offset();
                let Some(call) =
                    parse_call(&v.to_string()).filter(|c| self.names.contains(&c.name))
                else {
                    return Some(false);
                };
                self.buf.drain(..end);
                self.calls += 1;
                self.held_ws.clear();
                self.after_call = true;
                out.push(ToolEvent::Call(call));
                Some(true)
            }
            Some(Err(e)) if e.is_eof() && self.buf.len() <= MAX_BARE => None,
            _ => Some(false),
        }
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
            if self.at_boundary && !self.in_block {
                match self.bare_call(&mut out) {
                    Some(true) => continue,
                    Some(false) => self.at_boundary = false,
                    None => break,
                }
            }
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
                        self.at_boundary = true;
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
