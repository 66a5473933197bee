//! The f16-cache attention of one task (the query heads of one KV head at one token)
//! with AVX2, FMA and F16C: scores in register tiles of up to three heads by four
//! keys (each key row widened once for all heads), a vectorised softmax, then the
//! weighted values for up to three heads by 32 dimensions held in registers across
//! all keys, scaled by each head's 1/sum at the end.

use half::f16;

use super::attention::Task;

/// Query heads per KV head this kernel handles (in register tiles of 3).
pub(super) const MAX_GROUP: usize = 8;

/// How many rows ahead the score pass asks for the keys it will read, and for the
/// values the value pass will: a tile of four keys takes ~50 cycles, a row from
/// L3 ~200 or more.
const PREFETCH: usize = 24;

/// Softmax(q·Kᵀ·scale)·V for each query head of `task` into `out`; `scores` is
/// scratch.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (`has_avx2()`); `task.head_dim` must be a
/// multiple of 32 and the group at most `MAX_GROUP` heads; every row offset plus
/// `head_dim` must lie inside `keys` and `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_f16_avx2(task: &Task<f16>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n) = (task.head_dim, task.rows.len());
    let group = task.q.len() / hd;
    debug_assert!(hd.is_multiple_of(32) && group <= MAX_GROUP && out.len() == group * hd);
    // Rows padded to whole vectors with -inf, whose exp is 0.
    let stride = n.next_multiple_of(8);
    scores.clear();
    scores.resize(group * stride, f32::NEG_INFINITY);
    for g0 in (0..group).step_by(3) {
        match (group - g0).min(3) {
            1 => scores_tile::<1>(task, g0, stride, scores),
            2 => scores_tile::<2>(task, g0, stride, scores),
            _ => scores_tile::<3>(task, g0, stride, scores),
        }
    }
    let mut inv = [0f32; MAX_GROUP];
    for (g, inv) in inv.iter_mut().enumerate().take(group) {
        *inv = exp_row(&mut scores[g * stride..][..stride]);
    }
    for g0 in (0..group).step_by(3) {
        match (group - g0).min(3) {
            1 => values_tile::<1>(task, g0, stride, scores, &inv, out),
            2 => values_tile::<2>(task, g0, stride, scores, &inv, out),
            _ => values_tile::<3>(task, g0, stride, scores, &inv, out),
        }
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
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_row(row: &mut [f32]) -> f32 {
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
    let m = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1))));
    let mut sum = _mm256_setzero_ps();
    for c in (0..row.len()).step_by(8) {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), m));
        _mm256_storeu_ps(p.add(c), e);
        sum = _mm256_add_ps(sum, e);
    }
    1.0 / hsum256(sum)
}

/// `scores[g, j] = q_g · k_j · scale` for heads `g0..g0 + G` (rows `stride` apart).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_tile<const G: usize>(
    task: &Task<f16>,
    g0: usize,
    stride: usize,
    scores: &mut [f32],
) {
    use super::cpu::hsum256;
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
    let mut j = 0;
    while j + 4 <= n {
        // Keys PREFETCH rows ahead; on the first tile of heads, the values too.
        for a in j + PREFETCH..(j + PREFETCH + 4).min(n) {
            prefetch(kp.add(row(a)), lines);
            if g0 == 0 {
                prefetch(vp.add(row(a)), lines);
            }
        }
        let k = [0, 1, 2, 3].map(|i| kp.add(row(j + i)) as *const __m128i);
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
            _mm_storeu_ps(sp.add((g0 + h) * stride + j), _mm_mul_ps(s4, scale));
        }
        j += 4;
    }
    for j in j..n {
        let k = kp.add(row(j)) as *const __m128i;
        let mut acc = [_mm256_setzero_ps(); G];
        for c in 0..hd / 8 {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.add(c)));
            for (h, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * hd + c * 8)), kv, *a);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            *sp.add((g0 + h) * stride + j) = hsum256(*a) * task.scale;
        }
    }
}

/// `out_g = inv_g · Σ_j scores[g, j] · v_j` for heads `g0..g0 + G`, 32 dimensions
/// at a time: 4·G accumulators, G weights and one widened value vector in registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_tile<const G: usize>(
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
    for c0 in (0..hd).step_by(32) {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for j in 0..n {
            let v = vp.add(*task.rows.get_unchecked(j) + c0) as *const __m128i;
            let w: [__m256; G] =
                std::array::from_fn(|h| _mm256_broadcast_ss(&*sp.add(h * stride + j)));
            for i in 0..4 {
                let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.add(i)));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    acc[i] = _mm256_fmadd_ps(*w, vv, acc[i]);
                }
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
