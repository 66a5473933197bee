//! The constrained-decoding hook: the per-sequence [`TokenConstraint`] the sampler
//! masks each logits row with, and the shared [`ConstraintFactory`] a request carries
//! (one compiled grammar, a fresh matcher per sequence). The engine knows no grammar
//! engine; `sloserve-grammar` implements these traits on llguidance.
//!
//! Semantics in the [`super::Sampler`]: before the draw, disallowed tokens get
//! `-inf` on the working copy (before penalties, temperature, top-k/p, min-p); the
//! returned `logprob` / `top_logprobs` stay those of the RAW distribution (vLLM's
//! default `raw_logprobs`). After the draw the token is committed. A mask error, an
//! empty mask or a refused commit ends the sequence with `FinishReason::Constraint`
//! (the client's constraint, not an engine failure), and the token of that draw is
//! never sent (`Sequence::emit`); a grammar that is finished after the commit ends
//! it with `FinishReason::Stop`.

use std::fmt;
use std::sync::Arc;

use crate::event::FinishReason;

/// One sequence's grammar state. Bit `i % 32` of word `i / 32` of a mask stands for
/// token `i` (1: allowed).
pub trait TokenConstraint: Send + Sync {
    /// Fills `allowed` (all of it; `vocab.div_ceil(32)` words, not zeroed by the
    /// caller) with the tokens the grammar allows next. An `Err` ends the sequence;
    /// the sampler still draws from what was filled when it is not empty (an
    /// implementation may allow only EOS there).
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String>;
    /// Advances the grammar by the sampled token.
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// The grammar is complete and can take no further token: stop (reason `Stop`).
    fn is_finished(&self) -> bool;
    /// Tokens the grammar forces next (fast-forward), without committing them.
    fn forced_tokens(&mut self) -> Vec<u32> {
        Vec::new()
    }
    /// Undoes the last `n` committed tokens (speculation).
    fn rollback(&mut self, n: usize) -> Result<(), String> {
        Err(format!("rollback of {n} tokens is not supported"))
    }
}

/// A compiled constraint shared by the requests (and choices) that use it.
pub trait ConstraintFactory: Send + Sync + fmt::Debug {
    /// A fresh matcher at the start of the grammar.
    fn matcher(&self) -> Box<dyn TokenConstraint>;
}

/// What a [`crate::Request`] carries.
pub type SharedConstraint = Arc<dyn ConstraintFactory>;

/// The constraint of one sampler with its reused mask buffer.
pub(super) struct Constrained {
    pub matcher: Box<dyn TokenConstraint>,
    pub mask: Vec<u32>,
    pub end: Option<FinishReason>,
    /// How long the latest [`Constrained::timed_fill`] took.
    pub mask_time: Option<std::time::Duration>,
}

impl Constrained {
    pub fn new(matcher: Box<dyn TokenConstraint>) -> Self {
        Constrained {
            matcher,
            mask: Vec::new(),
            end: None,
            mask_time: None,
        }
    }

    /// [`Constrained::fill`], timed into `mask_time`.
    pub fn timed_fill(&mut self, n: usize) -> usize {
        let t = std::time::Instant::now();
        let allowed = self.fill(n);
        self.mask_time = Some(t.elapsed());
        allowed
    }

    /// Fills the mask for a row of `n` logits; returns how many tokens of the row
    /// it allows (0: the draw must ignore it). Records an error as the sequence's
    /// end.
    pub fn fill(&mut self, n: usize) -> usize {
        self.mask.resize(n.div_ceil(32), 0);
        if let Err(e) = self.matcher.fill_mask(&mut self.mask) {
            self.fail(format!("constrained decoding: {e}"));
        }
        // Bits past the row stand for no token.
        if !n.is_multiple_of(32) {
            if let Some(w) = self.mask.last_mut() {
                *w &= (1u32 << (n % 32)) - 1;
            }
        }
        let allowed = allowed_count(&self.mask);
        if allowed == 0 {
            self.fail("constrained decoding: the grammar allows no next token".into());
        }
        allowed
    }

    /// Commits the drawn token; a finished grammar ends the sequence with `Stop`.
    pub fn commit(&mut self, token: u32) {
        if self.end.is_some() {
            return;
        }
        if let Err(e) = self.matcher.commit(token) {
            self.fail(format!("constrained decoding: token {token} refused: {e}"));
        } else if self.matcher.is_finished() {
            self.end = Some(FinishReason::Stop);
        }
    }

    fn fail(&mut self, msg: String) {
        if self.end.is_none() {
            self.end = Some(FinishReason::Constraint(msg));
        }
    }
}

