//! An encoder's attention: each position of a sequence attends to every position of
//! the same sequence (no causal mask, no cache), softmax in f32; rows spread over
//! the pool.

use sloserve_engine::Batch;

use crate::config::ModelConfig;
use crate::kernels::pool::parallel_rows;

/// Query rows a pool task takes.
const ROWS_PER_TASK: usize = 4;

/// `ctx[r] = softmax(q_r · K^T · scale) · V` per head, over the keys and values of
/// row `r`'s own sequence (`token_seq[r]` in `batch.seqs`); `q` and `ctx` are
/// `[T, heads · head_dim]`, `k` and `v` `[T, kv_heads · head_dim]`.
pub(super) fn bidirectional(
    c: &ModelConfig,
    batch: &Batch,
    token_seq: &[u32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: &mut [f32],
) {
    let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
    let (q_len, kv_len) = (nh * hd, nkv * hd);
    let group = nh / nkv;
    let longest = batch.seqs.iter().map(|s| s.num_tokens).max().unwrap_or(0);
    parallel_rows(ctx, q_len, ROWS_PER_TASK, &|r0, out| {
        let mut scores = vec![0.0f32; longest];
        for (j, orow) in out.chunks_exact_mut(q_len).enumerate() {
            let r = r0 + j;
            let seq = &batch.seqs[token_seq[r] as usize];
            let (first, n) = (seq.token_start, seq.num_tokens);
            let scores = &mut scores[..n];
            for head in 0..nh {
                let qh = &q[r * q_len + head * hd..][..hd];
                let kv_off = (head / group) * hd;
                let mut max = f32::NEG_INFINITY;
                for (p, s) in scores.iter_mut().enumerate() {
                    let kh = &k[(first + p) * kv_len + kv_off..][..hd];
                    *s = dot(qh, kh) * c.attn_scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oh = &mut orow[head * hd..][..hd];
                oh.fill(0.0);
                for (p, &w) in scores.iter().enumerate() {
                    let vh = &v[(first + p) * kv_len + kv_off..][..hd];
                    for (o, x) in oh.iter_mut().zip(vh) {
                        *o += w * x;
                    }
                }
                let inv = 1.0 / sum;
                oh.iter_mut().for_each(|o| *o *= inv);
            }
        }
    });
}

/// `a · b` in eight lanes (vectorised by the compiler), then summed.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::dot;

    #[test]
    fn dot_over_lanes_and_tail() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..19).map(|i| (i % 3) as f32 - 1.0).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), want);
    }
}
