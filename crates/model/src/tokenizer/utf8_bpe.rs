//! `Utf8Bpe`: the BPE of GGUF files with `tokenizer.ggml.model = "gemma4"`, encoding as
//! llama.cpp's `llm_tokenizer_bpe_session` does for them: spaces escaped to U+2581, the
//! text split into runs of newlines and runs of anything else (no word splitting), a run
//! of newlines that is a vocabulary entry taken whole, merges by rank over the raw UTF-8
//! characters of each run, and byte fallback (`<0xNN>`) for what no token covers.
//! Decoding is SentencePiece's (`spm::token_bytes`).

use std::cmp::Reverse;
use std::collections::HashMap;

use super::merge::merge;
use super::special::{Fragment, SpecialTokens};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

pub(crate) struct Utf8Bpe {
    /// Token text -> id (the last id wins on duplicates, as in llama.cpp).
    ids: HashMap<String, u32>,
    /// (left, right) -> merge rank; the first rank wins on duplicates.
    ranks: HashMap<(String, String), u32>,
    /// The `<0xNN>` token of each byte, if any.
    byte_ids: [Option<u32>; 256],
    specials: SpecialTokens,
}

impl Utf8Bpe {
    pub(crate) fn new(
        tokens: &[String],
        merges: Vec<(String, String)>,
        specials: SpecialTokens,
    ) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        // llama.cpp looks the byte tokens up by their text, whatever their type.
        let byte_ids = std::array::from_fn(|b| ids.get(&format!("<0x{b:02X}>")).copied());
        let mut ranks = HashMap::with_capacity(merges.len());
        for (rank, pair) in merges.into_iter().enumerate() {
            ranks.entry(pair).or_insert(rank as u32);
        }
        Utf8Bpe {
            ids,
            ranks,
            byte_ids,
            specials,
        }
    }

    /// Appends the tokens of `text` to `out` (no BOS/EOS). With `parse_special`,
    /// control-token texts become their ids; user-defined tokens always do.
    pub(crate) fn encode(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => {
                    let escaped = t.replace(' ', SPACE);
                    let mut rest = escaped.as_str();
                    while let Some(first) = rest.chars().next() {
                        let newlines = first == '\n';
                        let end = rest
                            .find(|c: char| (c == '\n') != newlines)
                            .unwrap_or(rest.len());
                        self.word(&rest[..end], newlines, out);
                        rest = &rest[end..];
                    }
                }
            }
        }
    }

    /// One run: merged by rank, then each piece as its token or its bytes' tokens.
    fn word(&self, word: &str, newlines: bool, out: &mut Vec<u32>) {
        if newlines {
            if let Some(&id) = self.ids.get(word) {
                out.push(id);
                return;
            }
        }
        // The lowest rank merges first (llama.cpp's `llm_bigram_bpe`).
        let rank = |_: &str, l: &str, r: &str| {
            let key = (l.to_string(), r.to_string());
            self.ranks.get(&key).map(|&rank| Reverse(rank))
        };
        merge(word, rank, |piece| match self.ids.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
        });
    }
}
