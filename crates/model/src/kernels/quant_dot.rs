//! `dot_rows`: the dot products of one quantized weight row with one or two rows of
//! 8-bit activations, by type: hand-written AVX2 kernels for Q5_0 · Q8_0 and
//! Q4_1 · Q8_1 (candle's are scalar), candle's run-time-dispatched AVX2 kernels for
//! Q8_0 and the K-quants (Q2_K..Q6_K against Q8_K), and candle's scalar code on CPUs
//! without AVX2. Every path is tested against candle's reference (`vec_dot_unopt`).

use candle_core::quantized::k_quants::GgmlType;
use candle_core::quantized::GgmlDType;
use half::f16;

use crate::kernels::cpu::has_avx2;
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::hsum256;

/// Same layouts as ggml's blocks (candle keeps their fields private).
#[repr(C)]
struct Q4_1 {
    d: f16,
    m: f16,
    qs: [u8; 16],
}
#[repr(C)]
struct Q8_1 {
    d: f16,
    s: f16,
    qs: [i8; 32],
}
#[repr(C)]
struct Q5_0 {
    d: f16,
    qh: [u8; 4],
    qs: [u8; 16],
}
#[repr(C)]
struct Q8_0 {
    d: f16,
    qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<Q4_1>() == 20 && std::mem::size_of::<Q8_1>() == 36);
const _: () = assert!(std::mem::size_of::<Q5_0>() == 22 && std::mem::size_of::<Q8_0>() == 34);

/// Reinterprets a block slice as our mirror of its layout.
///
/// # Safety
/// `U` must have `T`'s exact layout.
unsafe fn view<T, U>(v: &[T]) -> &[U] {
    std::slice::from_raw_parts(v.as_ptr() as *const U, v.len())
}

/// `(w · x0, w · x1)` over `k` values; with `x1 = None` the second is 0.
#[inline]
pub fn dot_rows<T: GgmlType>(
    k: usize,
    w: &[T],
    x0: &[T::VecDotType],
    x1: Option<&[T::VecDotType]>,
) -> (f32, f32) {
    if has_avx2() {
        match T::DTYPE {
            // SAFETY: T is Q5_0 (VecDotType Q8_0), with our mirrors' layouts; AVX2, FMA, F16C.
            GgmlDType::Q5_0 => unsafe {
                return q5_0_q8_0_avx2(view(w), view(x0), x1.map(|x| view(x)));
            },
            // SAFETY: T is Q4_1 (VecDotType Q8_1), with our mirrors' layouts; AVX2, FMA, F16C.
            GgmlDType::Q4_1 => unsafe {
                let a = q4_1_q8_1_avx2(view(w), view(x0));
                return (a, x1.map_or(0.0, |x| q4_1_q8_1_avx2(view(w), view(x))));
            },
            _ => {}
        }
    }
    (
        T::vec_dot(k, w, x0),
        x1.map_or(0.0, |x| T::vec_dot(k, w, x)),
    )
}

/// Q5_0 weights against one or two Q8_0 rows: each weight block is unpacked once
/// (nibbles plus the fifth bit, minus 16) and multiplied into both rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0_avx2(w: &[Q5_0], x0: &[Q8_0], x1: Option<&[Q8_0]>) -> (f32, f32) {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0x0F);
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0,
    );
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    let ones = _mm256_set1_epi8(-1);
    let hi_bits = _mm256_set1_epi8(0xF0u8 as i8);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (i, bw) in w.iter().enumerate() {
        let packed = _mm_loadu_si128(bw.qs.as_ptr() as *const __m128i);
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
        // 0xFF in each byte whose fifth bit is set; 0xF0 (-16 with the nibble) where not.
        let qh = u32::from_le_bytes(bw.qh) as i32;
        let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), shuf);
        let set = _mm256_cmpeq_epi8(_mm256_or_si256(bits, bit_mask), ones);
        let q = _mm256_or_si256(nib, _mm256_andnot_si256(set, hi_bits));
        let dw = bw.d.to_f32();
        let b0 = &x0[i];
        let y0 = _mm256_loadu_si256(b0.qs.as_ptr() as *const __m256i);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(dw * b0.d.to_f32()), mul_i8(q, y0), acc0);
        if let Some(x1) = x1 {
            let b1 = &x1[i];
            let y1 = _mm256_loadu_si256(b1.qs.as_ptr() as *const __m256i);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(dw * b1.d.to_f32()), mul_i8(q, y1), acc1);
        }
    }
    (hsum256(acc0), hsum256(acc1))
}

