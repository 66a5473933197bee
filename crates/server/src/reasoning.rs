//! A thinking model's chat answers split into reasoning and content: the splitter of
//! the model crate (`sloserve_model::reasoning`) for the format the chat template
//! implies, started from the end of the prompt (a prompt that opened a think block
//! answers inside it). `reasoning_content` / `reasoning` carry the first part, in the
//! JSON message and as their own stream deltas; tool calls are parsed from the rest.
//! [`ReasoningCount`] counts the generated tokens that went to the reasoning
//! (`usage.completion_tokens_details.reasoning_tokens`).

use sloserve_model::reasoning::{ReasoningFormat, ReasoningSplitter, Split};

use crate::state::AppState;

/// Prompt tokens whose text decides where the answer starts (a tag's tokens and a
/// few of the template's around them).
const PROMPT_TAIL: usize = 16;

/// The splitter for one chat answer to `prompt`, if the model thinks (`calls`: the
/// request has tools, so harmony's function calls go on to the tool-call parser).
pub(crate) fn splitter(state: &AppState, prompt: &[u32], calls: bool) -> Option<ReasoningSplitter> {
    let format = state.chat_template.as_ref()?.reasoning_format();
    if format == ReasoningFormat::None {
        return None;
    }
    let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
    let text = state.tokenizer.decode(tail, false).unwrap_or_default();
    let s = format.splitter(&text);
    Some(if calls { s.with_calls() } else { s })
}

/// A whole answer: its reasoning (`None` when there was none) and content.
pub(crate) fn split_whole(s: &ReasoningSplitter, text: String) -> (Option<String>, String) {
    let mut s = s.clone();
    let mut out = Split::default();
    s.push(&text, &mut out);
    s.finish(&mut out);
    let reasoning = (!out.reasoning.is_empty()).then_some(out.reasoning);
    (reasoning, out.content)
}

/// Counts one answer's reasoning tokens as they are generated, each token's text
/// through its own splitter: a token counts when some of its text goes to the
/// reasoning, at once or when the text it held back (a possible tag start, an
/// incomplete UTF-8 sequence) is released as reasoning. So the tags that open and
/// close the reasoning (`<think>`, `</think>`, harmony's headers), in one token or
/// several, do not count, as in vLLM's count of the tokens between the tags, and a
/// token that straddles the end counts when it carries reasoning text.
#[derive(Debug, Clone)]
pub(crate) struct ReasoningCount {
    splitter: ReasoningSplitter,
    /// Reused for each token's split.
    scratch: Split,
    count: u32,
    /// Tokens inside the reasoning whose text is still held back.
    pending: u32,
}

impl ReasoningCount {
    pub fn new(splitter: ReasoningSplitter) -> Self {
        ReasoningCount {
            splitter,
            scratch: Split::default(),
            count: 0,
            pending: 0,
        }
    }

    /// The text of one generated token.
    pub fn push(&mut self, piece: &str) {
        let before = self.splitter.in_reasoning();
        self.scratch.clear();
        self.splitter.push(piece, &mut self.scratch);
        if !self.scratch.reasoning.is_empty() {
            self.count += self.pending + 1;
            self.pending = 0;
        } else if before && self.splitter.in_reasoning() {
            self.pending += 1;
        } else {
            self.pending = 0;
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn in_reasoning(&self) -> bool {
        self.splitter.in_reasoning()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sloserve_model::reasoning::ReasoningFormat;

    fn count(format: ReasoningFormat, prompt: &str, tokens: &[&str]) -> u32 {
        let mut c = ReasoningCount::new(format.splitter(prompt));
        tokens.iter().for_each(|t| c.push(t));
        c.count()
    }

    #[test]
    fn the_tokens_between_the_tags_count() {
        let think = ReasoningFormat::ThinkTags;
        let toks = [
            "<think>", "\n", "2+2", "=4", ".", "\n", "</think>", "\n\n", "4",
        ];
        assert_eq!(count(think, "<|im_start|>assistant\n", &toks), 5);
        // A prompt that opened the block; a tag cut in two tokens; one token that
        // carries reasoning and the closing tag.
        let toks = ["hmm", " <", "/think>", "yes"];
        assert_eq!(count(think, "<think>\n", &toks), 2);
        assert_eq!(count(think, "<think>\n", &["a", " b</think>c"]), 2);
        // A closing tag in several tokens is no reasoning; a held `<` that was not one is.
        assert_eq!(
            count(think, "<think>\n", &["x", "<", "/th", "ink>", "y"]),
            1
        );
        assert_eq!(count(think, "<think>\n", &["x", "<", "b"]), 3);
        assert_eq!(count(ReasoningFormat::None, "", &["<think>", "a"]), 0);
        let harmony = ReasoningFormat::Harmony;
        let toks = [
            "<|channel|>",
            "analysis",
            "<|message|>",
            "Easy",
            ".",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "4",
        ];
        assert_eq!(count(harmony, "<|start|>assistant", &toks), 2);
    }
}
