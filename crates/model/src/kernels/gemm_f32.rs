//! `gemm_f32`: the f32 matrix product `x · wᵀ` through the `gemm` crate (blocked,
//! multi-threaded over the rayon pool, SIMD chosen by the crate at run time).

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with the `gemm` crate (blocked, multi-threaded).
pub fn gemm_f32(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    // SAFETY: the asserts above bound every access gemm makes through these strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;

    #[test]
    fn matches_naive_product() {
        let (m, k, n) = (5, 70, 9);
        let (x, w) = (data(m * k, 1), data(n * k, 2));
        let mut out = vec![f32::NAN; m * n];
        gemm_f32(&x, &w, m, k, n, &mut out);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
                let got = out[i * n + j];
                assert!((got - want).abs() < 1e-4, "({i}, {j}): {got} vs {want}");
            }
        }
    }
}
