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
mod tests;
