//! `Q4_1Rows`: Q4_1 weights repacked once, at load, for the decode matrix-vector
//! product (AVX2 only). Per weight row the block scales and minimums are stored apart
//! (eight convert in one instruction) and the 4-bit values of two consecutive blocks
//! share one aligned 32-byte vector (low nibbles: the first block in element order;
//! high nibbles: the second), so the dot product unpacks two blocks in three
//! instructions and reduces the integer sums of eight blocks together: about six
//! instructions per 32 weights, against some thirty for one block at a time. The
//! bytes per weight are the file's (20 per block).
//!
//! The activations are quantized as candle's `BlockQ8_1::from_float` does (the Q4_1
//! dot type, `act_quant`); results match `vec_dot` up to float summation order.

use candle_core::quantized::k_quants::BlockQ4_1;
use half::f16;

use crate::kernels::act_quant::{gemv, ActRow, Block};
use crate::kernels::cpu::has_avx2;

/// ggml's Q4_1 block layout (candle keeps its fields private).
#[repr(C)]
struct Q4_1 {
    d: f16,
    m: f16,
    qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<Q4_1>() == std::mem::size_of::<BlockQ4_1>());

/// Two blocks' 4-bit values, one per byte half.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Pair([u8; 32]);

pub struct Q4_1Rows {
    n: usize,
    k: usize,
    /// Blocks per row.
    kb: usize,
    /// Block scales `[n, kb]`.
    d: Vec<f16>,
    /// Block minimums `[n, kb]`.
    m: Vec<f16>,
    /// `[n, kb.div_ceil(2)]` pairs of blocks.
    qs: Vec<Pair>,
}

impl Q4_1Rows {
    /// Repacks a row-major `[n, k]` Q4_1 matrix.
    pub fn pack(w: &[BlockQ4_1], n: usize, k: usize) -> Self {
        let kb = k / 32;
        assert!(k.is_multiple_of(32) && w.len() >= n * kb);
        // SAFETY: Q4_1 mirrors BlockQ4_1's repr(C) layout (sizes asserted above).
        let w: &[Q4_1] = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const Q4_1, n * kb) };
        let nibble = |b: &Q4_1, j: usize| {
            if j < 16 {
                b.qs[j] & 0x0F
            } else {
                b.qs[j - 16] >> 4
            }
        };
        let pairs = kb.div_ceil(2);
        let mut qs = Vec::with_capacity(n * pairs);
        for row in w.chunks_exact(kb.max(1)).take(n) {
            for p in 0..pairs {
                let mut pair = Pair([0; 32]);
                for (j, v) in pair.0.iter_mut().enumerate() {
                    let hi = row.get(2 * p + 1).map_or(0, |b| nibble(b, j));
                    *v = nibble(&row[2 * p], j) | hi << 4;
                }
                qs.push(pair);
            }
        }
        Q4_1Rows {
            n,
            k,
            kb,
            d: w.iter().map(|b| b.d).collect(),
            m: w.iter().map(|b| b.m).collect(),
            qs,
        }
    }

    /// `out[m, n] = x[m, k] · Wᵀ`, the activations quantized to Q8_1.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        assert!(has_avx2());
        let (kb, pairs) = (self.kb, self.kb.div_ceil(2));
        gemv(x, rows, self.k, self.n, true, out, &|c, a| {
            let w = Row {
                d: &self.d[c * kb..][..kb],
                m: &self.m[c * kb..][..kb],
                qs: &self.qs[c * pairs..][..pairs],
            };
            // SAFETY: the CPU has AVX2, FMA and F16C (asserted).
            unsafe { dot(&w, a) }
        });
    }
}

/// One weight row.
struct Row<'a> {
    d: &'a [f16],
    m: &'a [f16],
    qs: &'a [Pair],
}

