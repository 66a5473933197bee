//! The symbol merge that llama.cpp's SentencePiece (`llm_tokenizer_spm`) and BPE
//! (`llm_tokenizer_bpe`) tokenizers share: a text's UTF-8 characters as linked
//! symbols, adjacent pairs merged best first (then leftmost) until no pair scores,
//! then each remaining piece given to the caller in order. The tokenizers differ only
//! in how a pair scores (a vocabulary entry's score, a merge's rank).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A run of the text's bytes `start..start + len`, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the highest `priority` first, then the leftmost.
struct Candidate<P> {
    left: usize,
    right: usize,
    priority: P,
    size: usize,
}

impl<P: Ord> PartialEq for Candidate<P> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<P: Ord> Eq for Candidate<P> {}
impl<P: Ord> PartialOrd for Candidate<P> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<P: Ord> Ord for Candidate<P> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.priority
            .cmp(&o.priority)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// Merges `text`'s characters by `priority(joined, left, right)` (`None`: the pair
/// does not merge) and gives each final piece to `emit`, left to right.
pub(super) fn merge<P: Ord>(
    text: &str,
    priority: impl Fn(&str, &str, &str) -> Option<P>,
    mut emit: impl FnMut(&str),
) {
    let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, ch)) in text.char_indices().enumerate() {
        let len = ch.len_utf8();
        syms.push(Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next: (start + len < text.len()).then_some(i + 1),
        });
    }
    let candidate = |syms: &[Symbol], left: usize, right: usize| {
        let (l, r) = (syms[left], syms[right]);
        let joined = &text[l.start..r.start + r.len];
        let (a, b) = joined.split_at(l.len);
        priority(joined, a, b).map(|priority| Candidate {
            left,
            right,
            priority,
            size: joined.len(),
        })
    };
    let mut queue = BinaryHeap::new();
    for i in 1..syms.len() {
        queue.extend(candidate(&syms, i - 1, i));
    }
    while let Some(c) = queue.pop() {
        let (l, r) = (syms[c.left], syms[c.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != c.size {
            continue;
        }
        syms[c.left].len += r.len;
        syms[c.right].len = 0;
        syms[c.left].next = r.next;
        if let Some(n) = r.next {
            syms[n].prev = Some(c.left);
        }
        if let Some(p) = l.prev {
            queue.extend(candidate(&syms, p, c.left));
        }
        if let Some(n) = r.next {
            queue.extend(candidate(&syms, c.left, n));
        }
    }
    let mut at = (!syms.is_empty()).then_some(0);
    while let Some(i) = at {
        let s = syms[i];
        emit(&text[s.start..s.start + s.len]);
        at = s.next;
    }
}
