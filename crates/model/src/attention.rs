//! Paged causal attention with grouped-query heads: each new token of each sequence
//! attends over that sequence's own cached tokens, read through its block table.

use rayon::prelude::*;
use sloserve_engine::Batch;

use crate::kv_cache::KvCache;

/// Shapes of one attention layer.
#[derive(Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `q` is `[T, num_heads * head_dim]` (T = new tokens of the batch, RoPE applied);
/// the keys/values of every position up to each token are already in `cache`.
/// Writes `[T, num_heads * head_dim]` into `out`.
pub fn paged_attention(
    batch: &Batch,
    token_seq: &[u32],
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    shape: AttnShape,
    out: &mut [f32],
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let keys = &cache.keys[layer];
    let values = &cache.values[layer];
    let kv_size = cache.kv_size;
    let bs = cache.block_size;
    // One task per (token, head): `out` chunks of head_dim, in token-major order.
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each_init(Vec::<f32>::new, |scores, (idx, o)| {
            let t = idx / num_heads;
            let h = idx % num_heads;
            let s = &batch.seqs[token_seq[t] as usize];
            let table = batch.block_table(s);
            let pos = s.position(t - s.token_start);
            let qh = &q[t * num_heads * head_dim + h * head_dim..][..head_dim];
            let kv_off = (h / group) * head_dim;
            let n = pos + 1;
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in 0..n {
                let slot = table[j / bs] as usize * bs + j % bs;
                let kj = &keys[slot * kv_size + kv_off..][..head_dim];
                let d = dot(qh, kj) * scale;
                max = max.max(d);
                scores.push(d);
            }
            let mut sum = 0f32;
            for x in scores.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            let inv = 1.0 / sum;
            o.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                let slot = table[j / bs] as usize * bs + j % bs;
                let vj = &values[slot * kv_size + kv_off..][..head_dim];
                let w = p * inv;
                for (oi, vi) in o.iter_mut().zip(vj) {
                    *oi += w * vi;
                }
            }
        });
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}
