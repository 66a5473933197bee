//! `Spm`: the SentencePiece tokenizer of GGUF files with `tokenizer.ggml.model =
//! "llama"`, encoding as llama.cpp's `llm_tokenizer_spm` does: special-token
//! partitioning (longest token text first), spaces escaped to U+2581 with an optional
//! leading space, a merge of adjacent symbols by the best-scoring vocabulary entry
//! over UTF-8 characters, and byte fallback (`<0xNN>`) for what no token covers.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::merge::merge;
use super::special::{Fragment, SpecialTokens};

/// GGUF token types (`tokenizer.ggml.token_type`).
pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;
pub(crate) const TYPE_UNUSED: i32 = 5;
pub(crate) const TYPE_BYTE: i32 = 6;

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

pub(crate) struct Spm {
    /// Token text -> id (the last id wins on duplicates, as in llama.cpp).
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The `<0xNN>` token of each byte, if any.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
    specials: SpecialTokens,
}

/// A vocabulary entry's score, totally ordered (`f32::total_cmp`).
struct Score(f32);

impl PartialEq for Score {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Score {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl Spm {
    pub(crate) fn new(
        tokens: &[String],
        scores: Vec<f32>,
        types: &[i32],
        unk: Option<u32>,
        add_space_prefix: bool,
        specials: SpecialTokens,
    ) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        let mut byte_ids = [None; 256];
        for (i, (t, &ty)) in tokens.iter().zip(types).enumerate() {
            ids.insert(t.clone(), i as u32);
            if ty == TYPE_BYTE {
                if let Some(b) = parse_byte_token(t) {
                    byte_ids[b as usize].get_or_insert(i as u32);
                }
            }
        }
        Spm {
            ids,
            scores,
            byte_ids,
            unk,
            add_space_prefix,
            specials,
        }
    }

    /// Appends the tokens of `text` to `out` (no BOS/EOS). With `parse_special`,
    /// control-token texts become their ids; user-defined tokens always do.
    pub(crate) fn encode(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        let mut prev_special = true;
        let mut buf = String::new();
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    buf.clear();
                    if self.add_space_prefix && prev_special {
                        buf.push_str(SPACE);
                    }
                    buf.push_str(&t.replace(' ', SPACE));
                    self.tokenize(&buf, out);
                    prev_special = false;
                }
            }
        }
    }

    /// The bigram merge over the characters of the escaped `text`.
    fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        // The highest-scoring vocabulary entry merges first (llama.cpp's `llm_bigram_spm`).
        let score = |joined: &str, _: &str, _: &str| {
            let id = *self.ids.get(joined)?;
            Some(Score(self.scores.get(id as usize).copied().unwrap_or(0.0)))
        };
        merge(text, score, |piece| match self.ids.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    let byte = self.byte_ids[b as usize]
                        .or_else(|| self.ids.get(&(b as char).to_string()).copied());
                    out.extend(byte.or(self.unk));
                }
            }
        });
    }
}

/// `<0xNN>` -> the byte NN.
pub(crate) fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The bytes a SentencePiece token stands for when decoded: normal tokens with U+2581
/// as a space, byte tokens as their byte, control, unknown and user-defined tokens as
/// their text, unused tokens as nothing.
pub(crate) fn token_bytes(t: &str, ty: i32, out: &mut Vec<u8>) {
    match ty {
        TYPE_UNKNOWN | TYPE_CONTROL | TYPE_USER_DEFINED => out.extend_from_slice(t.as_bytes()),
        TYPE_UNUSED => {}
        TYPE_BYTE => match parse_byte_token(t) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(t.as_bytes()),
        },
        _ => out.extend_from_slice(t.replace(SPACE, " ").as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPE_NORMAL: i32 = 1;

    /// A vocabulary where "ab" outscores "bc", with byte fallback for everything else.
    fn toy() -> Spm {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "a", "b", "c", "ab", "bc", "▁", "▁ab"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut types = vec![TYPE_UNKNOWN, TYPE_CONTROL];
        types.extend([TYPE_NORMAL; 7]);
        let mut scores = vec![0.0, 0.0, -1.0, -1.0, -1.0, -2.0, -3.0, -1.0, -1.5];
        for b in 0..=255u32 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(TYPE_BYTE);
            scores.push(0.0);
        }
        let specials = SpecialTokens::new(&tokens, &types, |_| false);
        Spm::new(&tokens, scores, &types, Some(0), true, specials)
    }

    fn enc(spm: &Spm, text: &str, special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        spm.encode(text, special, &mut out);
        out
    }

    #[test]
    fn merges_by_score_with_byte_fallback() {
        let spm = toy();
        // "▁abc": "▁ab" (-1.5) beats "ab" (-2) and "bc" (-3) once "ab" has formed.
        assert_eq!(enc(&spm, "abc", false), vec![8, 4]);
        // "é" is two bytes, neither a token: byte fallback (0xC3 0xA9 -> ids 9 + byte).
        assert_eq!(enc(&spm, "cé", false), vec![7, 4, 9 + 0xC3, 9 + 0xA9]);
        // Control text is plain text unless parse_special; the text after a special
        // token gets the space prefix again.
        assert_eq!(enc(&spm, "<s>ab", true), vec![1, 8]);
        assert_ne!(enc(&spm, "<s>ab", false)[0], 1);
        assert!(enc(&spm, "", true).is_empty());
    }

    #[test]
    fn decodes_spaces_and_bytes() {
        let mut out = Vec::new();
        token_bytes("▁ab", TYPE_NORMAL, &mut out);
        token_bytes("<0x0A>", TYPE_BYTE, &mut out);
        token_bytes("<unused1>", TYPE_UNUSED, &mut out);
        assert_eq!(out, b" ab\n");
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }
}
