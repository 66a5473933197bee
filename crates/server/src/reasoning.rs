//! A thinking model's chat answers split into reasoning and content: the splitter of
//! the model crate (`sloserve_model::reasoning`) for the format the chat template
//! implies, started from the end of the prompt (a prompt that opened a think block
//! answers inside it). `reasoning_content` / `reasoning` carry the first part, in the
//! JSON message and as their own stream deltas; tool calls are parsed from the rest.

use sloserve_model::reasoning::{ReasoningFormat, ReasoningSplitter, Split};

use crate::state::AppState;

/// Prompt tokens whose text decides where the answer starts (a tag's tokens and a
/// few of the template's around them).
const PROMPT_TAIL: usize = 16;

/// The splitter for one chat answer to `prompt`, if the model thinks.
pub(crate) fn splitter(state: &AppState, prompt: &[u32]) -> Option<ReasoningSplitter> {
    let format = state.chat_template.as_ref()?.reasoning_format();
    if format == ReasoningFormat::None {
        return None;
    }
    let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
    let text = state.tokenizer.decode(tail, false).unwrap_or_default();
    Some(format.splitter(&text))
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
