//! With AVX-512 BF16, the second half of the f16-cache attention, the softmax
//! weights times the values: both rounded to bf16 and multiplied two keys at a time
//! (`vdpbf16ps`: 32 products an instruction, twice the rate of f32 FMAs on the same
//! pipes), summed in f32. The scores stay f32 (`attention_f16`): a score's error is
//! exponentiated, a weight's is not, and bf16's 8 significant bits are finer than the
//! 8-bit blocks the output projection quantizes this result to.
//!
//! Each output lane sums its pairs of keys in order whatever the tile, so a head's
//! result does not depend on its group's size, the heads beside it or the batch.

use std::cell::RefCell;

use half::f16;

use super::attention::Task;
use super::attention_f16::MAX_GROUP;

/// How many key pairs ahead the loop asks for the value rows it will read.
const PREFETCH: usize = 12;

thread_local! {
    /// The weights as bf16 pairs `(w_2p, w_2p+1)`, one row per head.
    static PAIRS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// `out_g = inv_g · Σ_j w[g, j] · v_j` for every query head `g` of `task`: `w` holds
/// the exponentiated scores, rows `stride` apart, zero from the task's last key to
/// the row's end.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and BF16 (`has_avx512_bf16()`); `task.head_dim`
/// must be a multiple of 32, the group at most `MAX_GROUP` heads and `stride` even
/// and at least the task's key count; every row offset plus `head_dim` must lie
/// inside `task.values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn values_bf16(
    task: &Task<f16>,
    stride: usize,
    w: &[f32],
    inv: &[f32; MAX_GROUP],
    out: &mut [f32],
) {
    let (hd, n) = (task.head_dim, task.rows.len());
    let group = out.len() / hd;
    debug_assert!(hd.is_multiple_of(32) && group <= MAX_GROUP && stride >= n);
    debug_assert!(stride.is_multiple_of(2) && w.len() >= group * stride);
    if n == 0 {
        return out.fill(0.0);
    }
    PAIRS.with(|cell| {
        let pairs = &mut *cell.borrow_mut();
        let (np, pstride) = pair_rows(w, stride, group, n, pairs);
        for c0 in (0..hd).step_by(32) {
            match group {
                1 => tile::<1>(task, c0, np, pairs, pstride, inv, out),
                2 => tile::<2>(task, c0, np, pairs, pstride, inv, out),
                3 => tile::<3>(task, c0, np, pairs, pstride, inv, out),
                4 => tile::<4>(task, c0, np, pairs, pstride, inv, out),
                5 => tile::<5>(task, c0, np, pairs, pstride, inv, out),
                6 => tile::<6>(task, c0, np, pairs, pstride, inv, out),
                7 => tile::<7>(task, c0, np, pairs, pstride, inv, out),
                _ => tile::<MAX_GROUP>(task, c0, np, pairs, pstride, inv, out),
            }
        }
    });
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn values_bf16(
    _: &Task<f16>,
    _: usize,
    _: &[f32],
    _: &[f32; MAX_GROUP],
    _: &mut [f32],
) {
    unreachable!("guarded by has_avx512_bf16")
}

/// Each head's weights as bf16 pairs into `pairs` (rows `pstride` apart, zero past
/// the keys); returns the number of pairs and `pstride`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pair_rows(
    w: &[f32],
    stride: usize,
    group: usize,
    n: usize,
    pairs: &mut Vec<u32>,
) -> (usize, usize) {
    use std::arch::x86_64::*;
    let np = n.div_ceil(2);
    // 16 weights (8 pairs) a conversion.
    let pstride = np.next_multiple_of(8);
    pairs.clear();
    pairs.resize(group * pstride, 0);
    for g in 0..group {
        let src = w.as_ptr().add(g * stride);
        let dst = pairs.as_mut_ptr().add(g * pstride) as *mut __m256i;
        for c in (0..2 * np).step_by(16) {
            // Lanes past the row's end read nothing (masked to zero).
            let left = stride - c;
            let mask = if left >= 16 {
                u16::MAX
            } else {
                (1u16 << left) - 1
            };
            let x = _mm512_maskz_loadu_ps(mask, src.add(c));
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
            _mm256_storeu_si256(dst.add(c / 16), b);
        }
    }
    (np, pstride)
}

/// Dimensions `c0..c0 + 32` of all `R` heads' outputs: 2·R accumulators of 16
/// lanes; each pair of value rows is widened, rounded to bf16 and interleaved once
/// for every head.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile<const R: usize>(
    task: &Task<f16>,
    c0: usize,
    np: usize,
    pairs: &[u32],
    pstride: usize,
    inv: &[f32; MAX_GROUP],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let vp = task.values.as_ptr();
    // The last key of an odd count pairs with itself, under a zero weight.
    let row = |j: usize| *task.rows.get_unchecked(j.min(n - 1));
    // Words 2i and 2i + 1 from words i and 16 + i: dimension i of both keys.
    let order: [u16; 32] = std::array::from_fn(|k| (k / 2 + 16 * (k % 2)) as u16);
    let order = _mm512_loadu_si512(order.as_ptr() as *const __m512i);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for p in 0..np {
        let ahead = 2 * (p + PREFETCH);
        if ahead < n {
            _mm_prefetch::<_MM_HINT_T0>(vp.add(row(ahead) + c0) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(vp.add(row(ahead + 1) + c0) as *const i8);
        }
        let (r0, r1) = (row(2 * p), row(2 * p + 1));
        let x = [0, 16].map(|d| {
            let widen = |r: usize| _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(r + c0 + d) as _));
            let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(widen(r1), widen(r0)));
            std::mem::transmute::<__m512i, __m512bh>(_mm512_permutexvar_epi16(order, both))
        });
        for (g, acc) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_epi32(*pairs.get_unchecked(g * pstride + p) as i32);
            let wv: __m512bh = std::mem::transmute(wv);
            acc[0] = _mm512_dpbf16_ps(acc[0], x[0], wv);
            acc[1] = _mm512_dpbf16_ps(acc[1], x[1], wv);
        }
    }
    let op = out.as_mut_ptr();
    for (g, acc) in acc.iter().enumerate() {
        let s = _mm512_set1_ps(inv[g]);
        for (h, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(op.add(g * hd + c0 + 16 * h), _mm512_mul_ps(*a, s));
        }
    }
}
