//! gpt-oss's harmony output format split into reasoning and content as it streams: an
//! answer is a run of messages, each `<|channel|>NAME[ to=RECIPIENT][<|constrain|>TYPE]
//! <|message|>BODY` ended by `<|end|>` (then `<|start|>assistant` and the next header),
//! `<|return|>` or `<|call|>`. The `analysis` channel's bodies are reasoning, `final`'s
//! content, as is `commentary` addressed to no one (a preamble to the user). A message
//! addressed to a function (`to=functions.NAME`, in the role's header or the channel's,
//! on `commentary` or `analysis`, as llama.cpp's gpt-oss parser reads it) is a tool
//! call: given out as neither, unless the splitter was made `with_calls`, where it goes
//! to the content in one canonical form, `<|channel|>commentary to=functions.NAME
//! <|constrain|>json<|message|>ARGS<|call|>` (`crate::tool_format`'s Harmony, which
//! the server's tool-call parser reads); a message to another recipient (a built-in
//! tool) is neither. Other header text is never given out. The header tokens must be in the
//! text: the tokenizer makes them user-defined, as llama.cpp does, so they are decoded
//! even where control tokens are dropped; `<|end|>` may be missing (a control token),
//! as the next `<|start|>` ends a message too.

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";
pub const CONSTRAIN: &str = "<|constrain|>";
/// A recipient's prefix in a header, and a function's.
pub const TO: &str = "to=";
pub const FUNCTIONS: &str = "functions.";

/// The tokens that end a message's body.
const ENDS: [&str; 4] = [END, RETURN, CALL, START];

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    Reasoning,
    Content,
    /// A message to another recipient (a built-in tool): neither reasoning nor content.
    Hidden,
    /// A function call's arguments.
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    Body(Dest),
}

/// One harmony answer's splitter (see the module doc).
#[derive(Debug, Clone)]
pub struct HarmonySplitter {
    state: State,
    /// Text not yet given out: a header, or what may be the start of a control token.
    held: String,
    /// Function calls go to the content in the canonical form (else nowhere).
    calls: bool,
}

/// The word after `prefix` in `h` (up to whitespace or a `<`).
fn word_after<'a>(h: &'a str, prefix: &str) -> Option<&'a str> {
    let i = h.rfind(prefix)? + prefix.len();
    h[i..]
        .split(|ch: char| ch.is_whitespace() || ch == '<')
        .next()
}

/// Where the body after header `h` (the text before `<|message|>`) goes, and the
/// function it calls.
fn dest(h: &str) -> (Dest, Option<&str>) {
    // gpt-oss sometimes writes a stray `<|channel|>commentary to=assistant` first.
    if let Some(to) = word_after(h, TO).filter(|t| *t != "assistant") {
        return match to.strip_prefix(FUNCTIONS) {
            Some(name) if !name.is_empty() => (Dest::Call, Some(name)),
            _ => (Dest::Hidden, None),
        };
    }
    match word_after(h, CHANNEL) {
        Some("analysis") => (Dest::Reasoning, None),
        _ => (Dest::Content, None),
    }
}

/// The canonical text a call's body goes between (`with_calls`).
pub fn call_open(name: &str) -> String {
    format!("{CHANNEL}commentary {TO}{FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}")
}

