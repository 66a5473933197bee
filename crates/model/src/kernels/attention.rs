//! Paged causal attention with grouped-query heads: each new token of each sequence
//! attends over that sequence's own cached tokens (all of them, or the last `window`
//! on sliding-window layers), read through its block table.

use std::cell::RefCell;

use half::f16;

use sloserve_engine::Batch;

#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::hsum256;
use crate::kernels::cpu::{has_avx2, OutPtr};
use crate::kernels::pool::parallel_for;
use crate::kv_cache::{KvCache, KvData};

/// Shapes of one attention layer.
#[derive(Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Scores are `q·k * scale` (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Sliding window: a token at position p sees positions p - window + 1 ..= p.
    pub window: Option<usize>,
}

thread_local! {
    /// Attention scores of one task, reused across tasks and layers.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Row offsets of one task's positions, reused likewise.
    static ROWS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A cache element the attention reads (f32 or f16).
pub trait KvElem: Copy + Send + Sync {
    fn f32(self) -> f32;
}
impl KvElem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}
impl KvElem for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

/// One task's inputs: the query heads of one KV head at one token, and where that
/// KV head's keys and values live.
struct Task<'a, T> {
    q: &'a [f32],
    keys: &'a [T],
    values: &'a [T],
    /// Offset of each attended position's key (and value) row for this KV head, in
    /// order (`row_offsets`).
    rows: &'a [usize],
    head_dim: usize,
    scale: f32,
}

/// Row offsets of positions `first..n` through block `table` (blocks of
/// `block_size` rows of `kv_size`, this KV head at `kv_off`): one division per
/// task instead of one per key.
fn row_offsets(
    table: &[u32],
    (block_size, kv_size, kv_off): (usize, usize, usize),
    (first, n): (usize, usize),
    out: &mut Vec<usize>,
) {
    out.clear();
    let (mut block, mut i) = (first / block_size, first % block_size);
    for _ in first..n {
        out.push((table[block] as usize * block_size + i) * kv_size + kv_off);
        i += 1;
        if i == block_size {
            (block, i) = (block + 1, 0);
        }
    }
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
    match (&cache.keys[layer], &cache.values[layer]) {
        (KvData::F32(k), KvData::F32(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        (KvData::F16(k), KvData::F16(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        _ => unreachable!("keys and values share one element type"),
    }
}

fn run<T: KvElem>(
    batch: &Batch,
    token_seq: &[u32],
    q: &[f32],
    cache: &KvCache,
    (keys, values): (&[T], &[T]),
    shape: AttnShape,
    out: &mut [f32],
) where
    for<'a> Task<'a, T>: Attend,
{
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
        scale,
        window,
    } = shape;
    let group = num_heads / num_kv_heads;
    // One task per (token, KV head): the query heads of its group are contiguous in
    // q and out, and share every key and value row read.
    let width = group * head_dim;
    let tasks = out.len() / width;
    let out_ptr = OutPtr(out.as_mut_ptr());
    parallel_for(tasks, &|idx| {
        // SAFETY: task idx alone writes out[idx * width..][..width], inside out.
        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(idx * width), width) };
        let (t, kvh) = (idx / num_kv_heads, idx % num_kv_heads);
        let s = &batch.seqs[token_seq[t] as usize];
        let n = s.position(t - s.token_start) + 1;
        let first = window.map_or(0, |w| n.saturating_sub(w));
        ROWS.with(|rows| {
            let rows = &mut *rows.borrow_mut();
            let layout = (cache.block_size, cache.kv_size, kvh * head_dim);
            row_offsets(batch.block_table(s), layout, (first, n), rows);
            let task = Task {
                q: &q[(t * num_heads + kvh * group) * head_dim..][..group * head_dim],
                keys,
                values,
                rows,
                head_dim,
                scale,
            };
            SCORES.with(|cell| task.attend(&mut cell.borrow_mut(), o));
        });
    });
}

/// Softmax(q·Kᵀ·scale)·V for each query head of a task into `out`; `scores` is
/// scratch for `[group, n]`.
pub trait Attend {
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]);
}

impl Attend for Task<'_, f32> {
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        if has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA.
            unsafe { attend_avx2(self, scores, out) }
        } else {
            attend(self, scores, out)
        }
    }
}

impl Attend for Task<'_, f16> {
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        let group = self.q.len() / self.head_dim;
        if has_avx2() && self.head_dim.is_multiple_of(32) && group <= MAX_GROUP {
            // SAFETY: the CPU has AVX2, FMA and F16C; the shapes were just checked.
            unsafe { attend_f16_avx2(self, scores, out) }
        } else {
            attend(self, scores, out)
        }
    }
}

/// `attend` on f32 rows, compiled for AVX2 (the compiler vectorises its loops).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(task: &Task<f32>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend(task, scores, out)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn attend_avx2(task: &Task<f32>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend(task, scores, out)
}

