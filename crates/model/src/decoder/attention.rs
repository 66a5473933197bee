//! `Attention`: a block's self-attention: q/k/v projections, per-head q/k norms (where
//! the model has them), RoPE, the write of new keys and values into the paged cache
//! (turned by a Hadamard rotation first when the cache is quantized), paged attention
//! (over a sliding window on local layers; with sinks where the model has them) and
//! the output projection.

use super::fused::FusedLinear;
use super::{sized, Loader, Step};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::attention::{paged_attention_sinks, AttnShape};
use crate::kernels::hadamard::{kv_rotation, rotate};
use crate::kernels::norm::rms_norm_in_place;
use crate::kernels::pool::{parallel_rows, ROWS_PER_TASK};
use crate::kv_cache::KvCache;
use crate::linear::{first_switch, Linear};

pub(super) struct Attention {
    /// q, k and v projections (parts 0, 1, 2).
    qkv: FusedLinear,
    output: Linear,
    /// `attn_q_norm` and `attn_k_norm`, one weight per head dimension.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    eps: f32,
    /// Index into `Step::ropes`: 0 global, 1 local (sliding-window) layers.
    rope: usize,
    /// `attn_sinks`: one logit per query head (gpt-oss).
    sinks: Option<Vec<f32>>,
    shape: AttnShape,
}

/// Attention's activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub(super) struct AttnScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
}

impl Attention {
    /// Loads `blk.{layer}.attn_q`, `attn_k`, `attn_v` (or them fused, `attn_qkv`) and
    /// `attn_output` (and the q/k norms).
    pub(super) fn new(ld: &mut Loader, layer: usize, c: &ModelConfig) -> Result<Self> {
        let (h, q, kv) = (c.hidden_size, c.q_size(), c.kv_size());
        let prefix = format!("blk.{layer}");
        let window = c.layer_window(layer);
        let qk_norm = if c.qk_norm {
            Some((
                ld.vector(&format!("{prefix}.attn_q_norm.weight"), c.head_dim)?,
                ld.vector(&format!("{prefix}.attn_k_norm.weight"), c.head_dim)?,
            ))
        } else {
            None
        };
        let sinks = match c.family.attn_sinks {
            true => Some(ld.vector(&format!("{prefix}.attn_sinks.weight"), c.num_heads)?),
            false => None,
        };
        let out_bias = c.family.attn_output_bias;
        let fused = format!("{prefix}.attn_qkv");
        let qkv = if ld.file.has_tensor(&format!("{fused}.weight")) {
            // q, k and v rows in one matrix (phi3), as llama.cpp's `create_tensor_qkv`
            // reads it for any family: with its bias, else q/k/v's own, where present.
            let bias = if ld.file.has_tensor(&format!("{fused}.bias")) {
                Some(ld.vector(&format!("{fused}.bias"), q + 2 * kv)?)
            } else if ld.file.has_tensor(&format!("{prefix}.attn_q.bias")) {
                let mut b = ld.vector(&format!("{prefix}.attn_q.bias"), q)?;
                b.extend(ld.vector(&format!("{prefix}.attn_k.bias"), kv)?);
                b.extend(ld.vector(&format!("{prefix}.attn_v.bias"), kv)?);
                Some(b)
            } else {
                None
            };
            FusedLinear::stacked(ld, &fused, vec![q, kv, kv], h, bias)?
        } else {
            FusedLinear::load(
                ld,
                &[
                    (format!("{prefix}.attn_q"), q),
                    (format!("{prefix}.attn_k"), kv),
                    (format!("{prefix}.attn_v"), kv),
                ],
                h,
                c.qkv_bias,
            )?
        };
        Ok(Attention {
            qk_norm,
            sinks,
            eps: c.rms_norm_eps,
            rope: usize::from(window.is_some()),
            qkv,
            output: ld.linear(&format!("{prefix}.attn_output"), h, q, out_bias)?,
            shape: AttnShape {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window,
            },
        })
    }

    /// `xn` is the normed input `[T, hidden]`; writes this step's keys and values
    /// into `cache` at `layer` and the projected attention `[T, hidden]` into `out`.
    /// Where its batches leave the quantized path (`Linear::small_batch_max_rows`).
    pub(super) fn small_batch_max_rows(&self) -> Option<usize> {
        first_switch(
            self.qkv.small_batch_max_rows(),
            self.output.small_batch_max_rows(),
        )
    }

    pub(super) fn forward(
        &self,
        xn: &[f32],
        step: &Step,
        cache: &mut KvCache,
        layer: usize,
        s: &mut AttnScratch,
        out: &mut [f32],
    ) {
        let t = step.tokens.n;
        let (qn, kvn) = (self.qkv.width(0), self.qkv.width(1));
        let q = sized(&mut s.q, t * qn);
        let k = sized(&mut s.k, t * kvn);
        let v = sized(&mut s.v, t * kvn);
        let mut outs = [q, k, v];
        self.qkv.forward(xn, step.tokens, &mut s.qkv, &mut outs);
        let [q, k, v] = outs;
        if let Some((qn_w, kn_w)) = &self.qk_norm {
            rms_norm_in_place(q, qn_w, self.eps);
            rms_norm_in_place(k, kn_w, self.eps);
        }
        let rope = &step.ropes[self.rope];
        let pos = |ti: usize| {
            let seq = &step.batch.seqs[step.token_seq[ti] as usize];
            seq.position(ti - seq.token_start)
        };
        for (x, width) in [(&mut *q, qn), (&mut *k, kvn)] {
            parallel_rows(x, width, ROWS_PER_TASK, &|t0, x| {
                for (i, row) in x.chunks_exact_mut(width).enumerate() {
                    rope.apply(row, pos(t0 + i));
                }
            });
        }
        // A quantized cache holds keys and values turned by a Hadamard rotation (as
        // llama.cpp's): the queries turn with the keys, the output turns back below.
        let rotation = match cache.dtype.is_quantized() {
            true => kv_rotation(self.shape.head_dim),
            false => None,
        };
        if let Some((nk, nv)) = rotation {
            rotate(q, nk);
            rotate(k, nk);
            rotate(v, nv);
        }
        for seq in &step.batch.seqs {
            let table = step.batch.block_table(seq);
            for i in 0..seq.num_tokens {
                let ti = seq.token_start + i;
                let slot = cache.slot(table, seq.position(i));
                cache.write(layer, slot, &k[ti * kvn..][..kvn], &v[ti * kvn..][..kvn]);
            }
        }
        let attn = sized(&mut s.attn, t * qn);
        paged_attention_sinks(
            step.batch,
            step.token_seq,
            q,
            cache,
            layer,
            self.shape,
            self.sinks.as_deref(),
            attn,
        );
        if let Some((_, nv)) = rotation {
            rotate(attn, nv);
        }
        self.output.forward(attn, step.tokens, out);
    }
}
