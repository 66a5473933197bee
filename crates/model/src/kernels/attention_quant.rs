//! The quantized-cache attention of one task (q8_0 or q4_0 blocks, `kv_quant`) with
//! AVX2, FMA and F16C: `attention_f16`'s kernel with each key and value row read
//! straight from its blocks and dequantized in registers (8 values widened to f32
//! and multiplied by the block's scale: exact, a small integer times an f16), never
//! copied out. Scores in register tiles of up to five heads by two keys, the
//! vectorised softmax, then the weighted values for up to five heads by 16
//! dimensions across all keys, scaled by each head's 1/sum at the end.
//!
//! As in `attention_f16`, each score and output lane has one fixed arithmetic
//! whatever its tile: a score is eight lane sums over the head dimension in order,
//! reduced by ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then scaled; an output lane sums
//! weight x value over the keys in order. A head's result does not depend on the
//! group size, the key count being odd, or the rest of the step.

use super::attention::Task;
use super::attention_f16::{store_scores, MAX_GROUP};
use crate::kv_quant::{BlockQ4_0, BlockQ8_0, KvBlock, QK};

/// Query heads of a register tile: 2 x 5 accumulators, two scales, two dequantized
/// keys and one query vector fill 15 of the 16 registers.
const TILE_ROWS: usize = 5;

/// How many rows ahead the score pass asks for the keys and values it will read.
const PREFETCH: usize = 24;

/// A block type the kernel reads: its eight values at a time, in registers.
pub(crate) trait QuantRows: KvBlock {
    /// Values `8c..8c + 8` (c < 4) of block `b` as f32, before the scale.
    ///
    /// # Safety
    /// The CPU must have AVX2; `b` must point to a block.
    #[cfg(target_arch = "x86_64")]
    unsafe fn widen(b: *const Self, c: usize) -> std::arch::x86_64::__m256;
}

impl QuantRows for BlockQ8_0 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen(b: *const Self, c: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: bytes 8c..8c + 8 of the block's 32 values (c < 4); AVX2 (caller).
        unsafe {
            let x = _mm_loadl_epi64((*b).qs.as_ptr().add(8 * c) as *const __m128i);
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x))
        }
    }
}

impl QuantRows for BlockQ4_0 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen(b: *const Self, c: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: bytes 8(c % 2)..+8 of the block's 16 (c < 4): values 0..16 are their
        // low nibbles, 16..32 their high ones; AVX2 (caller).
        unsafe {
            let x = _mm_loadl_epi64((*b).qs.as_ptr().add(8 * (c % 2)) as *const __m128i);
            let x = if c >= 2 { _mm_srli_epi16(x, 4) } else { x };
            let x = _mm_and_si128(x, _mm_set1_epi8(15));
            let x = _mm256_sub_epi32(_mm256_cvtepu8_epi32(x), _mm256_set1_epi32(8));
            _mm256_cvtepi32_ps(x)
        }
    }
}

/// The row tiles of a group of `group` heads: as few tiles as possible, of sizes
/// that differ by at most one (7 heads: 4 + 3).
fn row_tiles(group: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = group.div_ceil(TILE_ROWS);
    (0..tiles).map(move |t| {
        let (lo, hi) = (t * group / tiles, (t + 1) * group / tiles);
        (lo, hi - lo)
    })
}

/// Calls `$tile::<B, R>(args)` for a tile of `$rows` (1..=TILE_ROWS) rows.
macro_rules! by_rows {
    ($rows:expr, $tile:ident::<$b:ty>($($arg:expr),*)) => {
        match $rows {
            1 => $tile::<$b, 1>($($arg),*),
            2 => $tile::<$b, 2>($($arg),*),
            3 => $tile::<$b, 3>($($arg),*),
            4 => $tile::<$b, 4>($($arg),*),
            _ => $tile::<$b, TILE_ROWS>($($arg),*),
        }
    };
}

