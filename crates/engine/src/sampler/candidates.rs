//! The constrained draw over a compact candidate list: the grammar's allowed
//! tokens gathered from the row (ids ascending, sanitised logits), so a row the
//! grammar narrows to a few thousand tokens costs a scan of its bitset plus work
//! on those tokens, not O(V) passes over a masked copy.
//!
//! Exactness: every kernel run on the candidates gives bit-for-bit what it gave on
//! the masked copy (`-inf` outside the mask), so a seed draws the same token either
//! way. The kernels that are order-independent or whose order is the ids' order
//! (max, argmax, top-k ≤ 64, the nucleus's sorts, min-p) run unchanged on the
//! compact row; the two whose floating-point sums group by position in the row
//! (the block sums of the dense draw and of top-p's normaliser, and top-p's
//! even/odd histograms) group the candidates by their ids here, as the full row
//! would (a disallowed token's weight is exactly 0 and adding it changes no sum).

use std::ops::Range;

use super::draw::weights_into;
use super::*;

/// The allowed tokens of one row.
#[derive(Default)]
pub(super) struct Candidates {
    /// Token ids, ascending.
    pub(super) ids: Vec<u32>,
    /// Their sanitised (then penalised) logits.
    pub(super) vals: Vec<f32>,
    /// `starts[b]..starts[b + 1]`: the candidates in the row's `BLOCK` `b`.
    starts: Vec<u32>,
    /// Length of the full row.
    pub(super) n: usize,
}

/// Mask words per `BLOCK`.
const WORDS_PER_BLOCK: usize = BLOCK / 32;

impl Candidates {
    /// Gathers the `count` tokens of `src` that `mask` allows (bit `i % 32` of word
    /// `i / 32`; tokens past the mask, or past the row, are disallowed), sanitised.
    /// `count` is `allowed_count` of the mask's words that cover the row, the bits
    /// past the row clear (as [`super::constraint::Constrained::fill`] leaves them).
    pub(super) fn gather(&mut self, src: &[f32], mask: &[u32], count: usize) {
        let n = src.len();
        self.n = n;
        // 32 slots of slack: a mixed word is compacted branch-free, writing each of
        // its values at the next free slot before deciding whether to keep it.
        self.ids.clear();
        self.vals.clear();
        self.ids.resize(count + 32, 0);
        self.vals.resize(count + 32, 0.0);
        self.starts.clear();
        let mut pos = 0usize;
        for (k, s) in src.chunks(32).enumerate() {
            if k % WORDS_PER_BLOCK == 0 {
                self.starts.push(pos as u32);
            }
            let w = mask.get(k).copied().unwrap_or(0) & word_tail(n, k);
            if w == 0 {
                continue;
            }
            let base = (k * 32) as u32;
            let (ids, vals) = (&mut self.ids[pos..pos + 32], &mut self.vals[pos..pos + 32]);
            if w == u32::MAX {
                for (j, ((d, v), &x)) in ids.iter_mut().zip(vals.iter_mut()).zip(s).enumerate() {
                    *d = base + j as u32;
                    *v = sanitize(x);
                }
                pos += 32;
            } else if w.count_ones() <= 6 {
                let mut w = w;
                let mut p = 0;
                while w != 0 {
                    let j = w.trailing_zeros() as usize;
                    ids[p] = base + j as u32;
                    vals[p] = sanitize(s[j]);
                    p += 1;
                    w &= w - 1;
                }
                pos += p;
            } else {
                let mut p = 0usize;
                for (j, &x) in s.iter().enumerate() {
                    // p ≤ popcount(w) - 1 ≤ 30 while a kept value remains.
                    let p31 = p & 31;
                    ids[p31] = base + j as u32;
                    vals[p31] = sanitize(x);
                    p += ((w >> j) & 1) as usize;
                }
                pos += p;
            }
        }
        self.starts.push(pos as u32);
        self.ids.truncate(pos);
        self.vals.truncate(pos);
    }

    /// The candidate index of token `id`, if allowed.
    pub(super) fn index(&self, id: u32) -> Option<usize> {
        let b = id as usize / BLOCK;
        if b + 1 >= self.starts.len() {
            return None;
        }
        let r = self.block(b);
        let lo = r.start;
        self.ids[r].binary_search(&id).ok().map(|j| lo + j)
    }

    fn blocks(&self) -> usize {
        self.starts.len() - 1
    }

