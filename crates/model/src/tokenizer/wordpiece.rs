//! `WordPiece`: the tokenizer of GGUF files with `tokenizer.ggml.model = "bert"`, encoding
//! as llama.cpp's `llm_tokenizer_wpm_session` does: accents stripped (each character
//! replaced by the first of its NFD decomposition, marks dropped) and lowercased, words
//! split at whitespace, with each punctuation mark, ASCII symbol and CJK character a word of
//! its own; each word, prefixed with U+2581, cut greedily into the longest vocabulary
//! entries, or the unknown token if any part of it matches none.
//!
//! The vocabulary is llama.cpp's conversion of BERT's: word-initial pieces carry U+2581,
//! continuations (`##x` in BERT) are bare. Decoding is SentencePiece's.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;

use super::special::{Fragment, SpecialTokens};

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';

pub(crate) struct WordPiece {
    ids: HashMap<String, u32>,
    /// The longest token text, in bytes.
    max_len: usize,
    unk: Option<u32>,
    specials: SpecialTokens,
}

/// The Unicode categories the word split looks at.
struct Classes {
    punctuation: Regex,
    symbol: Regex,
    mark: Regex,
    control: Regex,
}

fn classes() -> &'static Classes {
    static C: OnceLock<Classes> = OnceLock::new();
    C.get_or_init(|| {
        let re = |p: &str| Regex::new(p).expect("category regex");
        Classes {
            punctuation: re(r"^\p{P}$"),
            symbol: re(r"^\p{S}$"),
            mark: re(r"^\p{M}$"),
            control: re(r"^\p{C}$"),
        }
    })
}

/// BERT's CJK ideograph blocks (with the HF tokenizers bound llama.cpp copies).
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// The first character of `c`'s canonical decomposition.
fn nfd_first(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let mut n = tokenizers::NormalizedString::from(c.to_string());
    n.nfd();
    n.get().chars().next().unwrap_or(c)
}

impl WordPiece {
    pub(crate) fn new(tokens: &[String], unk: Option<u32>, specials: SpecialTokens) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let max_len = tokens.iter().map(String::len).max().unwrap_or(0);
        WordPiece {
            ids,
            max_len,
            unk,
            specials,
        }
    }

    /// Appends the tokens of `text` to `out` (no CLS/SEP).
    pub(crate) fn encode(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => {
                    for word in words(t) {
                        self.word(&word, out);
                    }
                }
            }
        }
    }

    fn word(&self, word: &str, out: &mut Vec<u32>) {
        let word = format!("{SPACE}{word}");
        let start_len = out.len();
        let mut i = 0;
        'outer: while i < word.len() {
            let mut j = word.len().min(i + self.max_len);
            while j > i {
                if let Some(&id) = word.get(i..j).and_then(|p| self.ids.get(p)) {
                    out.push(id);
                    i = j;
                    continue 'outer;
                }
                j -= 1;
            }
            out.truncate(start_len);
            break;
        }
        if out.len() == start_len {
            out.extend(self.unk);
        }
    }
}

/// llama.cpp's `preprocess`: the normalized words of `text`.
fn words(text: &str) -> Vec<String> {
    let cls = classes();
    let mut words = vec![String::new()];
    let mut buf = [0u8; 4];
    for c in text.chars() {
        let c = nfd_first(c);
        if c.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        let s = c.encode_utf8(&mut buf);
        if c == '\0' || c == '\u{FFFD}' || cls.control.is_match(s) || cls.mark.is_match(s) {
            continue;
        }
        let lower = c.to_lowercase().next().unwrap_or(c);
        if cls.punctuation.is_match(s) || (c.is_ascii() && cls.symbol.is_match(s)) || is_chinese(c)
        {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            words.last_mut().expect("a word").push(lower);
            words.push(String::new());
        } else {
            words.last_mut().expect("a word").push(lower);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}
