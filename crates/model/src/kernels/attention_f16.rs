//! The f16-cache attention of one task (the query heads of one KV head at one token)
//! with AVX2, FMA and F16C: scores in register tiles of up to six heads by two keys
//! (each key row widened once for all heads of the tile), a vectorised softmax, then
//! the weighted values for up to six heads by 16 dimensions held in registers across
//! all keys, scaled by each head's 1/sum at the end (with AVX-512 BF16 and head
//! dimensions a multiple of 32, that last pass is `attention_bf16`'s).
//!
//! Each score and each output lane has one fixed arithmetic, whatever the tile it
//! lands in: a score is eight lane sums over the head dimension reduced by one tree
//! ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then scaled; an output lane sums weight x
//! value over the keys in order. So a head's result does not depend on the group
//! size, the number of keys being odd, or what else the step holds.

use half::f16;

use super::attention::Task;
use super::attention_bf16::{self, values_bf16};

/// Query heads per KV head this kernel handles (in register tiles of up to 6).
pub(super) const MAX_GROUP: usize = 8;

/// Rows (query heads) of a register tile: 2 x 6 accumulators, two widened keys (or
/// value vectors) and one query (or weight) vector fill 15 of the 16 registers.
const TILE_ROWS: usize = 6;

/// How many rows ahead the score pass asks for the keys it will read, and for the
/// values the value pass will: a tile of two keys takes ~50 cycles, a row from
/// L3 ~200 or more.
const PREFETCH: usize = 24;

/// The row tiles of a group of `group` heads: as few tiles as possible, of sizes
/// that differ by at most one (7 heads: 4 + 3).
fn row_tiles(group: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = group.div_ceil(TILE_ROWS);
    (0..tiles).map(move |t| {
        let (lo, hi) = (t * group / tiles, (t + 1) * group / tiles);
        (lo, hi - lo)
    })
}

/// Calls `$tile::<R>(args)` for a tile of `$rows` (1..=TILE_ROWS) rows.
macro_rules! by_rows {
    ($rows:expr, $tile:ident($($arg:expr),*)) => {
        match $rows {
            1 => $tile::<1>($($arg),*),
            2 => $tile::<2>($($arg),*),
            3 => $tile::<3>($($arg),*),
            4 => $tile::<4>($($arg),*),
            5 => $tile::<5>($($arg),*),
            _ => $tile::<TILE_ROWS>($($arg),*),
        }
    };
}

/// Softmax(q·Kᵀ·scale)·V for each query head of `task` into `out`; `scores` is
/// scratch.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`has_avx2()`); `task.head_dim` must be a
/// multiple of 16 and the group at most `MAX_GROUP` heads; every row offset plus
/// `head_dim` must lie inside `keys` and `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_f16_avx2(task: &Task<f16>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n) = (task.head_dim, task.rows.len());
    let group = task.q.len() / hd;
    debug_assert!(hd.is_multiple_of(16) && group <= MAX_GROUP && out.len() == group * hd);
    // Rows padded to whole vectors with -inf, whose exp is 0.
    let stride = n.next_multiple_of(8);
    scores.clear();
    scores.resize(group * stride, f32::NEG_INFINITY);
    for (g0, rows) in row_tiles(group) {
        by_rows!(rows, scores_tile(task, g0, stride, scores));
    }
    let mut inv = [0f32; MAX_GROUP];
    for (g, inv) in inv.iter_mut().enumerate().take(group) {
        *inv = exp_row(
            &mut scores[g * stride..][..stride],
            task.sinks.map(|s| s[g]),
        );
    }
    if attention_bf16::applies(hd, group) {
        // SAFETY: the CPU has AVX-512 BF16; head_dim, group and stride as it needs.
        return values_bf16(task, stride, scores, &inv, out);
    }
    for (g0, rows) in row_tiles(group) {
        by_rows!(rows, values_tile(task, g0, stride, scores, &inv, out));
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn attend_f16_avx2(_: &Task<f16>, _: &mut Vec<f32>, _: &mut [f32]) {
    unreachable!("guarded by has_avx2")
}

/// Asks for the `lines` cache lines from `p` (a hint: never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch(p: *const f16, lines: usize) {
    use std::arch::x86_64::*;
    let p = p as *const i8;
    let mut l = 0;
    while l < lines {
        _mm_prefetch(p.wrapping_add(64 * l), _MM_HINT_T0);
        l += 1;
    }
}

/// `row[j] = exp(row[j] - max)` over a row of whole vectors; returns 1 / the sum.
/// With a `sink` logit (attention sinks), the maximum is over the row and the sink,
/// and `e^(sink - max)` is in the sum (ggml's `soft_max_ext` with sinks).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_row(row: &mut [f32], sink: Option<f32>) -> f32 {
    use super::cpu::hsum256;
    use super::exp::exp256;
    use std::arch::x86_64::*;
    let p = row.as_mut_ptr();
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in (0..row.len()).step_by(8) {
        m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(c)));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let max = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    let max = sink.map_or(max, |s| max.max(s));
    let m = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    for c in (0..row.len()).step_by(8) {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), m));
        _mm256_storeu_ps(p.add(c), e);
        sum = _mm256_add_ps(sum, e);
    }
    1.0 / (hsum256(sum) + sink.map_or(0.0, |s| (s - max).exp()))
}

