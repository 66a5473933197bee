//! The cheap refusal of an oversize prompt: its length in bytes against the
//! context, decided before any tokenizing (a 4 MiB prompt costs microseconds).

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

#[cfg(test)]
mod tests {
    use super::*;

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
