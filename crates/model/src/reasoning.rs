//! Reasoning formats: where a thinking model's reasoning ends and its answer begins.
//! `ReasoningFormat::detect` reads it from the chat template (Qwen3, QwQ and the
//! DeepSeek-R1 distills think inside `<think>…</think>`); `ReasoningSplitter` splits the
//! generated text, streamed piece by piece, into reasoning and content, holding back
//! only what could still be the start of a tag (as vLLM's `deepseek_r1` / `qwen3`
//! reasoning parsers do). Where the rendered prompt already opened the block (R1
//! distills end their generation prompt with `<think>\n`), the output starts inside it;
//! where the prompt closed an empty one (Qwen3 with `enable_thinking: false`), the
//! output is all content. gpt-oss's harmony channels (`analysis` reasoning, `final`
//! content) are split by `crate::harmony`.

use crate::harmony::{self, HarmonySplitter};

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// How a model's template marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// No reasoning: the whole output is content.
    None,
    /// `<think>reasoning</think>content`.
    ThinkTags,
    /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>reasoning<|end|>`,
    /// `...<|channel|>final<|message|>content<|return|>` (`crate::harmony`).
    Harmony,
}

impl ReasoningFormat {
    /// The format a chat template's source implies.
    pub fn detect(template: &str) -> Self {
        if template.contains(harmony::CHANNEL) {
            ReasoningFormat::Harmony
        } else if template.contains(THINK_OPEN) || template.contains(THINK_CLOSE) {
            ReasoningFormat::ThinkTags
        } else {
            ReasoningFormat::None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::None => "none",
            ReasoningFormat::ThinkTags => "<think>…</think>",
            ReasoningFormat::Harmony => "harmony channels",
        }
    }

    /// The text that ends the reasoning where a budget cuts it (the engine forces its
    /// tokens): the closing tag, or harmony's end of the analysis message and the
    /// header of the final one.
    pub fn close_text(self) -> Option<String> {
        match self {
            ReasoningFormat::None => None,
            ReasoningFormat::ThinkTags => Some(THINK_CLOSE.to_string()),
            ReasoningFormat::Harmony => Some(format!(
                "{}{}assistant{}final{}",
                harmony::END,
                harmony::START,
                harmony::CHANNEL,
                harmony::MESSAGE
            )),
        }
    }

    /// A splitter for one answer to `rendered_prompt` (the exact prompt text the
    /// model continues).
    pub fn splitter(self, rendered_prompt: &str) -> ReasoningSplitter {
        let state = match self {
            ReasoningFormat::None => State::Content,
            ReasoningFormat::Harmony => {
                return ReasoningSplitter {
                    state: State::Content,
                    held: String::new(),
                    harmony: Some(HarmonySplitter::new(rendered_prompt)),
                }
            }
            ReasoningFormat::ThinkTags => match (
                rendered_prompt.rfind(THINK_OPEN),
                rendered_prompt.rfind(THINK_CLOSE),
            ) {
                (Some(open), close) if close.is_none_or(|c| c < open) => State::OpenedByPrompt,
                _ => State::Start,
            },
        };
        ReasoningSplitter {
            state,
            held: String::new(),
            harmony: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: an opening tag may still come.
    Start,
    /// The prompt opened the block: the answer is reasoning, and an opening tag the
    /// model writes again at its start is dropped (as vLLM's R1 parser does).
    OpenedByPrompt,
    Reasoning,
    /// Just after the closing tag: leading whitespace is dropped.
    AfterClose,
    Content,
}

/// One answer's text split into reasoning and content as it streams.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    /// Text not yet given out: a possible tag start (or leading whitespace).
    held: String,
    /// Harmony's own splitter, which then does the work.
    harmony: Option<HarmonySplitter>,
}

/// What one `push` gave out.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn clear(&mut self) {
        self.reasoning.clear();
        self.content.clear();
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of `tag` (cut on a
/// char boundary of `s`).
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ReasoningSplitter {
    /// Harmony's function calls go to the content, in the form the server's parser of
    /// `ToolCallFormat::Harmony` reads (`crate::harmony`); other formats' calls are in
    /// their content anyway.
    pub fn with_calls(mut self) -> Self {
        self.harmony = self.harmony.map(HarmonySplitter::with_calls);
        self
    }

    /// Whether the answer is (still) in its reasoning.
    pub fn in_reasoning(&self) -> bool {
        if let Some(h) = &self.harmony {
            return h.in_reasoning();
        }
        matches!(self.state, State::Reasoning | State::OpenedByPrompt)
    }

    /// Adds `text` and appends what is now certain to `out`.
    pub fn push(&mut self, text: &str, out: &mut Split) {
        if let Some(h) = &mut self.harmony {
            return h.push(text, out);
        }
        self.held.push_str(text);
        loop {
            match self.state {
                State::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return;
                }
                State::Start | State::OpenedByPrompt => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Reasoning;
                    } else if THINK_OPEN.starts_with(t) {
                        return; // whitespace, or a prefix of the tag: wait
                    } else if self.state == State::OpenedByPrompt {
                        self.state = State::Reasoning;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => match self.held.find(THINK_CLOSE) {
                    Some(i) => {
                        out.reasoning.push_str(&self.held[..i]);
                        self.held.drain(..i + THINK_CLOSE.len());
                        self.state = State::AfterClose;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, THINK_CLOSE);
                        let cut = self.held.len() - keep;
                        out.reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        return;
                    }
                },
                State::AfterClose => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return;
                    }
                    self.held = t.to_string();
                    self.state = State::Content;
                }
            }
        }
    }

    /// The end of the answer: what was held goes out where it was headed (an
    /// unfinished tag start is text).
    pub fn finish(&mut self, out: &mut Split) {
        if let Some(h) = &mut self.harmony {
            return h.finish(out);
        }
        match self.state {
            State::Reasoning | State::OpenedByPrompt => out.reasoning.push_str(&self.held),
            State::AfterClose => {}
            State::Start | State::Content => out.content.push_str(&self.held),
        }
        self.held.clear();
        self.state = State::Content;
    }
}

/// Splits a whole answer at once.
pub fn split_all(format: ReasoningFormat, rendered_prompt: &str, text: &str) -> Split {
    let mut s = format.splitter(rendered_prompt);
    let mut out = Split::default();
    s.push(text, &mut out);
    s.finish(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";

    fn streamed(format: ReasoningFormat, prompt: &str, pieces: &[&str]) -> Split {
        let mut s = format.splitter(prompt);
        let mut all = Split::default();
        for p in pieces {
            let mut out = Split::default();
            s.push(p, &mut out);
            all.reasoning.push_str(&out.reasoning);
            all.content.push_str(&out.content);
        }
        s.finish(&mut all);
        all
    }

    #[test]
    fn detects_think_templates() {
        assert_eq!(ReasoningFormat::detect(QWEN3), ReasoningFormat::ThinkTags);
        assert_eq!(
            ReasoningFormat::detect("{{ messages }}"),
            ReasoningFormat::None
        );
    }

    #[test]
    fn splits_whatever_the_pieces() {
        let text = "<think>\nLet me add: 2+2=4.\n</think>\n\nThe answer is 4.";
        let want = Split {
            reasoning: "\nLet me add: 2+2=4.\n".into(),
            content: "The answer is 4.".into(),
        };
        let p = "<|im_start|>assistant\n";
        assert_eq!(split_all(ReasoningFormat::ThinkTags, p, text), want);
        // Every cut into pieces, including inside both tags, one byte at a time.
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(streamed(ReasoningFormat::ThinkTags, p, &refs), want);
        for cut in 1..text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(
                streamed(ReasoningFormat::ThinkTags, p, &[a, b]),
                want,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn prompt_that_opened_the_block_starts_in_reasoning() {
        let p = "<｜Assistant｜><think>\n";
        let s = split_all(ReasoningFormat::ThinkTags, p, "hmm, 7 is prime</think>Yes.");
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("hmm, 7 is prime", "Yes.")
        );
    }

    #[test]
    fn a_tag_the_model_repeats_after_the_prompt_opened_the_block_is_dropped() {
        let p = "<｜Assistant｜><think>\n";
        for pieces in [
            &["<think>\nhmm</think>ok"][..],
            &["<th", "ink>\n", "hmm</think>ok"],
        ] {
            let s = streamed(ReasoningFormat::ThinkTags, p, pieces);
            assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("\nhmm", "ok"));
        }
        let s = split_all(ReasoningFormat::ThinkTags, p, "  ");
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("  ", ""));
    }

    #[test]
    fn prompt_that_closed_an_empty_block_is_all_content() {
        let p = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        let s = split_all(ReasoningFormat::ThinkTags, p, "Paris.");
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("", "Paris."));
    }

    #[test]
    fn no_tag_is_content_and_unclosed_reasoning_stays_reasoning() {
        let s = split_all(ReasoningFormat::ThinkTags, "", "  <thi is not a tag");
        assert_eq!(s.content, "  <thi is not a tag");
        let s = split_all(
            ReasoningFormat::ThinkTags,
            "",
            "<think>cut off by max_tokens</thi",
        );
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("cut off by max_tokens</thi", "")
        );
        let s = split_all(ReasoningFormat::None, "", "<think>x</think>y");
        assert_eq!(s.content, "<think>x</think>y");
    }
}
