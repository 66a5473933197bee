//! `Attention`: a block's self-attention: q/k/v projections, RoPE, the write of new
//! keys and values into the paged cache, paged attention and the output projection.

use super::{sized, Loader, Step};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::attention::{paged_attention, AttnShape};
use crate::kv_cache::KvCache;
use crate::weights::Linear;

pub(super) struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    output: Linear,
    shape: AttnShape,
}

/// Attention's activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub(super) struct AttnScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
}

impl Attention {
    /// Loads `{prefix}.attn_q`, `attn_k`, `attn_v` and `attn_output`.
    pub(super) fn new(ld: &mut Loader, prefix: &str, c: &ModelConfig) -> Result<Self> {
        let (h, q, kv) = (c.hidden_size, c.q_size(), c.kv_size());
        Ok(Attention {
            q: ld.linear(&format!("{prefix}.attn_q"), q, h, c.qkv_bias)?,
            k: ld.linear(&format!("{prefix}.attn_k"), kv, h, c.qkv_bias)?,
            v: ld.linear(&format!("{prefix}.attn_v"), kv, h, c.qkv_bias)?,
            output: ld.linear(&format!("{prefix}.attn_output"), h, q, false)?,
            shape: AttnShape {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
            },
        })
    }

    /// `xn` is the normed input `[T, hidden]`; writes this step's keys and values
    /// into `cache` at `layer` and the projected attention `[T, hidden]` into `out`.
    pub(super) fn forward(
        &self,
        xn: &[f32],
        step: &Step,
        cache: &mut KvCache,
        layer: usize,
        s: &mut AttnScratch,
        out: &mut [f32],
    ) {
        let t = step.num_tokens;
        let (qn, kvn) = (self.q.n_out, self.k.n_out);
        let q = sized(&mut s.q, t * qn);
        let k = sized(&mut s.k, t * kvn);
        let v = sized(&mut s.v, t * kvn);
        self.q.forward(xn, t, q);
        self.k.forward(xn, t, k);
        self.v.forward(xn, t, v);
        for seq in &step.batch.seqs {
            let table = step.batch.block_table(seq);
            for i in 0..seq.num_tokens {
                let (ti, pos) = (seq.token_start + i, seq.position(i));
                step.rope.apply(&mut q[ti * qn..(ti + 1) * qn], pos);
                let kt = &mut k[ti * kvn..(ti + 1) * kvn];
                step.rope.apply(kt, pos);
                let slot = cache.slot(table, pos);
                cache.write(layer, slot, kt, &v[ti * kvn..(ti + 1) * kvn]);
            }
        }
        let attn = sized(&mut s.attn, t * qn);
        paged_attention(
            step.batch,
            step.token_seq,
            q,
            cache,
            layer,
            self.shape,
            attn,
        );
        self.output.forward(attn, t, out);
    }
}
