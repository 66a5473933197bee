//! gpt-oss's harmony output format split into reasoning and content as it streams: an
//! answer is a run of messages, each `<|channel|>NAME[ to=RECIPIENT][<|constrain|>TYPE]
//! <|message|>BODY` ended by `<|end|>` (then `<|start|>assistant` and the next header),
//! `<|return|>` or `<|call|>`. The `analysis` channel's bodies are reasoning, `final`'s
//! content, as is `commentary` addressed to no one (a preamble to the user);
//! `commentary to=functions.NAME` is a tool call, given out as neither (its parsing is
//! the server's). Header text is never given out. The header tokens must be in the
//! text: the tokenizer makes them user-defined, as llama.cpp does, so they are decoded
//! even where control tokens are dropped; `<|end|>` may be missing (a control token),
//! as the next `<|start|>` ends a message too.

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";

/// The tokens that end a message's body.
const ENDS: [&str; 4] = [END, RETURN, CALL, START];

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    Reasoning,
    Content,
    /// A tool call's arguments: neither reasoning nor content.
    Hidden,
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
}

/// Where the body after header `h` (the text before `<|message|>`) goes.
fn dest(h: &str) -> Dest {
    let channel = h.rfind(CHANNEL).map(|i| &h[i + CHANNEL.len()..]).map(|c| {
        c.split(|ch: char| ch.is_whitespace() || ch == '<')
            .next()
            .unwrap_or("")
    });
    match channel {
        Some("analysis") => Dest::Reasoning,
        Some("commentary") if h.contains("to=") => Dest::Hidden,
        _ => Dest::Content,
    }
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
        let state = match tail.find(MESSAGE) {
            Some(i) if !ENDS[..3].iter().any(|e| tail[i..].contains(e)) => {
                State::Body(dest(&tail[..i]))
            }
            _ => State::Header,
        };
        HarmonySplitter {
            state,
            held: String::new(),
        }
    }

    pub fn in_reasoning(&self) -> bool {
        self.state == State::Body(Dest::Reasoning)
    }

    fn emit(dest: Dest, text: &str, out: &mut crate::reasoning::Split) {
        match dest {
            Dest::Reasoning => out.reasoning.push_str(text),
            Dest::Content => out.content.push_str(text),
            Dest::Hidden => {}
        }
    }

    /// Adds `text` and appends what is now certain to `out`.
    pub fn push(&mut self, text: &str, out: &mut crate::reasoning::Split) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Header => match self.held.find(MESSAGE) {
                    Some(i) => {
                        self.state = State::Body(dest(&self.held[..i]));
                        self.held.drain(..i + MESSAGE.len());
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
                            Self::emit(d, &self.held[..i], out);
                            // `<|start|>` begins the next header: keep it there.
                            let n = if self.held[i..].starts_with(START) {
                                0
                            } else {
                                n
                            };
                            self.held.drain(..i + n);
                            self.state = State::Header;
                        }
                        None => {
                            let cut = self.held.len() - partial_suffix(&self.held, &ENDS);
                            Self::emit(d, &self.held[..cut], out);
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
            State::Body(d) => Self::emit(d, &self.held, out),
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
