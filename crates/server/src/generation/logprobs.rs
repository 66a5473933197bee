//! Logprobs of the generated tokens: gathered per token (with its text offset) while
//! generating, then shaped as the completions or the chat `logprobs` object.

use sloserve_api::{
    ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob, TopLogprobsMap,
};
use sloserve_model::tokenizer::Tokenizer;

/// A generated token's logprob data.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    /// Offset of the token's text in the completion text.
    pub offset: usize,
}

/// The logprobs not yet handed out (only when the request asked for them).
#[derive(Debug, Default)]
pub struct LogprobBuffer {
    pending: Vec<TokenLogprob>,
}

impl LogprobBuffer {
    /// Records a token whose text starts at `offset`.
    pub fn push(&mut self, id: u32, logprob: Option<f32>, top: Vec<(u32, f32)>, offset: usize) {
        self.pending.push(TokenLogprob {
            id,
            logprob: logprob.unwrap_or(0.0),
            top,
            offset,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Everything recorded since the last `take`.
    pub fn take(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.pending)
    }
}

/// The text of one token (lossy UTF-8).
pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_bytes_ref(id)).into_owned()
}

/// The completions `logprobs` object.
pub fn completion_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> CompletionLogprobs {
    CompletionLogprobs {
        tokens: lps.iter().map(|t| token_text(tok, t.id)).collect(),
        token_logprobs: lps.iter().map(|t| Some(t.logprob)).collect(),
        top_logprobs: lps
            .iter()
            .map(|t| {
                Some(TopLogprobsMap(
                    t.top
                        .iter()
                        .map(|&(id, lp)| (token_text(tok, id), lp))
                        .collect(),
                ))
            })
            .collect(),
        text_offset: lps.iter().map(|t| t.offset).collect(),
    }
}

/// The chat `logprobs` object.
pub fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|t| ChatTokenLogprob {
                token: token_text(tok, t.id),
                logprob: t.logprob,
                bytes: tok.token_bytes(t.id),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|&(id, lp)| TopLogprob {
                        token: token_text(tok, id),
                        logprob: lp,
                        bytes: tok.token_bytes(id),
                    })
                    .collect(),
            })
            .collect(),
    }
}
