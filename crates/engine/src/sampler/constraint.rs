//! The constrained-decoding hook: the per-sequence [`TokenConstraint`] the sampler
//! masks each logits row with, and the shared [`ConstraintFactory`] a request carries
//! (one compiled grammar, a fresh matcher per sequence). The engine knows no grammar
//! engine; `sloserve-grammar` implements these traits on llguidance.
//!
//! Semantics in the [`super::Sampler`]: before the draw, disallowed tokens get
//! `-inf` on the working copy (before penalties, temperature, top-k/p, min-p); the
//! returned `logprob` / `top_logprobs` stay those of the RAW distribution (vLLM's
//! default `raw_logprobs`). After the draw the token is committed. A mask error, an
//! empty mask or a refused commit ends the sequence with `FinishReason::Error`; a
//! grammar that is finished after the commit ends it with `FinishReason::Stop`.

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
}

impl Constrained {
    pub fn new(matcher: Box<dyn TokenConstraint>) -> Self {
        Constrained {
            matcher,
            mask: Vec::new(),
            end: None,
        }
    }

    /// Fills the mask for a row of `n` logits; false when the draw must ignore it
    /// (nothing allowed). Records an error as the sequence's end.
    pub fn fill(&mut self, n: usize) -> bool {
        self.mask.resize(n.div_ceil(32), 0);
        if let Err(e) = self.matcher.fill_mask(&mut self.mask) {
            self.fail(format!("constrained decoding: {e}"));
        }
        let any = self.mask.iter().any(|&w| w != 0);
        if !any {
            self.fail("constrained decoding: the grammar allows no next token".into());
        }
        any
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
            self.end = Some(FinishReason::Error(msg));
        }
    }
}

/// `dst` = `src` sanitised (NaN → -inf, +inf → `f32::MAX`), `-inf` where `mask`
/// disallows; tokens past the mask are disallowed. Branch-free inside a word, the
/// shift masked so dev builds need no overflow check: a per-bit branch made the
/// typical string mask (mostly-full words with a few holes) several times slower
/// on the 152k Qwen row.
pub(super) fn masked_copy(dst: &mut Vec<f32>, src: &[f32], mask: &[u32]) {
    use super::kernels::sanitize;
    dst.clear();
    dst.resize(src.len(), f32::NEG_INFINITY);
    for (k, (d, s)) in dst.chunks_mut(32).zip(src.chunks(32)).enumerate() {
        let w = mask.get(k).copied().unwrap_or(0);
        if w == 0 {
            continue;
        }
        if w == u32::MAX {
            for (d, &x) in d.iter_mut().zip(s) {
                *d = sanitize(x);
            }
            continue;
        }
        for (j, (d, &x)) in d.iter_mut().zip(s).enumerate() {
            let y = sanitize(x);
            *d = if (w >> (j & 31)) & 1 == 1 {
                y
            } else {
                f32::NEG_INFINITY
            };
        }
    }
}
