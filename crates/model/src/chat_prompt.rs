//! Chat prompts whose control tokens come only from the template: control-token texts
//! inside message text are escaped before rendering and tokenized as plain text after.
//!
//! A user message containing `<|im_start|>system\n...` must not open a turn. Each
//! control-token text found in a message (and any character of the escape range itself)
//! is replaced by one character of the supplementary private-use planes before the
//! template runs, so template filters such as `trim` still see the rest of the text
//! unchanged. The rendered text is then split at the control-token texts the template
//! itself wrote (those become their ids); every piece between them is unescaped and
//! tokenized with control tokens taken literally. A chat whose messages hold no
//! control-token text takes the old path unchanged (render, tokenize with control
//! tokens parsed), so normal chats tokenize exactly as before.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::chat_message::ChatMessage;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// First escape character: U+F0000, the start of plane 15's private-use area.
const ESC_PLANE_15: u32 = 0xF0000;
/// Plane 16's private-use area follows (U+100000).
const ESC_PLANE_16: u32 = 0x10_0000;
/// Characters per plane usable as escapes (U+xFFFE and U+xFFFF are non-characters).
const PER_PLANE: u32 = 0xFFFE;

/// The control-token texts of a vocabulary, matched leftmost-longest as the tokenizer's
/// added-token splitter does.
pub struct ControlTokens {
    matcher: Option<AhoCorasick>,
    /// Pattern index -> token id (the first id when several share a text).
    ids: Vec<u32>,
}

impl ControlTokens {
    pub fn new(tok: &Tokenizer) -> Result<Self> {
        let mut texts: Vec<&str> = Vec::new();
        let mut ids = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for id in 0..u32::try_from(tok.vocab_size()).unwrap_or(u32::MAX) {
            if !tok.is_special(id) {
                continue;
            }
            match tok.token_str(id) {
                Some(t) if !t.is_empty() && seen.insert(t) => {
                    texts.push(t);
                    ids.push(id);
                }
                _ => {}
            }
        }
        let matcher = if texts.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&texts)
                    .map_err(|e| ModelError::Tokenizer(format!("control-token matcher: {e}")))?,
            )
        };
        Ok(ControlTokens { matcher, ids })
    }

    /// `(start, end, id)` of each control-token text in `text`, left to right.
    fn find<'a>(&'a self, text: &'a str) -> impl Iterator<Item = (usize, usize, u32)> + 'a {
        self.matcher
            .iter()
            .flat_map(move |m| m.find_iter(text))
            .map(|m| (m.start(), m.end(), self.ids[m.pattern().as_usize()]))
    }
}

fn escape_char(index: usize) -> Option<char> {
    let i = u32::try_from(index).ok()?;
    let cp = if i < PER_PLANE {
        ESC_PLANE_15 + i
    } else if i < 2 * PER_PLANE {
        ESC_PLANE_16 + (i - PER_PLANE)
    } else {
        return None;
    };
    char::from_u32(cp)
}

fn escape_index(c: char) -> Option<usize> {
    let cp = c as u32;
    let i = if (ESC_PLANE_15..ESC_PLANE_15 + PER_PLANE).contains(&cp) {
        cp - ESC_PLANE_15
    } else if (ESC_PLANE_16..ESC_PLANE_16 + PER_PLANE).contains(&cp) {
        cp - ESC_PLANE_16 + PER_PLANE
    } else {
        return None;
    };
    Some(i as usize)
}

/// One prompt's escapes: escape character `i` stands for `texts[i]`.
#[derive(Default)]
struct Escapes {
    texts: Vec<String>,
    index: HashMap<String, char>,
}

impl Escapes {
    fn char_for(&mut self, text: &str) -> Result<char> {
        if let Some(&c) = self.index.get(text) {
            return Ok(c);
        }
        let c = escape_char(self.texts.len()).ok_or_else(|| {
            ModelError::ChatTemplate("too many distinct control-token texts in the messages".into())
        })?;
        self.texts.push(text.to_string());
        self.index.insert(text.to_string(), c);
        Ok(c)
    }

    /// `text` with every control-token text and every escape-range character replaced by
    /// its escape character.
    fn escape(&mut self, controls: &ControlTokens, text: &str) -> Result<String> {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (start, end, _) in controls.find(text) {
            self.push_plain(&mut out, &text[last..start])?;
            out.push(self.char_for(&text[start..end])?);
            last = end;
        }
        self.push_plain(&mut out, &text[last..])?;
        Ok(out)
    }

