//! `exp` of eight f32 lanes with AVX2 (Cephes' `expf`: a degree-6 polynomial on the
//! remainder after taking out whole powers of two), for the softmax of the f16
//! attention kernel and SiLU: within 2 ulp of the true value from -87.3 to 88.3, 0 below,
//! +inf above.

/// The largest input whose exp is a normal f32; below it the result is 0.
const LOW: f32 = -87.336_54;
/// Above this the result is +inf (2^n would leave the exponent's range).
const HIGH: f32 = 88.376_26;

/// `e^x` in every lane.
///
/// # Safety
/// The CPU must have AVX2 and FMA (`has_avx2()`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp256(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let below = _mm256_cmp_ps(x, _mm256_set1_ps(LOW), _CMP_LT_OQ);
    let above = _mm256_cmp_ps(x, _mm256_set1_ps(HIGH), _CMP_GT_OQ);
    // Clamped so that 2^n stays a normal number; the masks fix the ends below.
    let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LOW)), _mm256_set1_ps(HIGH));
    // x = n·ln2 + r with |r| <= ln2 / 2; ln2 in two parts keeps r exact.
    let n = _mm256_round_ps(
        _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // 2^n by building its exponent bits.
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    ));
    let y = _mm256_andnot_ps(below, _mm256_mul_ps(y, pow2));
    _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), above)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::cpu::has_avx2;

    fn exp8(x: [f32; 8]) -> [f32; 8] {
        use std::arch::x86_64::*;
        let mut out = [0f32; 8];
        // SAFETY: the caller checked has_avx2(); both arrays hold eight lanes.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp256(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    #[test]
    fn within_two_ulp_of_exp_and_exact_at_the_ends() {
        if !has_avx2() {
            return;
        }
        let mut worst = 0f64;
        // Every 1/4096 from -87 to 88, and some odd points.
        let xs: Vec<f32> = (-87 * 4096..88 * 4096)
            .map(|i| i as f32 / 4096.0)
            .chain([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 88.3, -87.3])
            .collect();
        for chunk in xs.chunks(8) {
            let mut x = [0f32; 8];
            x[..chunk.len()].copy_from_slice(chunk);
            for (xi, yi) in x.iter().zip(exp8(x)) {
                let want = (*xi as f64).exp();
                let ulp = (want as f32).to_bits().abs_diff(yi.to_bits());
                assert!(ulp <= 2, "exp({xi}) = {yi}, want {want} ({ulp} ulp)");
                worst = worst.max((yi as f64 - want).abs() / want);
            }
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        let ends = exp8([
            f32::NEG_INFINITY,
            -1000.0,
            -88.0,
            f32::INFINITY,
            1000.0,
            89.0,
            0.0,
            1.0,
        ]);
        assert_eq!(
            &ends[..6],
            &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY, f32::INFINITY]
        );
        assert_eq!(ends[6], 1.0);
        assert!((ends[7] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
    }
}
