//! `Q8_0Rows`: Q8_0 weights repacked once, at load, for the decode matrix-vector
//! product (AVX2 only; e.g. the default model's tied output matrix). Per weight row
//! the block scales are stored apart (eight convert in one instruction) and the
//! 8-bit values in aligned 32-byte blocks, so the dot product reduces the integer
//! sums of eight blocks together instead of scaling each block on its own. The bytes
//! per weight are the file's (34 per block).
//!
//! The activations are quantized as candle's `BlockQ8_0::from_float` does (the Q8_0
//! dot type, `act_quant`); results match `vec_dot` up to float summation order.

use candle_core::quantized::k_quants::BlockQ8_0;
use half::f16;

use crate::kernels::act_quant::{gemv, ActRow, Block};
use crate::kernels::cpu::has_avx2;

/// ggml's Q8_0 block layout (candle keeps its fields private).
#[repr(C)]
struct Q8_0 {
    d: f16,
    qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<Q8_0>() == std::mem::size_of::<BlockQ8_0>());

/// One block's 8-bit values.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Values([i8; 32]);

pub struct Q8_0Rows {
    n: usize,
    k: usize,
    /// Blocks per row.
    kb: usize,
    /// Block scales `[n, kb]`.
    d: Vec<f16>,
    /// Block values `[n, kb]`.
    qs: Vec<Values>,
}

impl Q8_0Rows {
    /// Repacks a row-major `[n, k]` Q8_0 matrix.
    pub fn pack(w: &[BlockQ8_0], n: usize, k: usize) -> Self {
        let kb = k / 32;
        assert!(k.is_multiple_of(32) && w.len() >= n * kb);
        // SAFETY: Q8_0 mirrors BlockQ8_0's repr(C) layout (sizes asserted above).
        let w: &[Q8_0] = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const Q8_0, n * kb) };
        Q8_0Rows {
            n,
            k,
            kb,
            d: w.iter().map(|b| b.d).collect(),
            qs: w.iter().map(|b| Values(b.qs)).collect(),
        }
    }

    /// `out[m, n] = x[m, k] · Wᵀ`, the activations quantized to Q8_0.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        assert!(has_avx2());
        let kb = self.kb;
        gemv(x, rows, self.k, self.n, false, out, &|c, a| {
            let (wd, wq) = (&self.d[c * kb..][..kb], &self.qs[c * kb..][..kb]);
            // SAFETY: the CPU has AVX2, FMA and F16C (asserted).
            unsafe { dot(wd, wq, a) }
        });
    }
}

/// `Σ_b d_b·dy_b·(q_b · y_b)` over one weight row and one activation row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot(wd: &[f16], wq: &[Values], a: &ActRow) -> f32 {
    let (y, dy) = (a.qs, a.d);
    use std::arch::x86_64::*;
    let kb = wd.len();
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let groups = kb / 8;
    for g in 0..groups {
        let b0 = g * 8;
        let mut h = [_mm256_setzero_si256(); 4];
        for (p, hp) in h.iter_mut().enumerate() {
            let (b, c) = (b0 + 2 * p, b0 + 2 * p + 1);
            *hp = _mm256_hadd_epi32(
                block_sums(&wq[b], &y[b], ones),
                block_sums(&wq[c], &y[c], ones),
            );
        }
        let sums = reduce_blocks8(h);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd.as_ptr().add(b0) as *const __m128i));
        let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(dy.as_ptr().add(b0)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
    }
    let mut tail = 0f32;
    for b in groups * 8..kb {
        let isum = hsum256(_mm256_cvtepi32_ps(block_sums(&wq[b], &y[b], ones)));
        tail += wd[b].to_f32() * dy[b] * isum;
    }
    hsum256(acc) + tail
}

/// The integer sums of block `w` times block `y` (signed by signed, through
/// `|w| · sign(y, w)`), in eight i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_sums(
    w: &Values,
    y: &Block,
    ones: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let w = _mm256_load_si256(w.0.as_ptr() as *const __m256i);
    let y = _mm256_load_si256(y.0.as_ptr() as *const __m256i);
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
    _mm256_madd_epi16(p, ones)
}

#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::{hsum256, reduce_blocks8};

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dot(_: &[f16], _: &[Values], _: &ActRow) -> f32 {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;
    use candle_core::quantized::k_quants::GgmlType;

    #[test]
    fn matches_candle_reference_kernels() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        // Rows of 1 block, 9 (a group and a tail), 18 and 48 (the model's).
        for (m, k, n) in [(1, 32, 3), (2, 288, 17), (1, 576, 40), (3, 1536, 9)] {
            let wf = data(n * k, 11);
            let mut w = vec![BlockQ8_0::zeros(); n * k / 32];
            BlockQ8_0::from_float(&wf, &mut w);
            let x: Vec<f32> = data(m * k, 5).iter().map(|v| v * 3.0).collect();
            let mut ours = vec![f32::NAN; m * n];
            Q8_0Rows::pack(&w, n, k).matmul(&x, m, &mut ours);
            let mut theirs = vec![0f32; m * n];
            candle_core::quantized::k_quants::matmul::<BlockQ8_0>((m, k, n), &x, &w, &mut theirs)
                .unwrap();
            for (a, b) in ours.iter().zip(&theirs) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m}x{k}x{n}: {a} vs {b}"
                );
            }
        }
    }
}