/// Tokens a mask allows.
pub(super) fn allowed_count(mask: &[u32]) -> usize {
    mask.iter().map(|w| w.count_ones() as usize).sum()
}

/// The token of a mask that allows one (0 if none).
pub(super) fn only_allowed(mask: &[u32]) -> u32 {
    match mask.iter().position(|&w| w != 0) {
        Some(k) => (k * 32) as u32 + mask[k].trailing_zeros(),
        None => 0,
    }
}

/// `BIT[j] = 1 << j`: testing bit j of a word against a constant vectorises.
const BIT: [u32; 32] = {
    let mut b = [0u32; 32];
    let mut j = 0;
    while j < 32 {
        b[j] = 1 << j;
        j += 1;
    }
    b
};

/// `src[j]` sanitised where bit j of `w` is set, `-inf` elsewhere.
#[inline(always)]
fn masked(w: u32, j: usize, x: f32) -> f32 {
    use super::kernels::sanitize;
    if w & BIT[j & 31] != 0 {
        sanitize(x)
    } else {
        f32::NEG_INFINITY
    }
}

/// Per-position maxima of `s` where `w` allows (NaN ignored, +inf kept: the
/// caller sanitises the reduction) into `acc`. Vectorises.
#[inline(always)]
fn masked_max_into(acc: &mut [f32; 32], w: u32, s: &[f32]) {
    for (j, (a, &x)) in acc.iter_mut().zip(s).enumerate() {
        let y = if w & BIT[j & 31] != 0 {
            x
        } else {
            f32::NEG_INFINITY
        };
        *a = if y > *a { y } else { *a };
    }
}

/// The argmax of the masked row (what `argmax` of [`masked_copy`] gives: the
/// lowest id among the maxima) in two scans of the row and the mask (the second
/// stops at the max), no copy; a row whose allowed tokens are all `-inf` gives the
/// first allowed token (the copy's argmax gave token 0, allowed or not).
pub(super) fn masked_argmax(src: &[f32], mask: &[u32]) -> u32 {
    use super::kernels::{max_of, sanitize};
    let mut acc = [f32::NEG_INFINITY; 32];
    for (k, s) in src.chunks(32).enumerate() {
        let w = mask.get(k).copied().unwrap_or(0);
        if w != 0 {
            masked_max_into(&mut acc, w, s);
        }
    }
    let best = sanitize(max_of(&acc));
    for (k, s) in src.chunks(32).enumerate() {
        let w = mask.get(k).copied().unwrap_or(0);
        if w == 0 {
            continue;
        }
        if best == f32::NEG_INFINITY {
            return (k * 32) as u32 + w.trailing_zeros();
        }
        let mut c = [f32::NEG_INFINITY; 32];
        masked_max_into(&mut c, w, s);
        if sanitize(max_of(&c)) == best {
            let j = (0..s.len())
                .find(|&j| w & BIT[j] != 0 && sanitize(s[j]) == best)
                .unwrap_or(0);
            return (k * 32 + j) as u32;
        }
    }
    0
}

/// `dst` = `src` sanitised (NaN → -inf, +inf → `f32::MAX`), `-inf` where `mask`
/// disallows; tokens past the mask are disallowed. Returns the max of `dst`. Each
/// value is written once; branch-free inside a word (a per-bit branch made the
/// typical string mask, mostly-full words with a few holes, several times slower
/// on the 152k Qwen row).
pub(super) fn masked_copy(dst: &mut Vec<f32>, src: &[f32], mask: &[u32]) -> f32 {
    use super::kernels::{max_of, sanitize};
    dst.resize(src.len(), f32::NEG_INFINITY);
    // Per-position maxima over the chunks (vectorised), then one reduction.
    let mut acc = [f32::NEG_INFINITY; 32];
    for (k, (d, s)) in dst.chunks_mut(32).zip(src.chunks(32)).enumerate() {
        let w = mask.get(k).copied().unwrap_or(0);
        if w == 0 {
            d.fill(f32::NEG_INFINITY);
            continue;
        }
        if w == u32::MAX {
            for ((d, &x), a) in d.iter_mut().zip(s).zip(acc.iter_mut()) {
                let y = sanitize(x);
                *d = y;
                *a = if y > *a { y } else { *a };
            }
            continue;
        }
        for (j, ((d, &x), a)) in d.iter_mut().zip(s).zip(acc.iter_mut()).enumerate() {
            let y = masked(w, j, x);
            *d = y;
            *a = if y > *a { y } else { *a };
        }
    }
    max_of(&acc)
}
