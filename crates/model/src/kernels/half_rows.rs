//! `half_rows::matmul`: the decode product on f16 or bf16 weights kept in their 2
//! bytes a weight (AVX2 + F16C). Each weight is widened to f32 in a register (exact
//! for both types) and multiplied with the f32 activations, so the products are those
//! of f32 weights, read from half the bytes; up to `ROWS` activation rows share each
//! load of a weight row. Without AVX2 a portable loop computes the same products.

use half::{bf16, f16};

use crate::kernels::cpu::{has_avx2, OutPtr};
use crate::kernels::pool::{parallel_for, threads};

/// Activation rows multiplied per pass over a weight row (their accumulators stay in
/// registers: 2 per row).
const ROWS: usize = 4;

/// A half-precision weight matrix `[n, k]`, row-major, as the GGUF file stores it.
#[derive(Clone, Copy)]
pub enum HalfWeights<'a> {
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl HalfWeights<'_> {
    fn len(self) -> usize {
        match self {
            HalfWeights::F16(w) => w.len(),
            HalfWeights::BF16(w) => w.len(),
        }
    }

    fn get(self, i: usize) -> f32 {
        match self {
            HalfWeights::F16(w) => w[i].to_f32(),
            HalfWeights::BF16(w) => w[i].to_f32(),
        }
    }
}

/// `out[m, n] = x[m, k] · Wᵀ` for `w` of shape `[n, k]`.
pub fn matmul(w: HalfWeights, n: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    assert!(w.len() >= n * k && x.len() >= m * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let tile = n.div_ceil(threads() * 8).max(4);
    let ptr = OutPtr(out.as_mut_ptr());
    parallel_for(n.div_ceil(tile), &|t| {
        let mut sums = [0f32; ROWS];
        for c in t * tile..((t + 1) * tile).min(n) {
            for r0 in (0..m).step_by(ROWS) {
                let rows = ROWS.min(m - r0);
                dot_rows(w, c, k, &x[r0 * k..], rows, &mut sums);
                for (i, &s) in sums[..rows].iter().enumerate() {
                    // SAFETY: (r0 + i, c) lies inside out (m x n, asserted); only this
                    // task writes column c.
                    unsafe { *ptr.get().add((r0 + i) * n + c) = s };
                }
            }
        }
    });
}

/// `sums[r] = x[r] · w[c]` for the `rows` (1..=ROWS) rows of `x` (stride `k`).
fn dot_rows(w: HalfWeights, c: usize, k: usize, x: &[f32], rows: usize, sums: &mut [f32; ROWS]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C; row c of w and `rows` rows of x
        // hold k values each (asserted by `matmul`).
        unsafe {
            match w {
                HalfWeights::F16(w) => {
                    avx2::dot_rows::<false>(w.as_ptr().add(c * k).cast(), k, x, rows, sums)
                }
                HalfWeights::BF16(w) => {
                    avx2::dot_rows::<true>(w.as_ptr().add(c * k).cast(), k, x, rows, sums)
                }
            }
        }
        return;
    }
    for (r, s) in sums[..rows].iter_mut().enumerate() {
        *s = (0..k).map(|i| w.get(c * k + i) * x[r * k + i]).sum();
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::ROWS;
    use crate::kernels::cpu::hsum256;
    use std::arch::x86_64::*;

    /// Eight weights at `w` widened to f32: f16 through F16C, bf16 by a shift.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8<const BF16: bool>(w: *const u16) -> __m256 {
        let h = _mm_loadu_si128(w as *const __m128i);
        if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        } else {
            _mm256_cvtph_ps(h)
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `w` points at k halves; `x` holds `rows`
    /// (<= ROWS) rows of stride k.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows<const BF16: bool>(
        w: *const u16,
        k: usize,
        x: &[f32],
        rows: usize,
        sums: &mut [f32; ROWS],
    ) {
        debug_assert!((1..=ROWS).contains(&rows) && x.len() >= (rows - 1) * k + k);
        let xp = x.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        let body = k - k % 16;
        let mut i = 0;
        while i < body {
            let (w0, w1) = (load8::<BF16>(w.add(i)), load8::<BF16>(w.add(i + 8)));
            // A constant trip count per `rows` keeps the accumulators in registers.
            macro_rules! rows_fma {
                ($n:expr) => {
                    for (r, a) in acc.iter_mut().enumerate().take($n) {
                        let p = xp.add(r * k + i);
                        a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(p), a[0]);
                        a[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(p.add(8)), a[1]);
                    }
                };
            }
            match rows {
                1 => rows_fma!(1),
                2 => rows_fma!(2),
                3 => rows_fma!(3),
                _ => rows_fma!(4),
            }
            i += 16;
        }
        for (r, s) in sums[..rows].iter_mut().enumerate() {
            let mut t = hsum256(_mm256_add_ps(acc[r][0], acc[r][1]));
            for j in body..k {
                let wj = if BF16 {
                    f32::from_bits((*w.add(j) as u32) << 16)
                } else {
                    half::f16::from_bits(*w.add(j)).to_f32()
                };
                t += wj * *xp.add(r * k + j);
            }
            *s = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;

    fn naive(w: &[f32], x: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
            }
        }
        out
    }

    /// Both types, every row count through and past `ROWS`, K with and without a
    /// tail past the 16-wide body: the f32 products of the widened weights.
    #[test]
    fn matches_f32_products_of_the_widened_weights() {
        for (m, k, n) in [
            (1, 16, 3),
            (2, 576, 17),
            (3, 100, 9),
            (4, 7, 5),
            (5, 640, 33),
            (9, 1536, 8),
        ] {
            let (x, wf) = (test_data(m * k, 3), test_data(n * k, 11));
            let h: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
            let b: Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
            let cases = [
                (
                    HalfWeights::F16(&h),
                    h.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                ),
                (
                    HalfWeights::BF16(&b),
                    b.iter().map(|v| v.to_f32()).collect(),
                ),
            ];
            for (w, widened) in cases {
                let mut out = vec![f32::NAN; m * n];
                matmul(w, n, k, &x, m, &mut out);
                for (a, e) in out.iter().zip(naive(&widened, &x, m, k, n)) {
                    assert!(
                        (a - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{m}x{k}x{n}: {a} vs {e}"
                    );
                }
            }
        }
    }

    /// A row's result does not depend on how many rows share its pass.
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (k, n) = (576, 24);
        let h: Vec<f16> = test_data(n * k, 5)
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let x = test_data(7 * k, 8);
        let mut all = vec![0f32; 7 * n];
        matmul(HalfWeights::F16(&h), n, k, &x, 7, &mut all);
        for r in 0..7 {
            let mut one = vec![0f32; n];
            matmul(
                HalfWeights::F16(&h),
                n,
                k,
                &x[r * k..(r + 1) * k],
                1,
                &mut one,
            );
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }
}
