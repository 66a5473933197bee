//! The AVX2 tile of the 8-bit GEMM (`int8_gemm`): 8 columns at a time, `vpmaddubsw`
//! pair sums in 16 bits, by how a panel stores its values (`avx2_values`).

use super::{folds_zero, zero_pair, PREFETCH_BLOCKS, PREFETCH_ROWS};
use crate::kernels::act_quant::QuantActs;
use crate::kernels::int8_panels::{Group, Int8Panels, Lanes, Scales};

/// How the AVX2 tile reads a panel's values (its `V` parameter).
pub(super) const NIBBLES: u8 = 0;
/// One byte each, at most 63: pairs of products sum in 16 bits.
pub(super) const BYTES: u8 = 1;
/// One byte each, up to 255 (Q8_0's shifted values): the weights are read back as
/// signed bytes (`stored ^ 0x80`) and multiply the activations' `Halves` (each in
/// `0..16`, shifted by 128, split once per row for every column), two products per
/// 32-weight group; the shift's `128 · Σ q` per column comes from the panels.
pub(super) const WIDE: u8 = 2;

/// 5- or 6-bit values as nibbles and high planes (`Int8Panels::high`): each group
/// merged back into bytes (a shift, two masks and an or), then as `BYTES`.
pub(super) const SIX: u8 = 3;

/// Which of the above the AVX2 tile takes for `w`.
pub(super) fn avx2_values(w: &Int8Panels) -> u8 {
    match (w.nibbles, w.high, w.qmax) {
        (true, true, _) => SIX,
        (true, false, _) => NIBBLES,
        (false, _, ..=63) => BYTES,
        _ => WIDE,
    }
}