/// The portable attention of one task.
#[inline(always)]
fn attend<T: KvElem>(task: &Task<T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n) = (task.head_dim, task.rows.len());
    scores.clear();
    scores.resize(task.q.len() / hd * n, 0.0);
    for j in 0..n {
        let kj = &task.keys[task.rows[j]..][..hd];
        for (g, qh) in task.q.chunks_exact(hd).enumerate() {
            scores[g * n + j] = dot(qh, kj) * task.scale;
        }
    }
    softmax_rows(scores, n);
    out.fill(0.0);
    for j in 0..n {
        let vj = &task.values[task.rows[j]..][..hd];
        for (g, o) in out.chunks_exact_mut(hd).enumerate() {
            let w = scores[g * n + j];
            for (oi, vi) in o.iter_mut().zip(vj) {
                *oi += w * vi.f32();
            }
        }
    }
}

/// Each row of `n` scores becomes its softmax.
#[inline(always)]
fn softmax_rows(scores: &mut [f32], n: usize) {
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
}

#[inline(always)]
fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    // Eight independent accumulators let the compiler vectorise.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y.f32())
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l].f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Query heads per KV head that the f16 kernel handles (in register tiles of 3).
const MAX_GROUP: usize = 8;

/// `attend` on f16 rows with F16C conversions, in register tiles: scores for up to
/// three query heads by four keys at a time (each key row widened once for all
/// of them, four sums reduced together), then the weighted values for up to three
/// heads by 32 dimensions held in registers across all keys.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_f16_avx2(task: &Task<f16>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n) = (task.head_dim, task.rows.len());
    let group = task.q.len() / hd;
    scores.clear();
    scores.resize(group * n, 0.0);
    for g0 in (0..group).step_by(3) {
        match (group - g0).min(3) {
            1 => scores_f16::<1>(task, g0, scores),
            2 => scores_f16::<2>(task, g0, scores),
            _ => scores_f16::<3>(task, g0, scores),
        }
    }
    softmax_rows(scores, n);
    for g0 in (0..group).step_by(3) {
        match (group - g0).min(3) {
            1 => values_f16::<1>(task, g0, scores, out),
            2 => values_f16::<2>(task, g0, scores, out),
            _ => values_f16::<3>(task, g0, scores, out),
        }
    }
}

/// Asks for the cache lines of `bytes` bytes at `p` (a hint: never faults).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_row(p: *const u8, bytes: usize) {
    use std::arch::x86_64::*;
    for off in (0..bytes).step_by(64) {
        _mm_prefetch(p.wrapping_add(off) as *const i8, _MM_HINT_T0);
    }
}

/// `scores[g, j] = q_g · k_j · scale` for heads `g0..g0 + G`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_f16<const G: usize>(task: &Task<f16>, g0: usize, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let (qp, kp, sp) = (
        task.q.as_ptr().add(g0 * hd),
        task.keys.as_ptr(),
        scores.as_mut_ptr(),
    );
    let key = |j: usize| kp.add(*task.rows.get_unchecked(j)) as *const __m128i;
    let scale = _mm_set1_ps(task.scale);
    let mut j = 0;
    while j + 4 <= n {
        let k = [key(j), key(j + 1), key(j + 2), key(j + 3)];
        // The cache's rows come from memory at long contexts: ask for the next
        // tile's while this one is summed.
        for a in (j + 8..j + 12).filter(|&a| a < n) {
            prefetch_row(key(a) as *const u8, hd * 2);
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for c in 0..hd / 8 {
            let kv = k.map(|k| _mm256_cvtph_ps(_mm_loadu_si128(k.add(c))));
            for (h, acc) in acc.iter_mut().enumerate() {
                let q = _mm256_loadu_ps(qp.add(h * hd + c * 8));
                for (a, kv) in acc.iter_mut().zip(&kv) {
                    *a = _mm256_fmadd_ps(q, *kv, *a);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            // Four eight-lane sums into one four-lane vector.
            let t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            let s4 = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            _mm_storeu_ps(sp.add((g0 + h) * n + j), _mm_mul_ps(s4, scale));
        }
        j += 4;
    }
    for j in j..n {
        let k = key(j);
        let mut acc = [_mm256_setzero_ps(); G];
        for c in 0..hd / 8 {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.add(c)));
            for (h, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * hd + c * 8)), kv, *a);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            *sp.add((g0 + h) * n + j) = hsum256(*a) * task.scale;
        }
    }
}