/// Signed 8-bit `a · b` summed in pairs of pairs into eight i32 lanes, as floats
/// (`|a| · sign(b, a)` keeps the unsigned-by-signed multiply exact for |a| <= 127).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mul_i8(
    a: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let sums = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, _mm256_set1_epi16(1)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1_avx2(x: &[Q4_1], y: &[Q8_1]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm_setzero_ps();
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for (bx, by) in x.iter().zip(y) {
        // [dx, mx, dy, sy] in one conversion, then [dx*dy, mx*sy, ..].
        let xs = bx.d.to_bits() as i32 | (bx.m.to_bits() as i32) << 16;
        let ys = by.d.to_bits() as i32 | (by.s.to_bits() as i32) << 16;
        let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, ys, xs));
        let prod = _mm_mul_ps(f, _mm_movehl_ps(f, f));
        mins = _mm_add_ps(mins, prod);
        let packed = _mm_loadu_si128(bx.qs.as_ptr() as *const __m128i);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let qx = _mm256_set_m128i(hi, lo);
        let qy = _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i);
        let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), ones);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(sums), acc);
    }
    hsum256(acc) + _mm_cvtss_f32(_mm_shuffle_ps(mins, mins, 1))
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn q5_0_q8_0_avx2(_: &[Q5_0], _: &[Q8_0], _: Option<&[Q8_0]>) -> (f32, f32) {
    unreachable!("guarded by has_avx2")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn q4_1_q8_1_avx2(_: &[Q4_1], _: &[Q8_1]) -> f32 {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{
        BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8_0,
    };
    use rand::{Rng, SeedableRng};

    /// Random weight and activation rows of `k` values, quantized; our dot products of
    /// the weight row with one and with two activation rows against candle's reference.
    fn check<T: GgmlType>(k: usize, seed: u64) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut row = |scale: f32| -> Vec<f32> {
            (0..k)
                .map(|_| rng.random_range(-1.0f32..1.0) * scale)
                .collect()
        };
        let (wf, x0f, x1f) = (row(0.5), row(3.0), row(0.1));
        let mut w = vec![T::zeros(); k / T::BLCK_SIZE];
        T::from_float(&wf, &mut w);
        let quant = |f: &[f32]| {
            let mut q = vec![T::VecDotType::zeros(); k / T::VecDotType::BLCK_SIZE];
            T::VecDotType::from_float(f, &mut q);
            q
        };
        let (x0, x1) = (quant(&x0f), quant(&x1f));
        let want = (T::vec_dot_unopt(k, &w, &x0), T::vec_dot_unopt(k, &w, &x1));
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        let one = dot_rows::<T>(k, &w, &x0, None);
        let two = dot_rows::<T>(k, &w, &x0, Some(&x1));
        assert!(
            close(one.0, want.0),
            "{:?} one row: {} vs {}",
            T::DTYPE,
            one.0,
            want.0
        );
        assert!(
            close(two.0, want.0) && close(two.1, want.1),
            "{:?} two rows: {two:?} vs {want:?}",
            T::DTYPE
        );
    }

    #[test]
    fn every_type_matches_candles_reference_dot() {
        for (k, seed) in [(256, 1), (1024, 2), (2048, 3)] {
            check::<BlockQ2K>(k, seed);
            check::<BlockQ3K>(k, seed);
            check::<BlockQ4K>(k, seed);
            check::<BlockQ5K>(k, seed);
            check::<BlockQ6K>(k, seed);
            check::<BlockQ5_0>(k, seed);
            check::<BlockQ8_0>(k, seed);
            check::<BlockQ4_1>(k, seed);
        }
        // Q5_0 and Q8_0 rows that are not a multiple of 256 (Gemma's 640).
        check::<BlockQ5_0>(640, 4);
        check::<BlockQ8_0>(640, 5);
    }
}
