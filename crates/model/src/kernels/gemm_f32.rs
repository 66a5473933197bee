//! `gemm_f32`: the f32 matrix product `x · wᵀ` through the `gemm` crate (blocked, SIMD
//! chosen by the crate at run time), its output columns split over the compute pool.

use crate::kernels::cpu::OutPtr;
use crate::kernels::pool::{parallel_for, threads};

/// Output columns per task at least (a panel multiple, so tasks do not share lines).
const MIN_COLS: usize = 64;

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with the `gemm` crate, columns split over the pool.
pub fn gemm_f32(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    let cols = n.div_ceil(threads() * 2).next_multiple_of(MIN_COLS).max(1);
    let out_ptr = OutPtr(out.as_mut_ptr());
    parallel_for(n.div_ceil(cols), &|t| {
        let (c0, c1) = (t * cols, ((t + 1) * cols).min(n));
        // SAFETY: the asserts above bound every access gemm makes through these
        // strides; columns c0..c1 of out are written by this task alone.
        unsafe {
            gemm::gemm(
                m,
                c1 - c0,
                k,
                out_ptr.get().add(c0),
                1,
                n as isize,
                false,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr().add(c0 * k),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;

    #[test]
    fn matches_naive_product() {
        // One task, and several (columns past a task's 64).
        for (m, k, n) in [(5, 70, 9), (7, 33, 300)] {
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
}