/// `out_g = Σ_j scores[g, j] · v_j` for heads `g0..g0 + G`, 32 dimensions at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_f16<const G: usize>(task: &Task<f16>, g0: usize, scores: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let (vp, sp, op) = (
        task.values.as_ptr(),
        scores.as_ptr(),
        out.as_mut_ptr().add(g0 * hd),
    );
    for c0 in (0..hd).step_by(32) {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for j in 0..n {
            if j + 8 < n {
                prefetch_row(
                    vp.add(*task.rows.get_unchecked(j + 8) + c0) as *const u8,
                    64,
                );
            }
            let v = vp.add(*task.rows.get_unchecked(j) + c0) as *const __m128i;
            let vv = [0, 1, 2, 3].map(|i| _mm256_cvtph_ps(_mm_loadu_si128(v.add(i))));
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*sp.add((g0 + h) * n + j));
                for (a, vv) in acc.iter_mut().zip(&vv) {
                    *a = _mm256_fmadd_ps(w, *vv, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(h * hd + c0 + 8 * i), *a);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn attend_f16_avx2(_: &Task<f16>, _: &mut Vec<f32>, _: &mut [f32]) {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvDtype;

    /// Head size: the f16 kernel's 32-dimension tiles.
    const HD: usize = 32;
    /// Query heads' width.
    const QW: usize = 6 * HD;
    const SHAPE: AttnShape = AttnShape {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: HD,
        scale: 0.25,
        window: None,
    };
    const KV: usize = 2 * HD;
    const BS: usize = 4;

    fn val(i: usize, seed: usize) -> f32 {
        ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0
    }

    /// Key (or value, seed + 1) vector of sequence `s` at position `j`.
    fn kv(s: usize, j: usize, seed: usize) -> Vec<f32> {
        (0..KV).map(|i| val(i + 64 * j, seed + 10 * s)).collect()
    }

    /// Sequence 0 prefills positions 7..10 over blocks [3, 0, 7]; sequence 1 decodes
    /// position 5 over blocks [5, 1].
    fn setup(dtype: KvDtype) -> (Batch, Vec<u32>, Vec<f32>, KvCache) {
        let tables = [vec![3u32, 0, 7], vec![5u32, 1]];
        let mut cache = KvCache::new(1, KV, BS, 8, dtype);
        for (s, (table, last)) in tables.iter().zip([9usize, 5]).enumerate() {
            for j in 0..=last {
                let slot = cache.slot(table, j);
                cache.write(0, slot, &kv(s, j, 1), &kv(s, j, 2));
            }
        }
        let mut batch = Batch::default();
        batch.push(&[1, 2, 3], 7, &tables[0], true);
        batch.push(&[4], 5, &tables[1], true);
        let q = (0..4 * QW).map(|i| val(i, 77)).collect();
        (batch, vec![0, 0, 0, 1], q, cache)
    }

    /// Softmax attention computed directly from the generators, in f64, over the
    /// last `window` positions.
    fn reference(q: &[f32], window: usize) -> Vec<f32> {
        let mut out = vec![0f32; 4 * QW];
        for (t, (s, pos)) in [(0, 7), (0, 8), (0, 9), (1, 5)].into_iter().enumerate() {
            for h in 0..6 {
                let off = (h / 3) * HD;
                let qh = &q[t * QW + h * HD..][..HD];
                let first = (pos + 1_usize).saturating_sub(window);
                let scores: Vec<f64> = (first..=pos)
                    .map(|j| {
                        let k = kv(s, j, 1);
                        (0..HD).map(|i| (qh[i] * k[off + i]) as f64).sum::<f64>() / 4.0
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                for i in 0..HD {
                    let o: f64 = (first..=pos)
                        .map(|j| {
                            (scores[j - first] - max).exp() / sum * kv(s, j, 2)[off + i] as f64
                        })
                        .sum();
                    out[t * QW + h * HD + i] = o as f32;
                }
            }
        }
        out
    }

    #[test]
    fn paged_gqa_attention_matches_a_direct_softmax() {
        for (dtype, tol) in [(KvDtype::F32, 1e-5), (KvDtype::F16, 2e-3)] {
            // No window, and a window of 3 that cuts every token's context.
            for window in [None, Some(3)] {
                let (batch, token_seq, q, cache) = setup(dtype);
                let mut out = vec![f32::NAN; 4 * QW];
                let shape = AttnShape { window, ..SHAPE };
                paged_attention(&batch, &token_seq, &q, &cache, 0, shape, &mut out);
                let want = reference(&q, window.unwrap_or(usize::MAX));
                for (i, (a, b)) in out.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{dtype:?} {window:?} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn f16_kernel_equals_the_portable_path() {
        let (batch, _, q, cache) = setup(KvDtype::F16);
        let (KvData::F16(k), KvData::F16(v)) = (&cache.keys[0], &cache.values[0]) else {
            unreachable!()
        };
        let s = &batch.seqs[0];
        // Groups of 1-3 query heads (each register tile width); 7 keys: one tile of
        // four and three left over.
        let mut rows = Vec::new();
        row_offsets(batch.block_table(s), (BS, KV, HD), (3, 10), &mut rows);
        for group in 1..=3 {
            let task = Task {
                q: &q[2 * QW + 3 * HD..][..group * HD],
                keys: k,
                values: v,
                rows: &rows,
                head_dim: HD,
                scale: 0.25,
            };
            let (mut scores, mut portable) = (Vec::new(), vec![0f32; group * HD]);
            attend(&task, &mut scores, &mut portable);
            let mut fast = vec![f32::NAN; group * HD];
            task.attend(&mut scores, &mut fast);
            for (a, b) in fast.iter().zip(&portable) {
                assert!((a - b).abs() <= 1e-5, "group {group}: {a} vs {b}");
            }
        }
    }
}