/// Softmax(q·Kᵀ·scale)·V for each query head of `task` into `out`; `scores` is
/// scratch. `task.rows` are block offsets.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`has_avx2()`); `task.head_dim` must be a
/// multiple of 32 and the group at most `MAX_GROUP` heads; every row offset plus
/// `head_dim / 32` blocks must lie inside `keys` and `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_quant_avx2<B: QuantRows>(
    task: &Task<B>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, n) = (task.head_dim, task.rows.len());
    let group = task.q.len() / hd;
    debug_assert!(hd.is_multiple_of(QK) && group <= MAX_GROUP && out.len() == group * hd);
    // Rows padded to whole vectors with -inf, whose exp is 0.
    let stride = n.next_multiple_of(8);
    scores.clear();
    scores.resize(group * stride, f32::NEG_INFINITY);
    for (g0, rows) in row_tiles(group) {
        // SAFETY: AVX2, FMA, F16C and the rows' extent as this function's contract;
        // `scores` holds `group * stride` values and the tile's heads are < group.
        unsafe { by_rows!(rows, scores_tile::<B>(task, g0, stride, scores)) };
    }
    let mut inv = [0f32; MAX_GROUP];
    for (g, inv) in inv.iter_mut().enumerate().take(group) {
        // SAFETY: AVX2 and FMA (the contract); the row is whole vectors (stride % 8 == 0).
        *inv = unsafe { super::attention_f16::exp_row(&mut scores[g * stride..][..stride], None) };
    }
    for (g0, rows) in row_tiles(group) {
        // SAFETY: as for the scores; `out` holds `group * hd` values.
        unsafe { by_rows!(rows, values_tile::<B>(task, g0, stride, scores, &inv, out)) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn attend_quant_avx2<B: QuantRows>(_: &Task<B>, _: &mut Vec<f32>, _: &mut [f32]) {
    unreachable!("guarded by has_avx2")
}

/// The block's scale in all eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale8<B: KvBlock>(b: *const B) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: every block starts with its f16 scale (`repr(C)`, `kv_quant`); F16C
    // (caller).
    unsafe {
        let bits = *(b as *const u16);
        _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
    }
}

/// `scores[g, j] = q_g · k_j · scale` for heads `g0..g0 + R` (rows `stride` apart),
/// two keys at a time (an odd last key is paired with itself and stored once).
///
/// # Safety
/// As `attend_quant_avx2`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_tile<B: QuantRows, const R: usize>(
    task: &Task<B>,
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
    let blocks = hd / QK;
    let lines = (blocks * std::mem::size_of::<B>()).div_ceil(64);
    let scale = _mm_set1_ps(task.scale);
    for j in (0..n).step_by(2) {
        // Keys PREFETCH rows ahead; on the first tile of heads, the values too.
        for a in j + PREFETCH..(j + PREFETCH + 2).min(n) {
            prefetch(kp.add(row(a)) as *const i8, lines);
            if g0 == 0 {
                prefetch(vp.add(row(a)) as *const i8, lines);
            }
        }
        let pair = j + 1 < n;
        let k = [row(j), row(if pair { j + 1 } else { j })].map(|r| kp.add(r));
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..blocks {
            let kb = k.map(|k| k.add(b));
            let d = kb.map(|p| scale8(p));
            for c in 0..QK / 8 {
                let kv = [0, 1].map(|i| _mm256_mul_ps(B::widen(kb[i], c), d[i]));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let q = _mm256_loadu_ps(qp.add(h * hd + b * QK + c * 8));
                    acc[0] = _mm256_fmadd_ps(q, kv[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(q, kv[1], acc[1]);
                }
            }
        }
        store_scores(&acc, scale, |g| sp.add((g0 + g) * stride + j), pair);
    }
}

/// Asks for the `lines` cache lines from `p` (a hint: never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch(p: *const i8, lines: usize) {
    use std::arch::x86_64::*;
    for l in 0..lines {
        // SAFETY: a prefetch is a hint and does not fault, whatever the address.
        unsafe { _mm_prefetch(p.wrapping_add(64 * l), _MM_HINT_T0) };
    }
}

/// `out_g = inv_g · Σ_j scores[g, j] · v_j` for heads `g0..g0 + R`, 16 dimensions
/// (half a block) at a time: 2·R accumulators, the scale, one weight and two
/// dequantized value vectors in registers.
///
/// # Safety
/// As `attend_quant_avx2`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_tile<B: QuantRows, const R: usize>(
    task: &Task<B>,
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
        let (b, c) = (c0 / QK, c0 % QK / 8);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for j in 0..n {
            let vb = vp.add(*task.rows.get_unchecked(j) + b);
            let d = scale8(vb);
            let v0 = _mm256_mul_ps(B::widen(vb, c), d);
            let v1 = _mm256_mul_ps(B::widen(vb, c + 1), d);
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
