//! Paged causal attention with grouped-query heads: each new token of each sequence
//! attends over that sequence's own cached tokens, read through its block table.

use std::cell::RefCell;

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

thread_local! {
    /// Attention scores of one task, reused across tasks and layers.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One task's inputs: the query heads of one KV head at one token, and where that
/// KV head's keys and values live.
struct Task<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    table: &'a [u32],
    block_size: usize,
    kv_size: usize,
    kv_off: usize,
    head_dim: usize,
    /// Tokens attended to (position + 1).
    n: usize,
    scale: f32,
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
    let avx2 = has_avx2();
    // One task per (token, KV head): the query heads of its group are contiguous in
    // q and out, and share every key and value row read.
    out.par_chunks_mut(group * head_dim)
        .enumerate()
        .for_each(|(idx, o)| {
            let (t, kvh) = (idx / num_kv_heads, idx % num_kv_heads);
            let s = &batch.seqs[token_seq[t] as usize];
            let task = Task {
                q: &q[(t * num_heads + kvh * group) * head_dim..][..group * head_dim],
                keys: &cache.keys[layer],
                values: &cache.values[layer],
                table: batch.block_table(s),
                block_size: cache.block_size,
                kv_size: cache.kv_size,
                kv_off: kvh * head_dim,
                head_dim,
                n: s.position(t - s.token_start) + 1,
                scale: 1.0 / (head_dim as f32).sqrt(),
            };
            SCORES.with(|cell| {
                let scores = &mut cell.borrow_mut();
                if avx2 {
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { attend_avx2(&task, scores, o) }
                } else {
                    attend(&task, scores, o)
                }
            });
        });
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `attend`, compiled for AVX2 (the compiler vectorises its loops 8 wide).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(task: &Task, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend(task, scores, out)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn attend_avx2(task: &Task, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend(task, scores, out)
}

/// Softmax(q·Kᵀ·scale)·V for each query head of the task; `scores` is `[group, n]`.
#[inline(always)]
fn attend(task: &Task, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n, bs) = (task.head_dim, task.n, task.block_size);
    let group = task.q.len() / hd;
    scores.clear();
    scores.resize(group * n, 0.0);
    let row = |j: usize| (task.table[j / bs] as usize * bs + j % bs) * task.kv_size + task.kv_off;
    for j in 0..n {
        let kj = &task.keys[row(j)..][..hd];
        for (g, qh) in task.q.chunks_exact(hd).enumerate() {
            scores[g * n + j] = dot(qh, kj) * task.scale;
        }
    }
    for sg in scores.chunks_exact_mut(n) {
        let max = sg.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in sg.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in sg.iter_mut() {
            *x *= inv;
        }
    }
    out.fill(0.0);
    for j in 0..n {
        let vj = &task.values[row(j)..][..hd];
        for (g, o) in out.chunks_exact_mut(hd).enumerate() {
            let w = scores[g * n + j];
            for (oi, vi) in o.iter_mut().zip(vj) {
                *oi += w * vi;
            }
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}