/// The length of the longest suffix of `s` that is a proper prefix of one of `tags`.
fn partial_suffix(s: &str, tags: &[&str]) -> usize {
    tags.iter()
        .map(|tag| {
            (1..tag.len().min(s.len() + 1))
                .rev()
                .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

impl HarmonySplitter {
    /// A splitter for the answer to `rendered_prompt`: it starts in a header, unless
    /// the prompt's last message was opened up to its body (`...<|message|>`).
    pub fn new(rendered_prompt: &str) -> Self {
        let tail = rendered_prompt
            .rfind(START)
            .map_or("", |i| &rendered_prompt[i..]);
        let mut s = HarmonySplitter {
            state: State::Header,
            held: String::new(),
            calls: false,
        };
        if let Some(i) = tail.find(MESSAGE) {
            if !ENDS[..3].iter().any(|e| tail[i..].contains(e)) {
                s.open(&tail[..i], &mut crate::reasoning::Split::default());
            }
        }
        s
    }

    /// Function calls go to the content in the canonical form (for a parser of them).
    pub fn with_calls(mut self) -> Self {
        self.calls = true;
        self
    }

    /// A message's body begins after header `h`.
    fn open(&mut self, h: &str, out: &mut crate::reasoning::Split) {
        let (d, name) = dest(h);
        self.state = State::Body(d);
        if let (Some(name), true) = (name, self.calls) {
            out.content.push_str(&call_open(name));
        }
    }

    /// The message being read ends.
    fn close(&mut self, out: &mut crate::reasoning::Split) {
        if self.state == State::Body(Dest::Call) && self.calls {
            out.content.push_str(CALL);
        }
        self.state = State::Header;
    }

    pub fn in_reasoning(&self) -> bool {
        self.state == State::Body(Dest::Reasoning)
    }

    fn emit(&self, dest: Dest, text: &str, out: &mut crate::reasoning::Split) {
        match dest {
            Dest::Reasoning => out.reasoning.push_str(text),
            Dest::Content => out.content.push_str(text),
            Dest::Call if self.calls => out.content.push_str(text),
            Dest::Call | Dest::Hidden => {}
        }
    }

    /// Adds `text` and appends what is now certain to `out`.
    pub fn push(&mut self, text: &str, out: &mut crate::reasoning::Split) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Header => match self.held.find(MESSAGE) {
                    Some(i) => {
                        let h: String = self.held.drain(..i + MESSAGE.len()).collect();
                        self.open(&h[..i], out);
                    }
                    None => return,
                },
                State::Body(d) => {
                    let end = ENDS
                        .iter()
                        .filter_map(|e| self.held.find(e).map(|i| (i, e.len())))
                        .min();
                    match end {
                        Some((i, n)) => {
                            self.emit(d, &self.held[..i], out);
                            // `<|start|>` begins the next header: keep it there.
                            let n = if self.held[i..].starts_with(START) {
                                0
                            } else {
                                n
                            };
                            self.held.drain(..i + n);
                            self.close(out);
                        }
                        None => {
                            let cut = self.held.len() - partial_suffix(&self.held, &ENDS);
                            self.emit(d, &self.held[..cut], out);
                            self.held.drain(..cut);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The end of the answer: a body's held text goes where the body went; a header
    /// cut off is dropped, unless it holds no control token at all (a model that wrote
    /// plain text: content).
    pub fn finish(&mut self, out: &mut crate::reasoning::Split) {
        match self.state {
            State::Body(d) => {
                self.emit(d, &self.held, out);
                self.close(out);
            }
            State::Header if !self.held.contains("<|") => out.content.push_str(&self.held),
            State::Header => {}
        }
        self.held.clear();
        self.state = State::Header;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasoning::Split;

    fn split(prompt: &str, pieces: &[&str]) -> Split {
        let mut s = HarmonySplitter::new(prompt);
        let mut all = Split::default();
        for p in pieces {
            s.push(p, &mut all);
        }
        s.finish(&mut all);
        all
    }

    const ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2. Easy: 4.<|end|>\
        <|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";

    #[test]
    fn analysis_is_reasoning_and_final_is_content_whatever_the_pieces() {
        let p = "<|start|>user<|message|>2+2?<|end|><|start|>assistant";
        let want = Split {
            reasoning: "User asks 2+2. Easy: 4.".into(),
            content: "2 + 2 = 4.".into(),
        };
        assert_eq!(split(p, &[ANSWER]), want);
        let chars: Vec<String> = ANSWER.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(p, &refs), want);
        for cut in 1..ANSWER.len() {
            let (a, b) = ANSWER.split_at(cut);
            assert_eq!(split(p, &[a, b]), want, "cut {cut}");
        }
    }

    /// As a decoder that drops control tokens gives it (`<|end|>`, `<|return|>` are
    /// control in o200k_harmony; the header tokens are user-defined, so kept): the next
    /// `<|start|>` ends a message.
    #[test]
    fn without_the_control_tokens_start_ends_a_message() {
        let text = "<|channel|>analysis<|message|>Easy.<|start|>assistant\
            <|channel|>final<|message|>4";
        let s = split("<|start|>assistant", &[text]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("Easy.", "4"));
    }

    #[test]
    fn a_tool_call_is_neither_and_a_preamble_is_content() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|>\
            <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
            <|start|>assistant<|channel|>commentary to=functions.get_weather \
            <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let s = split("<|start|>assistant", &[text]);
        assert_eq!(s.reasoning, "Need weather.");
        assert_eq!(s.content, "Checking.");
    }

    /// With calls parsed: each call in the canonical form, whichever header carries the
    /// recipient (the role's, as the template writes history; the channel's, as
    /// OpenAI's harmony guide shows; `analysis` too, as llama.cpp accepts), ended by
    /// `<|call|>` even where the stop token is not in the text; a built-in tool's
    /// message stays hidden, and a stray `to=assistant` is no recipient.
    #[test]
    fn calls_go_to_the_content_in_one_form() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|>\
            <|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|end|>\
            <|start|>assistant to=functions.get_weather<|channel|>commentary json\
            <|message|>{\"city\":\"Paris\"}<|call|>";
        let want = format!("{}{{\"city\":\"Paris\"}}{CALL}", call_open("get_weather"));
        let run = |pieces: &[&str]| {
            let mut s = HarmonySplitter::new("<|start|>assistant").with_calls();
            let mut all = Split::default();
            for p in pieces {
                s.push(p, &mut all);
            }
            s.finish(&mut all);
            all
        };
        let s = run(&[text]);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("Need weather.", want.as_str())
        );
        for cut in 1..text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(run(&[a, b]).content, want, "cut {cut}");
        }
        // The channel's header, on analysis, and no `<|call|>` in the text (a stop token).
        let s = run(&[
            "<|channel|>analysis to=functions.get_weather <|constrain|>json\
            <|message|>{\"city\":\"Paris\"}",
        ]);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("", want.as_str())
        );
        let s = run(&["<|channel|>commentary to=assistant<|channel|>final<|message|>Hi"]);
        assert_eq!(s.content, "Hi");
        // Without `with_calls`, a call is neither.
        assert_eq!(split("<|start|>assistant", &[text]).content, "");
    }

    #[test]
    fn a_prompt_that_opened_the_final_channel_answers_in_it() {
        let p = "<|start|>assistant<|channel|>final<|message|>";
        assert_eq!(split(p, &["Paris.<|return|>"]).content, "Paris.");
        // Cut off inside the reasoning: it stays reasoning.
        let s = split(
            "<|start|>assistant",
            &["<|channel|>analysis<|message|>hmm <|"],
        );
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("hmm <|", ""));
        // No harmony at all: content.
        assert_eq!(split("", &["plain"]).content, "plain");
    }
}
