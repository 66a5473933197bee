//! Quantized matrix multiplication for small batches (decode): activations quantized
//! to 8 bits once per row, weight rows split over the rayon pool, and a hand-written
//! AVX2 kernel for Q4_1 · Q8_1 (candle's is scalar); other types use candle's dots.

use std::cell::RefCell;

use candle_core::quantized::k_quants::GgmlType;
use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::hsum256;
use crate::kernels::cpu::{has_avx2, OutPtr};

thread_local! {
    /// Quantized activations, reused across calls (u64 for alignment).
    static XQ: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Same layout as ggml's `block_q4_1` / `block_q8_1` (candle keeps its fields private).
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
const _: () = assert!(std::mem::size_of::<Q4_1>() == 20 && std::mem::size_of::<Q8_1>() == 36);

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with `w` in blocks of type `T`.
pub fn qmatmul<T: GgmlType>(w: &[T], x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    let kb = k / T::BLCK_SIZE;
    assert!(w.len() >= n * kb && x.len() >= m * k && out.len() >= m * n);
    let elem = std::mem::size_of::<T::VecDotType>();
    XQ.with(|cell| {
        let mut buf = cell.borrow_mut();
        let words = (m * kb * elem).div_ceil(8);
        if buf.len() < words {
            buf.resize(words, 0);
        }
        // SAFETY: the buffer holds m * kb blocks, is 8-byte aligned, and every block
        // is written by from_float before it is read.
        let xq: &mut [T::VecDotType] = unsafe {
            std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut T::VecDotType, m * kb)
        };
        for r in 0..m {
            T::VecDotType::from_float(&x[r * k..(r + 1) * k], &mut xq[r * kb..(r + 1) * kb]);
        }
        let xq: &[T::VecDotType] = xq;
        let fast_q4_1 = T::DTYPE == GgmlDType::Q4_1 && has_avx2();
        let tasks = (rayon::current_num_threads() * 8).max(1);
        let tile = n.div_ceil(tasks).max(4);
        let ptr = OutPtr(out.as_mut_ptr());
        (0..n.div_ceil(tile)).into_par_iter().for_each(|t| {
            for c in t * tile..((t + 1) * tile).min(n) {
                let wr = &w[c * kb..(c + 1) * kb];
                for r in 0..m {
                    let xr = &xq[r * kb..(r + 1) * kb];
                    let v = if fast_q4_1 {
                        // SAFETY: T is Q4_1 (so VecDotType is Q8_1), same layout as ours;
                        // the CPU has AVX2, FMA and F16C.
                        unsafe {
                            dot_q4_1_q8_1_avx2(
                                std::slice::from_raw_parts(wr.as_ptr() as *const Q4_1, kb),
                                std::slice::from_raw_parts(xr.as_ptr() as *const Q8_1, kb),
                            )
                        }
                    } else {
                        T::vec_dot(k, wr, xr)
                    };
                    // SAFETY: (r, c) is inside out, and only this task writes column c.
                    unsafe { *ptr.get().add(r * n + c) = v };
                }
            }
        });
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_avx2(x: &[Q4_1], y: &[Q8_1]) -> f32 {
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
unsafe fn dot_q4_1_q8_1_avx2(_: &[Q4_1], _: &[Q8_1]) -> f32 {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;
    use candle_core::quantized::k_quants::{BlockQ4_1, BlockQ8_0};

    fn check<T: GgmlType>(m: usize, k: usize, n: usize) {
        let wf = data(n * k, 7);
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&wf, &mut w);
        let x = data(m * k, 3);
        let mut ours = vec![0f32; m * n];
        qmatmul(&w, &x, m, k, n, &mut ours);
        let mut theirs = vec![0f32; m * n];
        candle_core::quantized::k_quants::matmul::<T>((m, k, n), &x, &w, &mut theirs).unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn matches_candle_reference_kernels() {
        for (m, k, n) in [(1, 64, 3), (3, 576, 17), (8, 1536, 64), (31, 576, 576)] {
            check::<BlockQ4_1>(m, k, n);
            check::<BlockQ8_0>(m, k, n);
        }
    }
}