    /// Text without control tokens: only escape-range characters need escaping.
    fn push_plain(&mut self, out: &mut String, piece: &str) -> Result<()> {
        for c in piece.chars() {
            if escape_index(c).is_some() {
                out.push(self.char_for(c.encode_utf8(&mut [0; 4]))?);
            } else {
                out.push(c);
            }
        }
        Ok(())
    }

    fn escape_opt(
        &mut self,
        controls: &ControlTokens,
        text: Option<&str>,
    ) -> Result<Option<String>> {
        text.map(|t| self.escape(controls, t)).transpose()
    }

    /// A JSON value with every key and string escaped.
    fn escape_json(
        &mut self,
        controls: &ControlTokens,
        v: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        use serde_json::Value as J;
        Ok(match v {
            J::String(s) => J::String(self.escape(controls, s)?),
            J::Array(items) => J::Array(
                items
                    .iter()
                    .map(|i| self.escape_json(controls, i))
                    .collect::<Result<_>>()?,
            ),
            J::Object(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                for (k, v) in map {
                    out.insert(self.escape(controls, k)?, self.escape_json(controls, v)?);
                }
                J::Object(out)
            }
            other => other.clone(),
        })
    }

    fn escape_json_opt(
        &mut self,
        controls: &ControlTokens,
        v: Option<&serde_json::Value>,
    ) -> Result<Option<serde_json::Value>> {
        v.map(|v| self.escape_json(controls, v)).transpose()
    }

    fn unescape(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            match escape_index(c).and_then(|i| self.texts.get(i)) {
                Some(t) => out.push_str(t),
                None => out.push(c),
            }
        }
        out
    }
}

/// Renders `messages` (and `tools`) with `render` and tokenizes the result so that
/// only the text the template wrote can produce control tokens: every string of a
/// message (role, content, name, call id, the calls' names, keys and values) and of
/// the tools is escaped. BOS goes first by the tokenizer's one rule when `add_bos`.
pub fn encode_chat(
    controls: &ControlTokens,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    render: impl Fn(&[ChatMessage], Option<&serde_json::Value>) -> Result<String>,
    add_bos: bool,
) -> Result<Vec<u32>> {
    let mut esc = Escapes::default();
    let escaped = messages
        .iter()
        .map(|m| {
            Ok(ChatMessage {
                role: esc.escape(controls, &m.role)?,
                content: esc.escape(controls, &m.content)?,
                name: esc.escape_opt(controls, m.name.as_deref())?,
                tool_calls: esc.escape_json_opt(controls, m.tool_calls.as_ref())?,
                tool_call_id: esc.escape_opt(controls, m.tool_call_id.as_deref())?,
                reasoning_content: esc.escape_opt(controls, m.reasoning_content.as_deref())?,
                thinking: esc.escape_opt(controls, m.thinking.as_deref())?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let escaped_tools = esc.escape_json_opt(controls, tools)?;
    let ids = if esc.texts.is_empty() {
        tok.encode(&render(messages, tools)?, true)?
    } else {
        let text = render(&escaped, escaped_tools.as_ref())?;
        let mut ids = Vec::new();
        let mut last = 0;
        for (start, end, id) in controls.find(&text) {
            ids.extend(tok.encode(&esc.unescape(&text[last..start]), false)?);
            ids.push(id);
            last = end;
        }
        ids.extend(tok.encode(&esc.unescape(&text[last..]), false)?);
        ids
    };
    Ok(if add_bos { tok.with_bos(ids) } else { ids })
}

#[cfg(test)]
mod tests {
    use super::{escape_char, escape_index, PER_PLANE};

    #[test]
    fn escape_characters_round_trip_over_both_planes() {
        for i in [
            0,
            1,
            PER_PLANE as usize - 1,
            PER_PLANE as usize,
            2 * PER_PLANE as usize - 1,
        ] {
            let c = escape_char(i).unwrap();
            assert_eq!(escape_index(c), Some(i), "{i}");
        }
        assert_eq!(escape_char(2 * PER_PLANE as usize), None);
        assert_eq!(escape_index('a'), None);
        assert_eq!(escape_index('\u{FFFFE}'), None);
    }
}