/// `c[R, cols] = rows r0..r0+R of a · panel p` with AVX2, 8 columns at a time,
/// the panel's values read at `vals` as `V` stores them (the panel's own groups, or
/// a task's byte copy of them: `Int8Panels::panel_bytes`).
/// `vpmaddubsw` sums pairs of products in 16 bits: two groups' sums fit for 6-bit
/// values (`2 · 63 · 127` each), four for 5-bit, a whole block's for 4-bit ones.
/// `MIN`: the panel has minimums and no zero point (asymmetric types), else a zero
/// point. `SUB`: two scales per block (Q2_K, Q3_K, Q6_K), each half's sums apart
/// (nibbles keep the first half low, the second high): Q6_K's scaled apart in
/// float, Q2_K's and Q3_K's (`int_halves`, minimums included whatever `MIN`) times
/// their integer scales and summed in integers.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_avx2<const R: usize, const V: u8, const MIN: bool, const SUB: bool>(
    w: &Int8Panels,
    p: usize,
    vals: *const Group,
    a: &QuantActs,
    r0: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    pre: *const Lanes,
) {
    use std::arch::x86_64::*;
    let (kb, per) = (w.kb, w.groups_per_block());
    let ones = _mm256_set1_epi16(1);
    let sixteen = _mm256_set1_epi16(16);
    // Each byte's low and high 4 bits, as bytes.
    let nibbles = |raw: __m256i| {
        let low = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(raw, low),
            _mm256_and_si256(_mm256_srli_epi16(raw, 4), low),
        )
    };
    // Groups summed in 16 bits before widening (BYTES): 8 for 4-bit, 4 for 5-bit,
    // 2 for 6-bit.
    let run = match w.qmax {
        ..=15 if !SUB => 8,
        ..=31 => 4,
        _ => 2,
    };
    for half in 0..2 {
        if half * 8 >= cols {
            break;
        }
        let gp = (vals as *const __m256i).add(half);
        let lpb = w.lanes_per_block();
        // This half's 8 columns of lane row `i` of the panel's scales.
        let lanes = |i: usize| match &w.scales {
            _ if !pre.is_null() => _mm256_load_ps((pre.add(i) as *const f32).add(half * 8)),
            Scales::F16(s) => _mm256_cvtph_ps(_mm_load_si128(
                (s.as_ptr().add(p * kb * lpb + i) as *const u16).add(half * 8) as *const __m128i,
            )),
            Scales::F32(s) => {
                _mm256_load_ps((s.as_ptr().add(p * kb * lpb + i) as *const f32).add(half * 8))
            }
            Scales::Factored { .. } => super::scales::lane_half(w, p, i, half),
        };
        // A zero point's `-zero · Σ q_a` as where the integer sums start (Q8_0's
        // shift is taken apart by `wsum128`).
        let fold = V != WIDE && folds_zero(w);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..kb {
            if R <= PREFETCH_ROWS {
                // Hints only: past the panels' end they read nothing and fault never.
                // Half 0 reads every line of the panel (each holds both halves' 32
                // bytes), half 1 the same lines again from cache: while it runs, the
                // next panel's lines are fetched into L2, so that memory keeps
                // streaming through both passes (at a task's last panel, the next
                // task's first: a wasted hint, once a task).
                let block = match half {
                    0 => p * kb + b + PREFETCH_BLOCKS,
                    _ => (p + 1) * kb + b,
                };
                let lines = (w.groups.as_ptr() as *const __m512i).wrapping_add(block * per);
                for v in 0..per {
                    let line = lines.wrapping_add(v) as *const i8;
                    match half {
                        0 => _mm_prefetch::<_MM_HINT_T0>(line),
                        _ => _mm_prefetch::<_MM_HINT_T1>(line),
                    }
                }
            }
            // Row r's start for the block's first half (`SUB`) or whole block, and its
            // second half.
            let start = |r: usize, second: bool| {
                let i = a.at(r0 + r, b);
                match (fold, SUB, second) {
                    (false, ..) => _mm256_setzero_si256(),
                    (true, false, _) => _mm256_set1_epi32(*a.zero_all.get_unchecked(i)),
                    (true, true, false) => _mm256_set1_epi32(*a.zero_lo.get_unchecked(i)),
                    (true, true, true) => _mm256_set1_epi32(*a.zero_hi.get_unchecked(i)),
                }
            };
            // Row r's 4 activations of group g, in every 32-bit lane.
            let act = |r: usize, g: usize| {
                let q = a.qs.get_unchecked(a.at(r0 + r, b)).0.as_ptr().add(4 * g);
                _mm256_set1_epi32((q as *const i32).read_unaligned())
            };
            let mut s = [_mm256_setzero_si256(); R];
            let mut s_lo = [_mm256_setzero_si256(); R];
            if V == NIBBLES && SUB {
                // The halves' sums apart: low nibbles (the first half), high.
                let (mut lo16, mut hi16) =
                    ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
                for v in 0..4 {
                    let (lo, hi) = nibbles(_mm256_load_si256(gp.add((b * 4 + v) * 2)));
                    for r in 0..R {
                        lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, act(r, v)));
                        hi16[r] =
                            _mm256_add_epi16(hi16[r], _mm256_maddubs_epi16(hi, act(r, v + 4)));
                    }
                }
                for r in 0..R {
                    s_lo[r] = _mm256_madd_epi16(lo16[r], ones);
                    s[r] = _mm256_madd_epi16(hi16[r], ones);
                }
            } else if V == NIBBLES {
                let mut s16 = [_mm256_setzero_si256(); R];
                for v in 0..4 {
                    let (lo, hi) = nibbles(_mm256_load_si256(gp.add((b * 4 + v) * 2)));
                    for (r, s16) in s16.iter_mut().enumerate() {
                        *s16 = _mm256_add_epi16(*s16, _mm256_maddubs_epi16(lo, act(r, v)));
                        *s16 = _mm256_add_epi16(*s16, _mm256_maddubs_epi16(hi, act(r, v + 4)));
                    }
                }
                for (r, (s, s16)) in s.iter_mut().zip(&s16).enumerate() {
                    *s = _mm256_add_epi32(start(r, false), _mm256_madd_epi16(*s16, ones));
                }
            } else if V == WIDE {
                // Σ (q_a + 128)·q_w = Σ lo·q_w + 16·Σ hi·q_w: each pair at most
                // 2·15·128, eight groups' sums within 16 bits.
                let flip = _mm256_set1_epi8(-128);
                let (mut lo16, mut hi16) =
                    ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
                for g in 0..8 {
                    let wv = _mm256_xor_si256(_mm256_load_si256(gp.add((b * 8 + g) * 2)), flip);
                    for r in 0..R {
                        let h = a.halves.get_unchecked(a.at(r0 + r, b));
                        let lo = (h.lo.as_ptr().add(4 * g) as *const i32).read_unaligned();
                        let hi = (h.hi.as_ptr().add(4 * g) as *const i32).read_unaligned();
                        let (lo, hi) = (_mm256_set1_epi32(lo), _mm256_set1_epi32(hi));
                        lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, wv));
                        hi16[r] = _mm256_add_epi16(hi16[r], _mm256_maddubs_epi16(hi, wv));
                    }
                }
                for r in 0..R {
                    s[r] = _mm256_add_epi32(
                        _mm256_madd_epi16(lo16[r], ones),
                        _mm256_madd_epi16(hi16[r], sixteen),
                    );
                }
            } else {
                // Group g's values as bytes: stored so, or merged from its nibbles and
                // its field of a high plane (bits 2u, 2u + 1 of every byte, moved to
                // bits 4-5 in 16-bit lanes; the mask keeps only the same byte's bits).
                let group = |g: usize| {
                    if V != SIX {
                        return _mm256_load_si256(gp.add((b * 8 + g) * 2));
                    }
                    // Nibble vector g % 4 holds group g; plane g / 4, field g % 4.
                    let u = g % 4;
                    let raw = _mm256_load_si256(gp.add((b * 6 + u) * 2));
                    let nib = match g < 4 {
                        true => _mm256_and_si256(raw, _mm256_set1_epi8(0x0F)),
                        false => {
                            _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F))
                        }
                    };
                    let plane = _mm256_load_si256(gp.add((b * 6 + 4 + g / 4) * 2));
                    let field = match u {
                        0 => _mm256_slli_epi16(plane, 4),
                        1 => _mm256_slli_epi16(plane, 2),
                        2 => plane,
                        _ => _mm256_srli_epi16(plane, 2),
                    };
                    _mm256_or_si256(nib, _mm256_and_si256(field, _mm256_set1_epi8(0x30)))
                };
                s = std::array::from_fn(|r| start(r, false));
                for g0 in (0..8).step_by(run) {
                    if SUB && g0 == 4 {
                        s_lo = s;
                        s = std::array::from_fn(|r| start(r, true));
                    }
                    let mut s16 = [_mm256_setzero_si256(); R];
                    for g in g0..g0 + run {
                        let wv = group(g);
                        for (r, s16) in s16.iter_mut().enumerate() {
                            *s16 = _mm256_add_epi16(*s16, _mm256_maddubs_epi16(wv, act(r, g)));
                        }
                    }
                    for (s, s16) in s.iter_mut().zip(&s16) {
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*s16, ones));
                    }
                }
            }
            if SUB && w.int_halves() {
                // As `tile_vnni` sums Q2_K and Q3_K: each half's sum times its small
                // integer scale, both halves in one `vpmaddwd`; the zero point and
                // the minimums likewise; one float multiply-add per factor.
                let (outer, inner, signed) = w.block_factors(p, b);
                let factor = |o: usize| {
                    let f = (outer.as_ptr().add(o) as *const u16).add(half * 8);
                    _mm256_cvtph_ps(_mm_load_si128(f as *const __m128i))
                };
                let raw = (inner.as_ptr() as *const u8).add(half * 8);
                // This half's 8 columns' integers for the two halves of the block
                // (lanes l, l + 1), as 16-bit pairs.
                let pairs = |l: usize| {
                    let x = _mm_loadl_epi64(raw.add(16 * l) as *const __m128i);
                    let y = _mm_loadl_epi64(raw.add(16 * (l + 1)) as *const __m128i);
                    match signed {
                        true => _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, y)),
                        false => _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x, y)),
                    }
                };
                let (d, sc) = (factor(0), pairs(0));
                let (dmin, mn) = match w.has_min {
                    true => (factor(1), pairs(2)),
                    false => (_mm256_setzero_ps(), _mm256_setzero_si256()),
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let i = a.at(r0 + r, b);
                    let (sum, lo) = (*a.sum.get_unchecked(i), *a.sum_lo.get_unchecked(i));
                    let mut halves =
                        _mm256_blend_epi16::<0xAA>(s_lo[r], _mm256_slli_epi32::<16>(s[r]));
                    if w.zero != 0 {
                        let z = _mm256_set1_epi32(zero_pair(w, sum, lo));
                        halves = _mm256_sub_epi16(halves, z);
                    }
                    let t = _mm256_madd_epi16(halves, sc);
                    let da = _mm256_broadcast_ss(a.d.get_unchecked(i));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d, da), *acc);
                    if w.has_min {
                        let sums = _mm256_set1_epi32((lo & 0xFFFF) | ((sum - lo) << 16));
                        let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, mn));
                        *acc = _mm256_fnmadd_ps(m, _mm256_mul_ps(dmin, da), *acc);
                    }
                }
                continue;
            }
            let d = lanes(b * lpb);
            if SUB {
                let d_hi = lanes(b * lpb + 1);
                for (r, acc) in acc.iter_mut().enumerate() {
                    // The sums started at the zero point's terms (`fold`).
                    let da = _mm256_broadcast_ss(a.d.get_unchecked(a.at(r0 + r, b)));
                    let (t_lo, t_hi) = (s_lo[r], s[r]);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t_lo), _mm256_mul_ps(d, da), *acc);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t_hi), _mm256_mul_ps(d_hi, da), *acc);
                }
                continue;
            }
            let m = if MIN {
                lanes(b * lpb + 1)
            } else {
                _mm256_setzero_ps()
            };
            let wsum = if V == WIDE {
                let ws = w.wsum128.get_unchecked(p * kb + b).as_ptr().add(half * 8);
                _mm256_loadu_si256(ws as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let i = a.at(r0 + r, b);
                let scale = _mm256_mul_ps(d, _mm256_broadcast_ss(a.d.get_unchecked(i)));
                if V == WIDE {
                    let t = _mm256_sub_epi32(s[r], wsum);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scale, *acc);
                } else if MIN {
                    let dsum = _mm256_broadcast_ss(a.dsum.get_unchecked(i));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), scale, *acc);
                    *acc = _mm256_fmadd_ps(m, dsum, *acc);
                } else {
                    // A zero point's terms are in the sums already (`fold`).
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), scale, *acc);
                }
            }
        }
        let n8 = (cols - half * 8).min(8);
        for (r, acc) in acc.iter().enumerate() {
            let dst = c.add(r * ldc + half * 8);
            if n8 == 8 {
                _mm256_storeu_ps(dst, *acc);
            } else {
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), *acc);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, n8);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile_avx2<const R: usize, const V: u8, const MIN: bool, const SUB: bool>(
    _: &Int8Panels,
    _: usize,
    _: *const Group,
    _: &QuantActs,
    _: usize,
    _: *mut f32,
    _: usize,
    _: usize,
    _: *const Lanes,
) {
    unreachable!("guarded by Isa::best")
}
