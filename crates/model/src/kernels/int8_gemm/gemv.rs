//! The AVX2 tile of one row (decode at batch 1) for the K-quants a Q4_K_M file is
//! made of: Q4_K and Q5_K (a scale and a minimum a block) and Q6_K (a scale a half,
//! zero point 32), their scales `Factored`. One row reads each weight once and does
//! little with it, so the general tile's per-block work (each half of the panel in
//! its own pass, every scale lane located by division and formed again per half)
//! was most of its instructions: 0.69 a weight for Q4_K and 1.1 for Q6_K (callgrind,
//! one thread), as many as two cores retire while memory delivers the weights. Here
//! both halves share a pass, each activation group is broadcast once for them, the
//! scale pointers step with the blocks, and the super-block factors are converted
//! once per 8 blocks: about 0.2 a weight for Q4_K.
//!
//! The floating-point operations per output and block are the general tile's, in the
//! same order on the same values (integer sums exact in any order), so a row's
//! outputs are bit for bit those it gets inside any batch.

use super::avx2::{BYTES, NIBBLES, SIX};
use super::{folds_zero, PREFETCH_BLOCKS};
use crate::kernels::act_quant::QuantActs;
use crate::kernels::int8_panels::{Group, Int8Panels, Scales};

/// Whether `gemv` multiplies `w` (values read as `v`): `Factored` scales, and
/// either a minimum a block and no zero point (Q4_K, Q5_K) or two signed scales a
/// block and a folded zero point (Q6_K).
pub(super) fn fits(w: &Int8Panels, v: u8) -> bool {
    let Scales::Factored { signed, .. } = w.scales else {
        return false;
    };
    let values = matches!(v, NIBBLES | BYTES | SIX) && (v == NIBBLES) == (w.qmax <= 15);
    let kind = match (w.has_min, w.sub) {
        (true, false) => !signed && w.zero == 0,
        (false, true) => signed && folds_zero(w) && w.qmax == 63,
        _ => false,
    };
    values && kind && w.kb.is_multiple_of(8)
}