/// `Σ_b d_b·dy_b·(q_b · y_b) + m_b·sy_b` over the row's blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot(w: &Row, a: &ActRow) -> f32 {
    use std::arch::x86_64::*;
    let kb = w.d.len();
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let (qp, yp) = (w.qs.as_ptr() as *const __m256i, a.qs.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let groups = kb / 8;
    for g in 0..groups {
        let b0 = g * 8;
        // Pairs (b0, b0+1) .. (b0+6, b0+7); each hadd keeps two blocks' partial sums.
        let mut h = [_mm256_setzero_si256(); 4];
        for (p, hp) in h.iter_mut().enumerate() {
            let v = _mm256_load_si256(qp.add(b0 / 2 + p));
            let q0 = _mm256_and_si256(v, low);
            let q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            *hp = _mm256_hadd_epi32(
                block_sums(q0, &*yp.add(b0 + 2 * p), ones),
                block_sums(q1, &*yp.add(b0 + 2 * p + 1), ones),
            );
        }
        let sums = reduce_blocks8(h);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(w.d.as_ptr().add(b0) as *const __m128i));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(w.m.as_ptr().add(b0) as *const __m128i));
        let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(a.d.as_ptr().add(b0)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
        acc = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a.s.as_ptr().add(b0)), acc);
    }
    let mut tail = 0f32;
    for b in groups * 8..kb {
        let v = _mm256_load_si256(qp.add(b / 2));
        let v = if b % 2 == 0 {
            v
        } else {
            _mm256_srli_epi16(v, 4)
        };
        let isum = hsum256(_mm256_cvtepi32_ps(block_sums(
            _mm256_and_si256(v, low),
            &*yp.add(b),
            ones,
        )));
        tail += w.d[b].to_f32() * a.d[b] * isum + w.m[b].to_f32() * a.s[b];
    }
    hsum256(acc) + tail
}

/// The integer sums of 4-bit `q` times block `y`'s 32 values, in eight i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_sums(
    q: std::arch::x86_64::__m256i,
    y: &Block,
    ones: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let y = _mm256_load_si256(y.0.as_ptr() as *const __m256i);
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones)
}

#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::{hsum256, reduce_blocks8};

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dot(_: &Row, _: &ActRow) -> f32 {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;
    use candle_core::quantized::k_quants::GgmlType;

    /// Candle's `matmul`, which asserts an even block count per row in debug
    /// builds: an odd row gets one zero block (and `x` 32 zeros), which adds
    /// exactly nothing to any dot product.
    fn reference(x: &[f32], (m, k, n): (usize, usize, usize), w: &[BlockQ4_1]) -> Vec<f32> {
        let nb = k / 32;
        let pad = nb % 2;
        let kp = k + 32 * pad;
        let mut wp = Vec::with_capacity(n * (nb + pad));
        for row in w.chunks(nb) {
            wp.extend_from_slice(row);
            wp.extend(std::iter::repeat_n(BlockQ4_1::zeros(), pad));
        }
        let mut xp = Vec::with_capacity(m * kp);
        for row in x.chunks(k) {
            xp.extend_from_slice(row);
            xp.extend(std::iter::repeat_n(0f32, 32 * pad));
        }
        let mut out = vec![0f32; m * n];
        candle_core::quantized::k_quants::matmul::<BlockQ4_1>((m, kp, n), &xp, &wp, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn matches_candle_reference_kernels() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        // Rows of 1 block (odd), 9 (a group and an odd tail), 18 and 48 (the model's).
        for (m, k, n) in [(1, 32, 3), (2, 288, 17), (1, 576, 40), (3, 1536, 9)] {
            let wf = data(n * k, 7);
            let mut w = vec![BlockQ4_1::zeros(); n * k / 32];
            BlockQ4_1::from_float(&wf, &mut w);
            let x: Vec<f32> = data(m * k, 3).iter().map(|v| v * 2.5).collect();
            let mut ours = vec![f32::NAN; m * n];
            Q4_1Rows::pack(&w, n, k).matmul(&x, m, &mut ours);
            let theirs = reference(&x, (m, k, n), &w);
            for (a, b) in ours.iter().zip(&theirs) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m}x{k}x{n}: {a} vs {b}"
                );
            }
        }
    }
}
