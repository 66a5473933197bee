//! `Block`: one transformer layer, pre-norm attention then pre-norm MLP, each added
//! back into the residual stream (through a post-norm first, where the model has one).

use super::attention::{Attention, AttnScratch};
use super::mlp::{Mlp, MlpScratch};
use super::moe::{Moe, MoeScratch};
use super::{sized, Loader, Step};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::norm::rms_norm;
use crate::kernels::pool::{parallel_rows, ROWS_PER_TASK};
use crate::kv_cache::KvCache;
use crate::linear::first_switch;

pub(super) struct Block {
    attn_norm: Vec<f32>,
    attn: Attention,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
    /// `post_attention_norm` and `post_ffw_norm` (gemma3).
    post_norms: Option<(Vec<f32>, Vec<f32>)>,
    eps: f32,
}

/// A block's activation buffers, grown to the largest batch seen (shared by all
/// blocks, which run one after another).
#[derive(Default)]
pub(super) struct BlockScratch {
    xn: Vec<f32>,
    proj: Vec<f32>,
    post: Vec<f32>,
    attn: AttnScratch,
    mlp: MlpScratch,
    moe: MoeScratch,
}

/// A block's feed-forward: one dense MLP, or a mixture of experts.
enum Ffn {
    Dense(Box<Mlp>),
    Experts(Box<Moe>),
}

impl Block {
    /// Loads the tensors of `blk.{index}`.
    pub(super) fn new(ld: &mut Loader, index: usize, c: &ModelConfig) -> Result<Self> {
        let (p, h) = (format!("blk.{index}"), c.hidden_size);
        Ok(Block {
            attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), h)?,
            attn: Attention::new(ld, index, c)?,
            ffn_norm: ld.vector(&format!("{p}.{}.weight", c.family.ffn_norm), h)?,
            ffn: match c.moe {
                None => Ffn::Dense(Box::new(Mlp::new(ld, &p, c)?)),
                Some(m) => Ffn::Experts(Box::new(Moe::new(ld, &p, c, m)?)),
            },
            post_norms: if c.post_norms {
                Some((
                    ld.vector(&format!("{p}.post_attention_norm.weight"), h)?,
                    ld.vector(&format!("{p}.post_ffw_norm.weight"), h)?,
                ))
            } else {
                None
            },
            eps: c.rms_norm_eps,
        })
    }

    /// Where its batches leave the quantized path (`Linear::small_batch_max_rows`).
    pub(super) fn small_batch_max_rows(&self) -> Option<usize> {
        let ffn = match &self.ffn {
            Ffn::Dense(m) => m.small_batch_max_rows(),
            Ffn::Experts(m) => m.small_batch_max_rows(),
        };
        first_switch(self.attn.small_batch_max_rows(), ffn)
    }

    /// With experts: whether they run in two jobs a step (`Moe::in_two_jobs`).
    pub(super) fn experts_in_two_jobs(&self) -> Option<bool> {
        match &self.ffn {
            Ffn::Dense(_) => None,
            Ffn::Experts(m) => Some(m.in_two_jobs()),
        }
    }

    /// Runs layer `layer` over the residual stream `x` (`[T, hidden]`), in place.
    pub(super) fn forward(
        &self,
        x: &mut [f32],
        step: &Step,
        cache: &mut KvCache,
        layer: usize,
        s: &mut BlockScratch,
    ) {
        let n = step.tokens.n * self.attn_norm.len();
        let xn = sized(&mut s.xn, n);
        let proj = sized(&mut s.proj, n);
        rms_norm(x, &self.attn_norm, self.eps, xn);
        self.attn.forward(xn, step, cache, layer, &mut s.attn, proj);
        self.residual(x, proj, 0, &mut s.post);
        rms_norm(x, &self.ffn_norm, self.eps, xn);
        match &self.ffn {
            Ffn::Dense(m) => m.forward(xn, step.tokens, &mut s.mlp, proj),
            Ffn::Experts(m) => m.forward(xn, step.tokens, &mut s.moe, proj),
        }
        self.residual(x, proj, 1, &mut s.post);
    }

    /// `x += y`, or `x += rms_norm(y)` with post-norm `which` (0: attention, 1: MLP).
    fn residual(&self, x: &mut [f32], y: &[f32], which: usize, post: &mut Vec<f32>) {
        match &self.post_norms {
            None => add_in_place(x, y, self.attn_norm.len()),
            Some(norms) => {
                let w = if which == 0 { &norms.0 } else { &norms.1 };
                let yn = sized(post, y.len());
                rms_norm(y, w, self.eps, yn);
                add_in_place(x, yn, self.attn_norm.len());
            }
        }
    }
}

/// `x += y`, rows of `h` spread over the pool in large batches.
fn add_in_place(x: &mut [f32], y: &[f32], h: usize) {
    parallel_rows(x, h, ROWS_PER_TASK, &|r0, x| {
        for (a, b) in x.iter_mut().zip(&y[r0 * h..]) {
            *a += b;
        }
    });
}
