//! `Block`: one transformer layer, pre-norm attention then pre-norm MLP, each added
//! back into the residual stream.

use super::attention::{Attention, AttnScratch};
use super::mlp::{Mlp, MlpScratch};
use super::{sized, Loader, Step};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::norm::rms_norm;
use crate::kv_cache::KvCache;

pub(super) struct Block {
    attn_norm: Vec<f32>,
    attn: Attention,
    ffn_norm: Vec<f32>,
    mlp: Mlp,
    eps: f32,
}

/// A block's activation buffers, grown to the largest batch seen (shared by all
/// blocks, which run one after another).
#[derive(Default)]
pub(super) struct BlockScratch {
    xn: Vec<f32>,
    proj: Vec<f32>,
    attn: AttnScratch,
    mlp: MlpScratch,
}

impl Block {
    /// Loads the tensors of `blk.{index}`.
    pub(super) fn new(ld: &mut Loader, index: usize, c: &ModelConfig) -> Result<Self> {
        let (p, h) = (format!("blk.{index}"), c.hidden_size);
        Ok(Block {
            attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), h)?,
            attn: Attention::new(ld, &p, c)?,
            ffn_norm: ld.vector(&format!("{p}.ffn_norm.weight"), h)?,
            mlp: Mlp::new(ld, &p, c)?,
            eps: c.rms_norm_eps,
        })
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
        let n = step.num_tokens * self.attn_norm.len();
        let xn = sized(&mut s.xn, n);
        let proj = sized(&mut s.proj, n);
        rms_norm(x, &self.attn_norm, self.eps, xn);
        self.attn.forward(xn, step, cache, layer, &mut s.attn, proj);
        add_in_place(x, proj);
        rms_norm(x, &self.ffn_norm, self.eps, xn);
        self.mlp.forward(xn, step.num_tokens, &mut s.mlp, proj);
        add_in_place(x, proj);
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
