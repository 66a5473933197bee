//! The cheap refusal of an oversize prompt: its length in bytes against the
//! context, decided before any tokenizing (a 4 MiB prompt costs microseconds).
//! A chat request counts every part the template renders ([`ChatSize`]): the
//! messages' text, names, call ids, tool calls and the tools, and at least one
//! token per message and per call (50,000 empty tool results cost no template
//! work: they are refused first).

use sloserve_api::tools::ToolParams;
use sloserve_api::ChatMessage;
use sloserve_model::tokenizer::Tokenizer;

use crate::error::ServerError;

/// No token stands for more than `max_token_bytes` bytes of prompt text, so a
/// text of `n` bytes is at least `ceil(n / max_token_bytes)` tokens long.
#[derive(Debug, Clone, Copy)]
pub struct PromptBound {
    pub max_token_bytes: usize,
    /// The longest prompt the engine takes, in tokens.
    pub max_tokens: usize,
}

/// A token that is not in the vocabulary's text (an unknown character: one
/// token per character) covers at most one UTF-8 character.
const MAX_CHAR_BYTES: usize = 4;

impl PromptBound {
    /// The longest token's text over the whole vocabulary (control tokens too:
    /// their text is what a prompt spells them with).
    pub fn new(tokenizer: &Tokenizer, max_tokens: usize) -> Self {
        let longest = (0..tokenizer.vocab_size() as u32)
            .map(|id| {
                let b = tokenizer.token_bytes_ref(id).len();
                // SentencePiece spells a space as U+2581 (3 bytes) in its vocabulary.
                b.max(tokenizer.token_str(id).map_or(0, str::len))
            })
            .max()
            .unwrap_or(0);
        PromptBound {
            max_token_bytes: longest.max(MAX_CHAR_BYTES),
            max_tokens,
        }
    }

    /// The fewest tokens a text of `bytes` bytes can be.
    pub fn min_tokens(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.max_token_bytes)
    }

    /// Refuses a prompt text that cannot fit however it tokenizes (the engine
    /// checks the exact count of every prompt that passes).
    pub fn check(&self, bytes: usize, prompt_param: &'static str) -> Result<(), ServerError> {
        let min_tokens = self.min_tokens(bytes);
        if min_tokens > self.max_tokens {
            return Err(ServerError::PromptTooManyBytes {
                bytes,
                min_tokens,
                max_token_bytes: self.max_token_bytes,
                max: self.max_tokens,
                prompt_param,
            });
        }
        Ok(())
    }
}

/// What a chat request gives its template: bytes of text of every part, and
/// the messages and tool calls (each renders as at least one token: a template
/// marks where each starts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatSize {
    pub bytes: usize,
    pub items: usize,
}

impl ChatSize {
    /// Counted in one pass over the parsed request, before any other work.
    pub fn of(messages: &[ChatMessage], tools: Option<&ToolParams>) -> Self {
        use sloserve_api::MessageContent;
        let mut s = ChatSize::default();
        let opt = |o: &Option<String>| o.as_deref().map_or(0, str::len);
        for m in messages {
            s.items += 1;
            s.bytes += m.role.len() + opt(&m.name) + opt(&m.tool_call_id);
            s.bytes += opt(&m.reasoning_content);
            s.bytes += match &m.content {
                None => 0,
                Some(MessageContent::Text(t)) => t.trim().len(),
                // Joined by newlines.
                Some(MessageContent::Parts(parts)) => parts.iter().map(|p| opt(&p.text) + 1).sum(),
            };
            for c in m.tool_calls.iter().flatten() {
                s.items += 1;
                s.bytes += c.id.len() + c.function.name.len() + c.function.arguments.len();
            }
        }
        for t in tools.map_or(&[][..], |t| t.tools.as_slice()) {
            let f = &t.function;
            s.bytes += f.name.len() + opt(&f.description);
            // Checked small at validation (`MAX_TOOL_PARAMETERS`).
            s.bytes += f.parameters.as_ref().map_or(0, |p| p.to_string().len());
        }
        s
    }
}

impl PromptBound {
    /// [`PromptBound::check`] for a chat request's parts: its bytes, plus one
    /// token for each message and call.
    pub fn check_chat(
        &self,
        size: ChatSize,
        prompt_param: &'static str,
    ) -> Result<(), ServerError> {
        let min_tokens = self.min_tokens(size.bytes).saturating_add(size.items);
        if min_tokens > self.max_tokens {
            return Err(ServerError::PromptTooManyBytes {
                bytes: size.bytes,
                min_tokens,
                max_token_bytes: self.max_token_bytes,
                max: self.max_tokens,
                prompt_param,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_a_chat_request_counts() {
        let b = PromptBound {
            max_token_bytes: 16,
            max_tokens: 100,
        };
        let msg = |json: &str| -> ChatMessage { serde_json::from_str(json).unwrap() };
        // 150 empty tool results: no text, but each is a message the template
        // renders; refused before any template work.
        let empty: Vec<ChatMessage> = (0..150)
            .map(|_| msg(r#"{"role":"tool","content":"","tool_call_id":""}"#))
            .collect();
        let size = ChatSize::of(&empty, None);
        assert_eq!(size.items, 150);
        let e = b.check_chat(size, "messages").unwrap_err();
        assert_eq!(
            e.to_api().0.code.as_deref(),
            Some("context_length_exceeded")
        );
        assert!(b
            .check_chat(ChatSize::of(&empty[..50], None), "messages")
            .is_ok());
        // Tool calls' arguments and ids count as text.
        let args = "x".repeat(2000);
        let call = msg(&format!(
            r#"{{"role":"assistant","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"f","arguments":"{args}"}}}}]}}"#
        ));
        let size = ChatSize::of(std::slice::from_ref(&call), None);
        assert_eq!((size.items, size.bytes > 2000), (2, true));
        assert!(b.check_chat(size, "messages").is_err());
    }

    #[test]
    fn refuses_only_what_cannot_fit() {
        let b = PromptBound {
            max_token_bytes: 16,
            max_tokens: 100,
        };
        assert!(b.check(1600, "prompt").is_ok());
        let e = b.check(1601, "messages").unwrap_err();
        let (api, _) = e.to_api();
        assert_eq!(api.status, 400);
        assert_eq!(api.param.as_deref(), Some("messages"));
        assert_eq!(api.code.as_deref(), Some("context_length_exceeded"));
        assert!(api.message.contains("1601 bytes"), "{}", api.message);
        assert!(
            api.message.contains("at least 101 tokens"),
            "{}",
            api.message
        );
    }
}