/// `c[0, cols] = row r0 of a · panel p`, the panel's values at `vals` as `V` stores
/// them; `SUB`: Q6_K's two scales a block, else a scale and a minimum.
///
/// # Safety
/// `fits(w, V)`; `vals` holds panel `p`'s `w.kb` blocks as `V` stores them; `a`
/// holds row `r0` of `w.kb` blocks (`ready` for `w`); `c` holds `cols <= 16`
/// values; the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemv_avx2<const V: u8, const SUB: bool>(
    w: &Int8Panels,
    p: usize,
    vals: *const Group,
    a: &QuantActs,
    r0: usize,
    c: *mut f32,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let kb = w.kb;
    let per = match V {
        NIBBLES => 4,
        SIX => 6,
        _ => 8,
    };
    let (outer, inner, _) = w.factored();
    // `[super-block][2]` lanes of 16 f16: `d`, then `dmin` (Q6_K: `d` twice).
    let outer = (outer.as_ptr() as *const u16).add(p * (kb / 8) * 2 * 16);
    // `[block][2]` lanes of 16 integers: the scale (first half's), then the minimum
    // (second half's).
    let inner = (inner.as_ptr() as *const u8).add(p * kb * 2 * 16);
    let gp = vals as *const __m256i;
    let lines = vals as *const i8;
    let low = _mm256_set1_epi8(0x0F);
    let bits45 = _mm256_set1_epi8(0x30);
    let ones = _mm256_set1_epi16(1);
    let sign = _mm256_set1_ps(-0.0);
    // This half's 8 columns of a lane of 16 integers, as f32.
    let ints = |at: *const u8, half: usize| {
        let raw = _mm_loadl_epi64(at.add(half * 8) as *const __m128i);
        _mm256_cvtepi32_ps(match SUB {
            true => _mm256_cvtepi8_epi32(raw),
            false => _mm256_cvtepu8_epi32(raw),
        })
    };
    let half_f16 = |at: *const u16, half: usize| {
        _mm256_cvtph_ps(_mm_load_si128(at.add(half * 8) as *const __m128i))
    };
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut d = [_mm256_setzero_ps(); 2];
    let mut dmin = [_mm256_setzero_ps(); 2];
    for b in 0..kb {
        if b % 8 == 0 {
            let o = outer.add(b / 8 * 2 * 16);
            d = [half_f16(o, 0), half_f16(o, 1)];
            if !SUB {
                dmin = [half_f16(o.add(16), 0), half_f16(o.add(16), 1)];
            }
        }
        // Hints only: past the values' end they read nothing and fault never. As the
        // general tile's two passes do: this panel `PREFETCH_BLOCKS` ahead into L1,
        // and the next panel's same block into L2, so that memory streams a whole
        // panel ahead of the products.
        for v in 0..per {
            let near = lines.wrapping_add(((b + PREFETCH_BLOCKS) * per + v) * 64);
            _mm_prefetch::<_MM_HINT_T0>(near);
            _mm_prefetch::<_MM_HINT_T1>(lines.wrapping_add(((b + kb) * per + v) * 64));
        }
        let i = a.at(r0, b);
        let q = a.qs.get_unchecked(i).0.as_ptr() as *const i32;
        let act = |g: usize| _mm256_set1_epi32(q.add(g).read_unaligned());
        // Vector `x` of the block for this half (`h`) of the columns.
        let load = |x: usize, h: usize| _mm256_load_si256(gp.add((b * per + x) * 2 + h));
        // The block's 8 groups as bytes (BYTES, SIX) for half h of the columns:
        // nibble vector u holds groups u (low) and u + 4 (high), plane j bits 4-5
        // of groups 4j..4j + 4 (field u at bits 2u, 2u + 1).
        let groups = |h: usize| -> [__m256i; 8] {
            if V == BYTES {
                return std::array::from_fn(|g| load(g, h));
            }
            let fields = |pl: __m256i| {
                [
                    _mm256_and_si256(_mm256_slli_epi16(pl, 4), bits45),
                    _mm256_and_si256(_mm256_slli_epi16(pl, 2), bits45),
                    _mm256_and_si256(pl, bits45),
                    _mm256_and_si256(_mm256_srli_epi16(pl, 2), bits45),
                ]
            };
            let (f0, f1) = (fields(load(4, h)), fields(load(5, h)));
            let mut gs = [_mm256_setzero_si256(); 8];
            for u in 0..4 {
                let raw = load(u, h);
                gs[u] = _mm256_or_si256(_mm256_and_si256(raw, low), f0[u]);
                let high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                gs[u + 4] = _mm256_or_si256(high, f1[u]);
            }
            gs
        };
        let da = _mm256_broadcast_ss(a.d.get_unchecked(i));
        let sc = inner.add(b * 2 * 16);
        if SUB {
            // Q6_K: each half's sums start at its zero point's terms (`fold`), two
            // groups summed in 16 bits at a time, as the general tile sums them.
            let acts: [__m256i; 8] = std::array::from_fn(act);
            let (z_lo, z_hi) = (*a.zero_lo.get_unchecked(i), *a.zero_hi.get_unchecked(i));
            for h in 0..2 {
                let g = groups(h);
                let pair = |x: usize| {
                    let p0 = _mm256_maddubs_epi16(g[x], acts[x]);
                    let p1 = _mm256_maddubs_epi16(g[x + 1], acts[x + 1]);
                    _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones)
                };
                let s_lo = _mm256_add_epi32(_mm256_set1_epi32(z_lo), pair(0));
                let s_lo = _mm256_add_epi32(s_lo, pair(2));
                let s_hi = _mm256_add_epi32(_mm256_set1_epi32(z_hi), pair(4));
                let s_hi = _mm256_add_epi32(s_hi, pair(6));
                let d_lo = _mm256_mul_ps(d[h], ints(sc, h));
                let d_hi = _mm256_mul_ps(d[h], ints(sc.add(16), h));
                let t_lo = _mm256_cvtepi32_ps(s_lo);
                acc[h] = _mm256_fmadd_ps(t_lo, _mm256_mul_ps(d_lo, da), acc[h]);
                let t_hi = _mm256_cvtepi32_ps(s_hi);
                acc[h] = _mm256_fmadd_ps(t_hi, _mm256_mul_ps(d_hi, da), acc[h]);
            }
            continue;
        }
        // A scale and a minimum: the block's sum in 16 bits (at most 8 groups of
        // 5-bit values, 4 of 6-bit... here 4-bit nibbles or Q5_K's 5 bits in two runs).
        let mut s = [_mm256_setzero_si256(); 2];
        if V == NIBBLES {
            let acts: [__m256i; 8] = std::array::from_fn(act);
            for (h, s) in s.iter_mut().enumerate() {
                let mut s16 = _mm256_setzero_si256();
                for v in 0..4 {
                    let raw = load(v, h);
                    let lo = _mm256_and_si256(raw, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo, acts[v]));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi, acts[v + 4]));
                }
                *s = _mm256_madd_epi16(s16, ones);
            }
        } else {
            // Q5_K: four groups' sums fit 16 bits.
            let acts: [__m256i; 8] = std::array::from_fn(act);
            for (h, s) in s.iter_mut().enumerate() {
                let g = groups(h);
                let four = |x: usize| {
                    let p = |j: usize| _mm256_maddubs_epi16(g[x + j], acts[x + j]);
                    let s16 = _mm256_add_epi16(_mm256_add_epi16(p(0), p(1)), p(2));
                    _mm256_madd_epi16(_mm256_add_epi16(s16, p(3)), ones)
                };
                *s = _mm256_add_epi32(four(0), four(4));
            }
        }
        let dsum = _mm256_broadcast_ss(a.dsum.get_unchecked(i));
        for h in 0..2 {
            let scale = _mm256_mul_ps(_mm256_mul_ps(d[h], ints(sc, h)), da);
            acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h]), scale, acc[h]);
            let m = _mm256_xor_ps(_mm256_mul_ps(dmin[h], ints(sc.add(16), h)), sign);
            acc[h] = _mm256_fmadd_ps(m, dsum, acc[h]);
        }
    }
    if cols == 16 {
        _mm256_storeu_ps(c, acc[0]);
        _mm256_storeu_ps(c.add(8), acc[1]);
    } else {
        let mut tmp = [0f32; 16];
        _mm256_storeu_ps(tmp.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc[1]);
        std::ptr::copy_nonoverlapping(tmp.as_ptr(), c, cols);
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn gemv_avx2<const V: u8, const SUB: bool>(
    _: &Int8Panels,
    _: usize,
    _: *const Group,
    _: &QuantActs,
    _: usize,
    _: *mut f32,
    _: usize,
) {
    unreachable!("guarded by Isa::best")
}
