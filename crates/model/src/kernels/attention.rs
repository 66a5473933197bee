//! Paged causal attention with grouped-query heads: each new token of each sequence
//! attends over that sequence's own cached tokens (all of them, or the last `window`
//! on sliding-window layers), read through its block table; with attention sinks
//! (gpt-oss), each head's learned logit joins its softmax's denominator.

use std::cell::RefCell;

use half::f16;

use sloserve_engine::Batch;

use crate::kernels::attention_bf16::{self, pair_values, Line, Paired};
use crate::kernels::attention_f16::{attend_f16_avx2, MAX_GROUP};
use crate::kernels::attention_quant::{attend_quant_avx2, QuantRows};
use crate::kernels::cpu::{has_avx2, OutPtr};
use crate::kernels::pool::parallel_for;
use crate::kv_cache::{KvCache, KvData};
use crate::kv_quant::{BlockQ4_0, BlockQ8_0, KvBlock, QK};

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
    /// The step's paired values (`Paired`) and, per (sequence, KV head), where its
    /// lines start and how many pairs they hold; built on the calling thread.
    static PAIRED: RefCell<(Vec<Line>, Vec<PairedAt>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Where a (sequence, KV head)'s `Paired` lines start and how many pairs they hold.
type PairedAt = Option<(usize, usize)>;

/// A cache element the attention reads: an f32 or f16 value, or a quantized block
/// of `PER` values (`kv_quant`).
pub trait KvElem: Copy + Send + Sync {
    /// Values one element holds.
    const PER: usize = 1;
    /// `Σ q[i] · row[i]` over the `q.len()` values of the row at element `at`.
    fn dot(q: &[f32], rows: &[Self], at: usize) -> f32;
    /// `out[i] += w · row[i]` over the `out.len()` values of the row at element `at`.
    fn axpy(w: f32, rows: &[Self], at: usize, out: &mut [f32]);
    /// The rows as f16, where they are.
    fn as_f16(rows: &[Self]) -> Option<&[f16]> {
        let _ = rows;
        None
    }
}

/// An element that is one value.
trait Scalar: Copy {
    fn f32(self) -> f32;
}
impl Scalar for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}
impl Scalar for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn dot(q: &[f32], rows: &[Self], at: usize) -> f32 {
        dot(q, &rows[at..][..q.len()])
    }
    #[inline(always)]
    fn axpy(w: f32, rows: &[Self], at: usize, out: &mut [f32]) {
        axpy(w, &rows[at..][..out.len()], out)
    }
}
impl KvElem for f16 {
    #[inline(always)]
    fn dot(q: &[f32], rows: &[Self], at: usize) -> f32 {
        dot(q, &rows[at..][..q.len()])
    }
    #[inline(always)]
    fn axpy(w: f32, rows: &[Self], at: usize, out: &mut [f32]) {
        axpy(w, &rows[at..][..out.len()], out)
    }
    fn as_f16(rows: &[Self]) -> Option<&[f16]> {
        Some(rows)
    }
}

/// A quantized block: values read one at a time (the portable path, and the
/// reference the AVX2 kernel is tested against).
macro_rules! block_elem {
    ($b:ty) => {
        impl KvElem for $b {
            const PER: usize = QK;
            #[inline(always)]
            fn dot(q: &[f32], rows: &[Self], at: usize) -> f32 {
                let mut acc = [0f32; 8];
                for (b, qb) in rows[at..].iter().zip(q.chunks_exact(QK)) {
                    for (i, x) in qb.iter().enumerate() {
                        acc[i % 8] += x * b.value(i);
                    }
                }
                acc.iter().sum()
            }
            #[inline(always)]
            fn axpy(w: f32, rows: &[Self], at: usize, out: &mut [f32]) {
                for (b, ob) in rows[at..].iter().zip(out.chunks_exact_mut(QK)) {
                    for (i, o) in ob.iter_mut().enumerate() {
                        *o += w * b.value(i);
                    }
                }
            }
        }
    };
}
block_elem!(BlockQ8_0);
block_elem!(BlockQ4_0);