    fn block(&self, b: usize) -> Range<usize> {
        self.starts[b] as usize..self.starts[b + 1] as usize
    }

    /// The per-block sums of the weights `w` (indexed like `ids`) as the full row's
    /// `w.chunks(BLOCK).map(block_sum)` would give them; returns their f64 total.
    pub(super) fn weight_sums(&self, w: &[f32]) -> f64 {
        (0..self.blocks())
            .map(|b| self.block_sum_of(b, &w[self.block(b)]) as f64)
            .sum()
    }

    /// The dense draw's block sums (see `dense_block_sums`) over the candidates'
    /// values `vals`; returns the total.
    pub(super) fn dense_block_sums(&self, inv_t: f32, m: f32, sums: &mut Vec<f32>) -> f64 {
        let mut buf = [0.0f32; BLOCK];
        sums.clear();
        for b in 0..self.blocks() {
            let r = self.block(b);
            let e = &mut buf[..r.len()];
            weights_into(e, &self.vals[r], inv_t, m);
            sums.push(self.block_sum_of(b, e));
        }
        sums.iter().map(|&s| s as f64).sum()
    }

    /// What [`block_sum`] gives over the full row's block `b` whose values are 0
    /// except its candidates' weights `e` (`e[j]` for its j-th candidate), adding
    /// the same values in the same lanes in the same order.
    fn block_sum_of(&self, b: usize, e: &[f32]) -> f32 {
        let start = self.starts[b] as usize;
        let len = BLOCK.min(self.n - b * BLOCK);
        let ids = &self.ids[start..start + e.len()];
        if e.len() == len {
            return block_sum(e);
        }
        if e.len() * 4 > len {
            let mut buf = [0.0f32; BLOCK];
            for (&id, &p) in ids.iter().zip(e) {
                buf[id as usize % BLOCK] = p;
            }
            return block_sum(&buf[..len]);
        }
        let full = len - len % LANES;
        let mut acc = [0.0f32; LANES];
        let mut rem = [0.0f32; LANES];
        let mut nrem = 0;
        for (&id, &p) in ids.iter().zip(e) {
            let j = id as usize % BLOCK;
            if j < full {
                acc[j % LANES] += p;
            } else {
                rem[nrem] = p;
                nrem += 1;
            }
        }
        acc.iter().chain(&rem[..nrem]).sum()
    }

    /// The candidate at cumulative weight `u` (see `walk_block_sums`).
    pub(super) fn walk_block_sums(&self, inv_t: f32, m: f32, sums: &[f32], u: f64) -> usize {
        let mut buf = [0.0f32; BLOCK];
        let mut acc = 0.0f64;
        for (b, &s) in sums.iter().enumerate() {
            let s = s as f64;
            if s > 0.0 && u < acc + s {
                let r = self.block(b);
                let e = &mut buf[..r.len()];
                weights_into(e, &self.vals[r.clone()], inv_t, m);
                let mut a = acc;
                let mut last = 0;
                for (j, &p) in e.iter().enumerate() {
                    if p > 0.0 {
                        a += p as f64;
                        last = j;
                        if u < a {
                            break;
                        }
                    }
                }
                return r.start + last;
            }
            acc += s;
        }
        let Some(b) = sums.iter().rposition(|&s| s > 0.0) else {
            return 0;
        };
        let r = self.block(b);
        let e = &mut buf[..r.len()];
        weights_into(e, &self.vals[r.clone()], inv_t, m);
        r.start + e.iter().rposition(|&p| p > 0.0).unwrap_or(0)
    }
}

/// The bits of mask word `k` that stand for tokens of a row of `n`.
#[inline]
fn word_tail(n: usize, k: usize) -> u32 {
    let left = n.saturating_sub(k * 32);
    if left >= 32 {
        u32::MAX
    } else {
        (1u32 << left) - 1
    }
}

/// Where penalties and biases write: the masked copy of the row, or the candidates.
pub(super) trait Slots {
    fn slot(&mut self, id: u32) -> Option<&mut f32>;
}

impl Slots for Vec<f32> {
    #[inline]
    fn slot(&mut self, id: u32) -> Option<&mut f32> {
        self.get_mut(id as usize)
    }
}

impl Slots for Candidates {
    #[inline]
    fn slot(&mut self, id: u32) -> Option<&mut f32> {
        let i = self.index(id)?;
        self.vals.get_mut(i)
    }
}
