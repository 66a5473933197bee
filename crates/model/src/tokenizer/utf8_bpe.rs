//! `Utf8Bpe`: the BPE of GGUF files with `tokenizer.ggml.model = "gemma4"`, encoding as
//! llama.cpp's `llm_tokenizer_bpe_session` does for them: spaces escaped to U+2581, the
//! text split into runs of newlines and runs of anything else (no word splitting), a run
//! of newlines that is a vocabulary entry taken whole, merges by rank over the raw UTF-8
//! characters of each run, and byte fallback (`<0xNN>`) for what no token covers.
//! Decoding is SentencePiece's (`spm::token_bytes`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

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

/// A candidate merge, ordered as llama.cpp's `llm_bigram_bpe`: the lowest rank first,
/// then the leftmost.
struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then_with(|| o.left.cmp(&self.left))
    }
}

/// A run of a word's bytes `start..start + len`, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
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

    fn rank(&self, word: &str, syms: &[Symbol], left: usize, right: usize) -> Option<Bigram> {
        let (l, r) = (syms[left], syms[right]);
        let key = (
            word[l.start..l.start + l.len].to_string(),
            word[r.start..r.start + r.len].to_string(),
        );
        let rank = *self.ranks.get(&key)?;
        Some(Bigram {
            left,
            right,
            rank,
            size: l.len + r.len,
        })
    }

    /// One run: merged by rank, then each piece as its token or its bytes' tokens.
    fn word(&self, word: &str, newlines: bool, out: &mut Vec<u32>) {
        if newlines {
            if let Some(&id) = self.ids.get(word) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<Symbol> = Vec::with_capacity(word.len());
        for (i, (start, ch)) in word.char_indices().enumerate() {
            let len = ch.len_utf8();
            syms.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < word.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        for i in 1..syms.len() {
            queue.extend(self.rank(word, &syms, i - 1, i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            syms[b.left].len += r.len;
            syms[b.right].len = 0;
            syms[b.left].next = r.next;
            if let Some(n) = r.next {
                syms[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                queue.extend(self.rank(word, &syms, p, b.left));
            }
            if let Some(n) = r.next {
                queue.extend(self.rank(word, &syms, b.left, n));
            }
        }
        let mut at = (!syms.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = syms[i];
            let piece = &word[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
            at = s.next;
        }
    }
}