/// `scores[g, j] = q_g · k_j · scale` for heads `g0..g0 + R` (rows `stride` apart),
/// two keys at a time (an odd last key is paired with itself and stored once).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_tile<const R: usize>(
    task: &Task<f16>,
    g0: usize,
    stride: usize,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let (qp, kp, vp, sp) = (
        task.q.as_ptr().add(g0 * hd),
        task.keys.as_ptr(),
        task.values.as_ptr(),
        scores.as_mut_ptr(),
    );
    let row = |j: usize| *task.rows.get_unchecked(j);
    let lines = (hd * 2).div_ceil(64);
    let scale = _mm_set1_ps(task.scale);
    for j in (0..n).step_by(2) {
        // Keys PREFETCH rows ahead; on the first tile of heads, the values too.
        for a in j + PREFETCH..(j + PREFETCH + 2).min(n) {
            prefetch(kp.add(row(a)), lines);
            if g0 == 0 {
                prefetch(vp.add(row(a)), lines);
            }
        }
        let pair = j + 1 < n;
        let k = [row(j), row(if pair { j + 1 } else { j })].map(|r| kp.add(r) as *const __m128i);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for c in 0..hd / 8 {
            let kv = k.map(|k| _mm256_cvtph_ps(_mm_loadu_si128(k.add(c))));
            for (h, acc) in acc.iter_mut().enumerate() {
                let q = _mm256_loadu_ps(qp.add(h * hd + c * 8));
                acc[0] = _mm256_fmadd_ps(q, kv[0], acc[0]);
                acc[1] = _mm256_fmadd_ps(q, kv[1], acc[1]);
            }
        }
        store_scores(&acc, scale, |g| sp.add((g0 + g) * stride + j), pair);
    }
}

/// Scales and stores a tile's scores: `acc[h]` holds head `h`'s partial sums for
/// keys `j` and `j + 1`; two heads' two scores go at once (lanes (h, j), (h, j+1),
/// (h+1, j), (h+1, j+1)), to `at(h)` (one score where `pair` is false).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store_scores<const R: usize>(
    acc: &[[std::arch::x86_64::__m256; 2]; R],
    scale: std::arch::x86_64::__m128,
    at: impl Fn(usize) -> *mut f32,
    pair: bool,
) {
    use std::arch::x86_64::*;
    for h in (0..R).step_by(2) {
        let h1 = (h + 1).min(R - 1);
        let t = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[h][0], acc[h][1]),
            _mm256_hadd_ps(acc[h1][0], acc[h1][1]),
        );
        let s4 = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        let s4 = _mm_mul_ps(s4, scale);
        let hi = _mm_movehl_ps(s4, s4);
        // SAFETY: `at` gives in-bounds score slots (the caller's contract); with
        // `pair`, two floats from each.
        unsafe {
            if pair {
                _mm_storel_epi64(at(h) as *mut __m128i, _mm_castps_si128(s4));
                if h1 != h {
                    _mm_storel_epi64(at(h1) as *mut __m128i, _mm_castps_si128(hi));
                }
            } else {
                _mm_store_ss(at(h), s4);
                if h1 != h {
                    _mm_store_ss(at(h1), hi);
                }
            }
        }
    }
}

/// `out_g = inv_g · Σ_j scores[g, j] · v_j` for heads `g0..g0 + R`, 16 dimensions
/// at a time: 2·R accumulators, one weight and two widened value vectors in
/// registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_tile<const R: usize>(
    task: &Task<f16>,
    g0: usize,
    stride: usize,
    scores: &[f32],
    inv: &[f32; MAX_GROUP],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let (vp, sp, op) = (
        task.values.as_ptr(),
        scores.as_ptr().add(g0 * stride),
        out.as_mut_ptr().add(g0 * hd),
    );
    for c0 in (0..hd).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for j in 0..n {
            let v = vp.add(*task.rows.get_unchecked(j) + c0) as *const __m128i;
            let v0 = _mm256_cvtph_ps(_mm_loadu_si128(v));
            let v1 = _mm256_cvtph_ps(_mm_loadu_si128(v.add(1)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_broadcast_ss(&*sp.add(h * stride + j));
                acc[0] = _mm256_fmadd_ps(w, v0, acc[0]);
                acc[1] = _mm256_fmadd_ps(w, v1, acc[1]);
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let s = _mm256_set1_ps(inv[g0 + h]);
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(h * hd + c0 + 8 * i), _mm256_mul_ps(*a, s));
            }
        }
    }
}
