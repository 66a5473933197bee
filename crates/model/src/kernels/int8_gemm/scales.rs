//! K-quant panels' factored scales (an f16 per super-block times a small integer per
//! block) as the f32 lanes the tiles multiply by: formed by a tile for each block
//! (`lane_512`, `lane_half`), or once per panel for all of a task's tiles (`expand`,
//! where `expands` says it pays). Both give the same f32 products, so a row's result
//! does not depend on which did.

use super::Isa;
use crate::kernels::int8_panels::{Int8Panels, Lanes, Scales, NR};

/// Whether a task's row tiles read `w`'s scales from one f32 copy of each panel's
/// (`expand`) instead of each tile forming them again: `Factored` scales combined in
/// float, a task of more than one tile of rows (`isa.rows`), and either AVX2 (8
/// columns a vector, so forming a lane takes twice the instructions) or two scales a
/// block (Q6_K: 24 of the 32 registers hold sums). Measured in one process, the rules
/// alternated call by call (Zen 4, 2 threads, Qwen 1.5B's feed-forward shapes): AVX2
/// tiles 10-20% faster expanded at 32 and 512 rows; AVX-512, Q6_K 8960 x 1536 at 32
/// rows 6% faster, Q4_K 6% slower, the rest within 1%.
pub(super) fn expands(w: &Int8Panels, isa: Isa, rows: usize) -> bool {
    matches!(w.scales, Scales::Factored { .. })
        && !w.int_halves()
        && rows > isa.rows(w)
        && (isa == Isa::Avx2 || w.sub)
}

/// Panel `p`'s `Factored` scales as f32 lanes into `out` (`kb · lanes_per_block`),
/// with `isa`'s vectors.
///
/// # Safety
/// `w.scales` is `Factored`, `p` a panel of `w`, and the CPU has `isa`.
pub(super) unsafe fn expand(w: &Int8Panels, isa: Isa, p: usize, out: &mut Vec<Lanes>) {
    out.resize(w.kb * w.lanes_per_block(), Lanes([0.0; NR]));
    match isa {
        Isa::Avx512Vnni => expand_512(w, p, out),
        Isa::Avx2 => expand_avx2(w, p, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn expand_512(w: &Int8Panels, p: usize, out: &mut [Lanes]) {
    for (i, lane) in out.iter_mut().enumerate() {
        std::arch::x86_64::_mm512_store_ps(lane.0.as_mut_ptr(), lane_512(w, p, i));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn expand_avx2(w: &Int8Panels, p: usize, out: &mut [Lanes]) {
    for (i, lane) in out.iter_mut().enumerate() {
        for half in 0..2 {
            let v = lane_half(w, p, i, half);
            std::arch::x86_64::_mm256_store_ps(lane.0.as_mut_ptr().add(half * 8), v);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn expand_512(_: &Int8Panels, _: usize, _: &mut [Lanes]) {
    unreachable!("8-bit tiles off x86-64")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn expand_avx2(_: &Int8Panels, _: usize, _: &mut [Lanes]) {
    unreachable!("8-bit tiles off x86-64")
}

/// Where lane row `i` of panel `p` keeps its parts: its super-block's factor (16 f16)
/// and its block's integers (16 bytes), and whether it is a minimum.
///
/// # Safety
/// `p` is a panel of `w` and `i < w.kb · w.lanes_per_block()`.
#[inline(always)]
unsafe fn parts(w: &Int8Panels, p: usize, i: usize) -> (*const u16, *const u8, bool, bool) {
    let (outer, inner, signed) = w.factored();
    let (kb, lpb) = (w.kb, w.lanes_per_block());
    let (b, j) = (i / lpb, i % lpb);
    let min = w.lane_is_min(j);
    let at = (p * (kb / 8) + b / 8) * 2 + min as usize;
    (
        outer.as_ptr().add(at) as *const u16,
        inner.as_ptr().add(p * kb * lpb + i) as *const u8,
        signed,
        min,
    )
}

/// Lane row `i` of panel `p`'s `Factored` scales as f32, all 16 columns: the
/// super-block's factor times the block's integer (a minimum's sign flipped, exactly:
/// it is `-(dmin·mn)`).
///
/// # Safety
/// As `parts`, `w.scales` is `Factored`, and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn lane_512(w: &Int8Panels, p: usize, i: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let (outer, inner, signed, min) = parts(w, p, i);
    let d = _mm512_cvtph_ps(_mm256_load_si256(outer as *const __m256i));
    let raw = _mm_load_si128(inner as *const __m128i);
    let q = match signed {
        true => _mm512_cvtepi8_epi32(raw),
        false => _mm512_cvtepu8_epi32(raw),
    };
    let v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
    match min {
        true => _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(v),
            _mm512_set1_epi32(i32::MIN),
        )),
        false => v,
    }
}

/// `lane_512`'s columns `8 · half .. 8 · half + 8` with AVX2.
///
/// # Safety
/// As `parts`, `w.scales` is `Factored`, `half` is 0 or 1, and the CPU has AVX2 and
/// F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn lane_half(
    w: &Int8Panels,
    p: usize,
    i: usize,
    half: usize,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let (outer, inner, signed, min) = parts(w, p, i);
    let d = _mm256_cvtph_ps(_mm_load_si128(outer.add(half * 8) as *const __m128i));
    let raw = _mm_loadl_epi64(inner.add(half * 8) as *const __m128i);
    let q = match signed {
        true => _mm256_cvtepi8_epi32(raw),
        false => _mm256_cvtepu8_epi32(raw),
    };
    let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    match min {
        true => _mm256_xor_ps(v, _mm256_set1_ps(-0.0)),
        false => v,
    }
}