/// One task's inputs: the query heads of one KV head at one token, and where that
/// KV head's keys and values live.
pub(super) struct Task<'a, T> {
    pub(super) q: &'a [f32],
    pub(super) keys: &'a [T],
    pub(super) values: &'a [T],
    /// Offset (in elements: blocks for a quantized cache) of each attended
    /// position's key (and value) row for this KV head, in order (`row_offsets`).
    pub(super) rows: &'a [usize],
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// With AVX-512 BF16: this KV head's values from position 0 as bf16 pairs, when
    /// its sequence has several tokens in the step and no sliding window.
    pub(super) paired: Option<Paired<'a>>,
    /// The sink logit of each query head of the task (attention sinks).
    pub(super) sinks: Option<&'a [f32]>,
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
    paged_attention_sinks(batch, token_seq, q, cache, layer, shape, None, out)
}

/// `paged_attention`, with one sink logit per query head (`[num_heads]`) in each
/// softmax's denominator, as ggml's `soft_max_ext` with sinks: the maximum taken over
/// the scores and the sink, `e^(sink - max)` added to the sum.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_sinks(
    batch: &Batch,
    token_seq: &[u32],
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    shape: AttnShape,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let shape = (shape, sinks);
    match (&cache.keys[layer], &cache.values[layer]) {
        (KvData::F32(k), KvData::F32(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        (KvData::F16(k), KvData::F16(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        (KvData::Q8_0(k), KvData::Q8_0(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        (KvData::Q4_0(k), KvData::Q4_0(v)) => run(batch, token_seq, q, cache, (k, v), shape, out),
        _ => unreachable!("keys and values share one element type"),
    }
}

fn run<T: KvElem>(
    batch: &Batch,
    token_seq: &[u32],
    q: &[f32],
    cache: &KvCache,
    (keys, values): (&[T], &[T]),
    (shape, sinks): (AttnShape, Option<&[f32]>),
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
    PAIRED.with(|cell| {
        let (lines, at) = &mut *cell.borrow_mut();
        lines.clear();
        at.clear();
        at.resize(batch.seqs.len() * num_kv_heads, None);
        // A sequence with several tokens here has its values paired once for all of
        // them (a sliding window's tokens start at different positions: not paired).
        if window.is_none() && attention_bf16::applies(head_dim, group) {
            if let Some(v16) = T::as_f16(values) {
                pair_step(batch, cache, v16, (num_kv_heads, head_dim), lines, at);
            }
        }
        let (lines, at): (&[Line], &[PairedAt]) = (lines, at);
        parallel_for(tasks, &|idx| {
            // SAFETY: task idx alone writes out[idx * width..][..width], inside out.
            let o =
                unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(idx * width), width) };
            let (t, kvh) = (idx / num_kv_heads, idx % num_kv_heads);
            let si = token_seq[t] as usize;
            let s = &batch.seqs[si];
            let n = s.position(t - s.token_start) + 1;
            let first = window.map_or(0, |w| n.saturating_sub(w));
            let paired = at[si * num_kv_heads + kvh].map(|(start, pairs)| Paired {
                lines: &lines[start..],
                pairs,
            });
            ROWS.with(|rows| {
                let rows = &mut *rows.borrow_mut();
                let layout = (
                    cache.block_size,
                    cache.kv_size / T::PER,
                    kvh * head_dim / T::PER,
                );
                row_offsets(batch.block_table(s), layout, (first, n), rows);
                let task = Task {
                    q: &q[(t * num_heads + kvh * group) * head_dim..][..group * head_dim],
                    keys,
                    values,
                    rows,
                    head_dim,
                    scale,
                    paired,
                    sinks: sinks.map(|s| &s[kvh * group..][..group]),
                };
                SCORES.with(|cell| task.attend(&mut cell.borrow_mut(), o));
            });
        });
    });
}

/// Pairs the values of each sequence with several tokens in `batch`, per KV head, into
/// `lines`, and records where in `at[seq · num_kv_heads + kv_head]`.
fn pair_step(
    batch: &Batch,
    cache: &KvCache,
    values: &[f16],
    (num_kv_heads, head_dim): (usize, usize),
    lines: &mut Vec<Line>,
    at: &mut [PairedAt],
) {
    ROWS.with(|rows| {
        let rows = &mut *rows.borrow_mut();
        for (si, s) in batch
            .seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.num_tokens > 1)
        {
            let n = s.position(s.num_tokens - 1) + 1;
            for kvh in 0..num_kv_heads {
                let layout = (cache.block_size, cache.kv_size, kvh * head_dim);
                row_offsets(batch.block_table(s), layout, (0, n), rows);
                let start = lines.len();
                // SAFETY: `attention_bf16::applies` held (the caller's check); n >= 1
                // and every row lies inside the cache.
                let pairs = unsafe { pair_values(values, rows, head_dim, lines) };
                at[si * num_kv_heads + kvh] = Some((start, pairs));
            }
        }
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
        if has_avx2() && self.head_dim.is_multiple_of(16) && group <= MAX_GROUP {
            // SAFETY: the CPU has AVX2, FMA and F16C; the shapes were just checked.
            unsafe { attend_f16_avx2(self, scores, out) }
        } else {
            attend(self, scores, out)
        }
    }
}

impl<B: KvBlock + KvElem> Attend for Task<'_, B>
where
    B: QuantRows,
{
    fn attend(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        let group = self.q.len() / self.head_dim;
        // Sinks (gpt-oss) take the portable path's softmax on a quantized cache.
        if has_avx2()
            && self.head_dim.is_multiple_of(QK)
            && group <= MAX_GROUP
            && self.sinks.is_none()
        {
            // SAFETY: the CPU has AVX2, FMA and F16C; the shapes were just checked.
            unsafe { attend_quant_avx2(self, scores, out) }
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
        for (g, qh) in task.q.chunks_exact(hd).enumerate() {
            scores[g * n + j] = T::dot(qh, task.keys, task.rows[j]) * task.scale;
        }
    }
    softmax_rows(scores, n, task.sinks);
    out.fill(0.0);
    for j in 0..n {
        for (g, o) in out.chunks_exact_mut(hd).enumerate() {
            T::axpy(scores[g * n + j], task.values, task.rows[j], o);
        }
    }
}

/// `out[i] += w · v[i]`.
#[inline(always)]
fn axpy<T: Scalar>(w: f32, v: &[T], out: &mut [f32]) {
    for (oi, vi) in out.iter_mut().zip(v) {
        *oi += w * vi.f32();
    }
}

/// Each row of `n` scores becomes its softmax (row `g`'s denominator with
/// `e^sinks[g]` in it, where there are sinks).
#[inline(always)]
fn softmax_rows(scores: &mut [f32], n: usize, sinks: Option<&[f32]>) {
    for (g, sg) in scores.chunks_exact_mut(n).enumerate() {
        let sink = sinks.map(|s| s[g]);
        let max = sg.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let max = sink.map_or(max, |s| max.max(s));
        let mut sum = 0f32;
        for x in sg.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        if let Some(s) = sink {
            sum += (s - max).exp();
        }
        let inv = 1.0 / sum;
        for x in sg.iter_mut() {
            *x *= inv;
        }
    }
}

#[inline(always)]
fn dot<T: Scalar>(a: &[f32], b: &[T]) -> f32 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{has_avx512_bf16, require_test_isa};
    use crate::kernels::isa_ledger::{route, TestIsa};
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

    /// `x` as a quantized cache holds it (the quantizer's values, exactly); f32 and
    /// f16 as given (f16's rounding is the tolerance's).
    fn stored(dtype: KvDtype, x: Vec<f32>) -> Vec<f32> {
        fn round<B: KvBlock>(x: &[f32]) -> Vec<f32> {
            let mut b = crate::kv_quant::zeroed::<B>(x.len() / QK);
            crate::kv_quant::quantize_row(&mut b, x);
            (0..x.len()).map(|i| b[i / QK].value(i % QK)).collect()
        }
        match dtype {
            KvDtype::Q8_0 => round::<BlockQ8_0>(&x),
            KvDtype::Q4_0 => round::<BlockQ4_0>(&x),
            _ => x,
        }
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
    fn reference(q: &[f32], window: usize, dtype: KvDtype, sinks: Option<&[f32]>) -> Vec<f32> {
        let kv = |s, j, seed| stored(dtype, kv(s, j, seed));
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
                let sink = sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
                let max = max.max(sink);
                let sum: f64 =
                    scores.iter().map(|x| (x - max).exp()).sum::<f64>() + (sink - max).exp();
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
        let cases = [
            (KvDtype::F32, 1e-5),
            (KvDtype::F16, 2e-3),
            (KvDtype::Q8_0, 1e-5),
            (KvDtype::Q4_0, 1e-5),
        ];
        for (dtype, tol) in cases {
            // No window, and a window of 3 that cuts every token's context.
            for window in [None, Some(3)] {
                let (batch, token_seq, q, cache) = setup(dtype);
                let mut out = vec![f32::NAN; 4 * QW];
                let shape = AttnShape { window, ..SHAPE };
                paged_attention(&batch, &token_seq, &q, &cache, 0, shape, &mut out);
                let want = reference(&q, window.unwrap_or(usize::MAX), dtype, None);
                for (i, (a, b)) in out.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{dtype:?} {window:?} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// Sinks: each head's logit joins its denominator (one larger than every score,
    /// so the maximum is the sink's), windowed or not, every cache type (a quantized
    /// cache's sinks take the portable softmax).
    #[test]
    fn sinks_join_each_heads_denominator() {
        let sinks = [0.5f32, -1.0, 2.0, 0.0, 9.0, -0.3];
        let cases = [
            (KvDtype::F32, 1e-5),
            (KvDtype::F16, 2e-3),
            (KvDtype::Q8_0, 1e-5),
            (KvDtype::Q4_0, 1e-5),
        ];
        for (dtype, tol) in cases {
            for window in [None, Some(3)] {
                let (batch, token_seq, q, cache) = setup(dtype);
                let mut out = vec![f32::NAN; 4 * QW];
                let shape = AttnShape { window, ..SHAPE };
                let s = Some(&sinks[..]);
                paged_attention_sinks(&batch, &token_seq, &q, &cache, 0, shape, s, &mut out);
                let want = reference(&q, window.unwrap_or(usize::MAX), dtype, s);
                for (i, (a, b)) in out.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{dtype:?} {window:?} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// A sequence's values paired once for the step give each token's heads bit for
    /// bit what the token computes alone, at odd and even key counts.
    #[test]
    fn paired_values_equal_each_token_alone() {
        require_test_isa();
        if !route("attention_paired_bf16", TestIsa::Avx512Bf16) {
            return;
        }
        let (batch, _, _, cache) = setup(KvDtype::F16);
        let (KvData::F16(k), KvData::F16(v)) = (&cache.keys[0], &cache.values[0]) else {
            unreachable!()
        };
        let mut all = Vec::new();
        row_offsets(
            batch.block_table(&batch.seqs[0]),
            (BS, KV, HD),
            (0, 10),
            &mut all,
        );
        let mut lines = Vec::new();
        // SAFETY: the CPU has AVX-512 BF16; HD is 32; the rows lie inside the cache.
        let pairs = unsafe { pair_values(v, &all, HD, &mut lines) };
        assert_eq!(pairs, 5);
        let q: Vec<f32> = (0..6 * HD).map(|i| val(i, 93)).collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for n in [1, 7, 8, 9, 10] {
            let task = |paired| Task {
                q: &q,
                keys: k,
                values: v,
                rows: &all[..n],
                head_dim: HD,
                scale: 0.25,
                paired,
                sinks: None,
            };
            let mut scores = Vec::new();
            let mut alone = vec![f32::NAN; 6 * HD];
            task(None).attend(&mut scores, &mut alone);
            let mut with = vec![f32::NAN; 6 * HD];
            let paired = Paired {
                lines: &lines,
                pairs,
            };
            task(Some(paired)).attend(&mut scores, &mut with);
            assert_eq!(bits(&with), bits(&alone), "{n} keys");
        }
    }

    #[test]
    fn f16_kernel_equals_the_portable_path() {
        require_test_isa();
        // The kernel takes the BF16 route where it can, else the AVX2 one.
        if !route("attention_f16", TestIsa::Avx512Bf16) && !route("attention_f16", TestIsa::Avx2) {
            eprintln!("no AVX2: the portable path only");
        }
        let (batch, _, _, cache) = setup(KvDtype::F16);
        let (KvData::F16(k), KvData::F16(v)) = (&cache.keys[0], &cache.values[0]) else {
            unreachable!()
        };
        let s = &batch.seqs[0];
        // Groups of 1-8 query heads (each register tile height, and groups split
        // into two tiles); 7 keys (three pairs and one left over) and 6.
        let q: Vec<f32> = (0..MAX_GROUP * HD).map(|i| val(i, 91)).collect();
        // Without sinks, and with one per head (the first above every score).
        let sink_logits: Vec<f32> = (0..MAX_GROUP).map(|h| [9.0, -1.0, 0.5][h % 3]).collect();
        for (first, sinks) in [3, 4]
            .into_iter()
            .flat_map(|f| [(f, None), (f, Some(&sink_logits[..]))])
        {
            let mut rows = Vec::new();
            row_offsets(batch.block_table(s), (BS, KV, HD), (first, 10), &mut rows);
            let task = |group| Task {
                q: &q[..group * HD],
                keys: k,
                values: v,
                rows: &rows,
                head_dim: HD,
                scale: 0.25,
                paired: None,
                sinks: sinks.map(|s| &s[..group]),
            };
            let mut scores = Vec::new();
            // Each head alone, the reference for the head inside any group.
            let alone: Vec<Vec<f32>> = (0..MAX_GROUP)
                .map(|h| {
                    let one = Task {
                        q: &q[h * HD..][..HD],
                        sinks: sinks.map(|s| &s[h..h + 1]),
                        ..task(1)
                    };
                    let mut o = vec![f32::NAN; HD];
                    one.attend(&mut scores, &mut o);
                    o
                })
                .collect();
            // With AVX-512 BF16 the weights and values are multiplied in bf16 (8
            // significant bits: within 2^-8 of each product, values here within 1).
            let tol = if has_avx512_bf16() { 4e-3 } else { 1e-5 };
            for group in 1..=MAX_GROUP {
                let task = task(group);
                let mut portable = vec![0f32; group * HD];
                attend(&task, &mut scores, &mut portable);
                let mut fast = vec![f32::NAN; group * HD];
                task.attend(&mut scores, &mut fast);
                for (a, b) in fast.iter().zip(&portable) {
                    assert!((a - b).abs() <= tol, "group {group}: {a} vs {b}");
                }
                for (h, head) in fast.chunks_exact(HD).enumerate() {
                    let same = head
                        .iter()
                        .zip(&alone[h])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "head {h} of a group of {group} differs from the head alone"
                    );
                }
            }
        }
    }

    /// The AVX2 kernel on q8_0 and q4_0 blocks equals the portable path (values read
    /// one at a time) up to f32 summation order, and each head inside any group
    /// equals, bit for bit, the head alone.
    #[test]
    fn quant_kernel_equals_the_portable_path() {
        require_test_isa();
        fn check<B: KvBlock + KvElem + QuantRows>(k: &[B], v: &[B], batch: &Batch)
        where
            for<'a> Task<'a, B>: Attend,
        {
            let s = &batch.seqs[0];
            let q: Vec<f32> = (0..MAX_GROUP * HD).map(|i| val(i, 91)).collect();
            for first in [3, 4] {
                let mut rows = Vec::new();
                // Block offsets: KV / QK blocks a slot, the second KV head's at HD / QK.
                row_offsets(
                    batch.block_table(s),
                    (BS, KV / QK, HD / QK),
                    (first, 10),
                    &mut rows,
                );
                let task = |group| Task {
                    q: &q[..group * HD],
                    keys: k,
                    values: v,
                    rows: &rows,
                    head_dim: HD,
                    scale: 0.25,
                    paired: None,
                    sinks: None,
                };
                let mut scores = Vec::new();
                let alone: Vec<Vec<f32>> = (0..MAX_GROUP)
                    .map(|h| {
                        let one = Task {
                            q: &q[h * HD..][..HD],
                            ..task(1)
                        };
                        let mut o = vec![f32::NAN; HD];
                        one.attend(&mut scores, &mut o);
                        o
                    })
                    .collect();
                for group in 1..=MAX_GROUP {
                    let task = task(group);
                    let mut portable = vec![0f32; group * HD];
                    attend(&task, &mut scores, &mut portable);
                    let mut fast = vec![f32::NAN; group * HD];
                    task.attend(&mut scores, &mut fast);
                    for (a, b) in fast.iter().zip(&portable) {
                        assert!((a - b).abs() <= 1e-5, "group {group}: {a} vs {b}");
                    }
                    for (h, head) in fast.chunks_exact(HD).enumerate() {
                        let same = head
                            .iter()
                            .zip(&alone[h])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "head {h} of a group of {group} differs from alone");
                    }
                }
            }
        }
        if !route("attention_quant", TestIsa::Avx2) {
            eprintln!("no AVX2: the portable path only");
        }
        let (batch, _, _, cache) = setup(KvDtype::Q8_0);
        let (KvData::Q8_0(k), KvData::Q8_0(v)) = (&cache.keys[0], &cache.values[0]) else {
            unreachable!()
        };
        check(k, v, &batch);
        let (batch, _, _, cache) = setup(KvDtype::Q4_0);
        let (KvData::Q4_0(k), KvData::Q4_0(v)) = (&cache.keys[0], &cache.values[0]) else {
            unreachable!()
        };
        check(k, v, &batch);
    }
}
