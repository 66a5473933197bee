//! With AVX-512 BF16, the second half of the f16-cache attention, the softmax
//! weights times the values: both rounded to bf16 and multiplied two keys at a time
//! (`vdpbf16ps`: 32 products an instruction, twice the rate of f32 FMAs on the same
//! pipes), summed in f32. The scores stay f32 (`attention_f16`): a score's error is
//! exponentiated, a weight's is not, and bf16's 8 significant bits are finer than the
//! 8-bit blocks the output projection quantizes this result to.
//!
//! A sequence with several tokens in a step has its values converted once for all of
//! them (`pair_values`, `Paired`); a lone token converts the rows it reads in
//! registers. Both give the same vectors, and each output lane sums its pairs of keys
//! in order, so a head's result does not depend on its group's size, the heads beside
//! it, the batch or how its sequence's prompt was chunked.

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

/// Whether a task's value pass runs here (needs `attention_f16`'s kernel, a group of at
/// most `MAX_GROUP` heads, to run first): the one place this is decided.
pub(crate) fn applies(head_dim: usize, group: usize) -> bool {
    head_dim.is_multiple_of(32) && group <= MAX_GROUP && super::cpu::has_avx512_bf16()
}

/// 32 bf16 values: dimensions `d..d + 16` of two keys, interleaved (`interleave`).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u16; 32]);

/// One sequence's values for one KV head as the value tiles read them, from
/// position 0: for each 32-dimension block, for each key pair, two `Line`s.
#[derive(Clone, Copy)]
pub(crate) struct Paired<'a> {
    pub(crate) lines: &'a [Line],
    /// Key pairs per dimension block.
    pub(crate) pairs: usize,
}

/// Appends to `out` the values at `rows` (one offset per position from 0) as
/// `Paired` lines for a head of `hd` dimensions; returns the number of pairs.
///
/// # Safety
/// As `values_bf16`: the CPU has AVX-512 BF16, `hd` is a multiple of 32, `rows` is
/// not empty and every offset plus `hd` lies inside `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn pair_values(
    values: &[f16],
    rows: &[usize],
    hd: usize,
    out: &mut Vec<Line>,
) -> usize {
    use std::arch::x86_64::*;
    let (n, vp) = (rows.len(), values.as_ptr());
    let np = n.div_ceil(2);
    let row = |j: usize| *rows.get_unchecked(j.min(n - 1));
    let order = interleave_order();
    out.reserve(np * hd / 16);
    for c0 in (0..hd).step_by(32) {
        for p in 0..np {
            for d in [0, 16] {
                let x = interleave(vp, row(2 * p), row(2 * p + 1), c0 + d, order);
                let mut line = Line([0; 32]);
                _mm512_store_si512(line.0.as_mut_ptr() as *mut __m512i, x);
                out.push(line);
            }
        }
    }
    np
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn pair_values(_: &[f16], _: &[usize], _: usize, _: &mut Vec<Line>) -> usize {
    unreachable!("guarded by has_avx512_bf16")
}

/// The word order `interleave` puts two keys' 16 dimensions in: words 2i and 2i + 1
/// from words i and 16 + i.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave_order() -> std::arch::x86_64::__m512i {
    let order: [u16; 32] = std::array::from_fn(|k| (k / 2 + 16 * (k % 2)) as u16);
    std::arch::x86_64::_mm512_loadu_si512(order.as_ptr() as *const _)
}

/// Dimensions `c..c + 16` of the value rows at offsets `r0` and `r1`, widened,
/// rounded to bf16 and interleaved: word 2i is row `r0`'s dimension i, word 2i + 1
/// row `r1`'s.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn interleave(
    vp: *const f16,
    r0: usize,
    r1: usize,
    c: usize,
    order: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let widen = |r: usize| _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(r + c) as _));
    let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(widen(r1), widen(r0)));
    _mm512_permutexvar_epi16(order, both)
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
        let weights = Weights {
            pairs,
            pstride,
            inv,
        };
        for c0 in (0..hd).step_by(32) {
            match group {
                1 => tile::<1>(task, c0, np, &weights, out),
                2 => tile::<2>(task, c0, np, &weights, out),
                3 => tile::<3>(task, c0, np, &weights, out),
                4 => tile::<4>(task, c0, np, &weights, out),
                5 => tile::<5>(task, c0, np, &weights, out),
                6 => tile::<6>(task, c0, np, &weights, out),
                7 => tile::<7>(task, c0, np, &weights, out),
                _ => tile::<MAX_GROUP>(task, c0, np, &weights, out),
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

/// A task's weights as the tiles read them.
struct Weights<'a> {
    /// Each head's bf16 pairs, rows `pstride` apart (`pair_rows`).
    pairs: &'a [u32],
    pstride: usize,
    /// Each head's 1 / (sum of its weights).
    inv: &'a [f32; MAX_GROUP],
}

/// Dimensions `c0..c0 + 32` of all `R` heads' outputs: 2·R accumulators of 16
/// lanes; each pair of value rows is read from the sequence's `Paired` lines, or
/// widened, rounded and interleaved here, once for every head.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile<const R: usize>(
    task: &Task<f16>,
    c0: usize,
    np: usize,
    w: &Weights,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, n) = (task.head_dim, task.rows.len());
    let vp = task.values.as_ptr();
    // The last key of an odd count pairs with itself, under a zero weight.
    let row = |j: usize| *task.rows.get_unchecked(j.min(n - 1));
    let order = interleave_order();
    // Pairs read from `Paired` lines: all but an odd count's last (whose partner
    // there is the next position's value, not the key itself).
    let (lines, from_lines) = match task.paired {
        Some(p) => (
            p.lines.as_ptr().add(c0 / 32 * p.pairs * 2) as *const __m512i,
            n / 2,
        ),
        None => (std::ptr::null(), 0),
    };
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for p in 0..np {
        let x: [__m512bh; 2] = if p < from_lines {
            [0, 1].map(|d| std::mem::transmute(_mm512_load_si512(lines.add(2 * p + d))))
        } else {
            let ahead = 2 * (p + PREFETCH);
            if ahead < n {
                _mm_prefetch::<_MM_HINT_T0>(vp.add(row(ahead) + c0) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(vp.add(row(ahead + 1) + c0) as *const i8);
            }
            let (r0, r1) = (row(2 * p), row(2 * p + 1));
            [0, 16].map(|d| std::mem::transmute(interleave(vp, r0, r1, c0 + d, order)))
        };
        for (g, acc) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_epi32(*w.pairs.get_unchecked(g * w.pstride + p) as i32);
            let wv: __m512bh = std::mem::transmute(wv);
            acc[0] = _mm512_dpbf16_ps(acc[0], x[0], wv);
            acc[1] = _mm512_dpbf16_ps(acc[1], x[1], wv);
        }
    }
    let op = out.as_mut_ptr();
    for (g, acc) in acc.iter().enumerate() {
        let s = _mm512_set1_ps(w.inv[g]);
        for (h, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(op.add(g * hd + c0 + 16 * h), _mm512_mul_ps(*a, s));
        }
    }
}
