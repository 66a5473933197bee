//! The model's native tool calls parsed out of its text as it streams, in the model's
//! own format (`sloserve_model::tool_format`: Hermes / Qwen2.5 `<tool_call>\n{"name": ...,
//! "arguments": {...}}\n</tool_call>`, Qwen3-Coder's XML, Llama 3's JSON after an optional
//! `<|python_tag|>`, Mistral's `[TOOL_CALLS]`, DeepSeek-R1's `<｜tool▁calls▁begin｜>`,
//! Phi-4-mini's `functools[`). [`ToolCallParser`] turns text pieces into
//! content and complete calls: text that could begin the opening marker is held back
//! (as stop strings are), a call is held until it is complete (its closing tag, or the
//! end of its JSON; `crate::tool_body` reads it), then becomes a call, or stays content,
//! verbatim, if it is not one. Small models often leave the markers out: at the start of
//! the output and right after a call, a bare JSON call (`{"name": ..., "arguments": ...}`,
//! or Mistral's array of them) naming the request's tools is a call too (llama.cpp's
//! Hermes and Llama 3 parsers take these as well). Whitespace that only separates calls
//! from each other or from the text is dropped.

use sloserve_model::tool_format::ToolCallFormat;

use crate::tool_body::{calls_of, json_prefix, read_block, Body, Json, MAX_CALL};
pub use crate::tool_body::{parse_call, Functions, ParsedCall};

/// How a bare call's object begins (after `{` and optional whitespace).
const BARE_KEY: &str = "\"name\"";
/// Llama 3 models also begin with `"type": "function"` (llama.cpp's grammar allows it).
const TYPE_KEY: &str = "\"type\"";

/// What a piece of text releases, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    Call(ParsedCall),
}

/// Splits one generation's text into content and calls.
#[derive(Debug)]
pub struct ToolCallParser {
    /// Text not released yet: a possible start of the opening marker, or the body
    /// of an open call.
    buf: String,
    in_block: bool,
    /// Trailing whitespace of the content so far (dropped if a call follows).
    held_ws: String,
    /// A call just ended: the content's leading whitespace is dropped.
    after_call: bool,
    calls: usize,
    /// At the start of the output or right after a call: a bare call may begin.
    at_boundary: bool,
    /// The format and the request's functions (a bare call must name one).
    functions: Functions,
    /// How much of `buf` an unfinished JSON call was last read to: it is read again
    /// only when new text has a `}` or `]` (where JSON can end), not on every token.
    scanned: usize,
}

/// Whether `text` begins (after whitespace) a bare call: `{"name"` (Mistral: `[{"name"`).
#[derive(Debug, PartialEq)]
enum Bare {
    No,
    Maybe,
    Yes,
}

fn bare_start(format: ToolCallFormat, text: &str) -> Bare {
    let mut t = text.trim_start();
    if format == ToolCallFormat::MistralArray {
        match t.strip_prefix('[') {
            Some(r) => t = r.trim_start(),
            None => return if t.is_empty() { Bare::Maybe } else { Bare::No },
        }
    }
    let Some(rest) = t.strip_prefix('{') else {
        return if t.is_empty() { Bare::Maybe } else { Bare::No };
    };
    let rest = rest.trim_start();
    let keys: &[&str] = match format {
        ToolCallFormat::Llama3Json => &[BARE_KEY, TYPE_KEY],
        _ => &[BARE_KEY],
    };
    if keys.iter().any(|k| rest.starts_with(k)) {
        Bare::Yes
    } else if keys.iter().any(|k| k.starts_with(rest)) {
        Bare::Maybe
    } else {
        Bare::No
    }
}

impl ToolCallParser {
    /// A parser for a request's functions (a `Vec` of names: Hermes calls to them).
    pub fn new(functions: impl Into<Functions>) -> Self {
        ToolCallParser {
            buf: String::new(),
            in_block: false,
            held_ws: String::new(),
            after_call: false,
            calls: 0,
            at_boundary: true,
            functions: functions.into(),
            scanned: 0,
        }
    }

    /// Whether the text since the last read could end a JSON call (or the call is
    /// over the length limit, where it becomes text). Hermes reads on every piece, as
    /// it always has (a malformed bare call is released as soon as it is seen).
    fn worth_reading(&mut self) -> bool {
        if self.functions.format == ToolCallFormat::Hermes {
            return true;
        }
        let new = self.buf.get(self.scanned..).unwrap_or(&self.buf);
        let yes = new.contains(['}', ']']) || self.buf.len() > MAX_CALL;
        self.scanned = self.buf.len();
        yes
    }

    /// A call was read: counted and released.
    fn call(&mut self, call: ParsedCall, out: &mut Vec<ToolEvent>) {
        self.calls += 1;
        self.held_ws.clear();
        self.after_call = true;
        out.push(ToolEvent::Call(call));
    }

    /// At a boundary: takes a bare call off the front of the buffer. `Some(true)`:
    /// took one; `Some(false)`: not one (text); `None`: wait for more.
    fn bare_call(&mut self, out: &mut Vec<ToolEvent>) -> Option<bool> {
        let format = self.functions.format;
        match bare_start(format, &self.buf) {
            Bare::No => return Some(false),
            Bare::Maybe => return None,
            Bare::Yes => {}
        }
        if !self.worth_reading() {
            return None;
        }
        match json_prefix(&self.buf) {
            Json::Value(v, end) => {
                let names = &self.functions.names;
                let Some(calls) =
                    calls_of(format, v).filter(|cs| cs.iter().all(|c| names.contains(&c.name)))
                else {
                    return Some(false);
                };
                self.buf.drain(..end);
                self.scanned = 0;
                for c in calls {
                    self.call(c, out);
                }
                Some(true)
            }
            Json::More => None,
            Json::Bad => Some(false),
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
        let open = self.functions.format.open();
        loop {
            if self.at_boundary && !self.in_block {
                if !self.functions.format.bare_calls() {
                    self.at_boundary = false;
                } else {
                    match self.bare_call(&mut out) {
                        Some(true) => continue,
                        Some(false) => self.at_boundary = false,
                        None => break,
                    }
                }
            }
            if self.in_block {
                if self.functions.format.close().is_none() && !self.worth_reading() {
                    break;
                }
                match read_block(&self.functions, &self.buf) {
                    Body::More => break,
                    Body::Calls(calls, n) => {
                        self.buf.drain(..n);
                        self.scanned = 0;
                        self.in_block = false;
                        self.at_boundary = true;
                        for c in calls {
                            self.call(c, &mut out);
                        }
                    }
                    Body::Bad(n) => {
                        let body: String = self.buf.drain(..n).collect();
                        self.scanned = 0;
                        self.in_block = false;
                        self.content(&format!("{open}{body}"), &mut out);
                    }
                }
            } else if let Some(i) = self.buf.find(open) {
                let text: String = self.buf.drain(..i + open.len()).collect();
                self.scanned = 0;
                self.content(&text[..i], &mut out);
                self.in_block = true;
            } else {
                // Hold back the longest tail that could begin the marker (cut where the
                // marker has a char boundary: R1's are not ASCII).
                let keep = (1..open.len().min(self.buf.len() + 1))
                    .rev()
                    .find(|&n| open.is_char_boundary(n) && self.buf.ends_with(&open[..n]))
                    .unwrap_or(0);
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.scanned = 0;
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
            let open = self.functions.format.open();
            self.content(&format!("{open}{rest}"), &mut out);
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

#[cfg(test)]
#[path = "tool_format_tests.rs"]
mod format_tests;
