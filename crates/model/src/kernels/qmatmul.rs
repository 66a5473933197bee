//! Quantized matrix multiplication for small batches (decode): activations quantized
//! to 8 bits once per row, weight rows split over the spinning pool, each weight row
//! multiplied into two activation rows at a time by `quant_dot::dot_rows`.

use std::cell::RefCell;

use crate::kernels::cpu::OutPtr;
use crate::kernels::pool::{parallel_for, threads};
use crate::kernels::quant_dot::dot_rows;
use candle_core::quantized::k_quants::GgmlType;

thread_local! {
    /// Quantized activations, reused across calls (u64 for alignment).
    static XQ: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

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
        let tasks = threads() * 8;
        let tile = n.div_ceil(tasks).max(4);
        let ptr = OutPtr(out.as_mut_ptr());
        parallel_for(n.div_ceil(tile), &|t| {
            for c in t * tile..((t + 1) * tile).min(n) {
                let wr = &w[c * kb..(c + 1) * kb];
                for r in (0..m).step_by(2) {
                    let row = |r: usize| &xq[r * kb..(r + 1) * kb];
                    let second = (r + 1 < m).then(|| row(r + 1));
                    let (a, b) = dot_rows::<T>(k, wr, row(r), second);
                    // SAFETY: (r, c) and (r + 1, c) when r + 1 < m lie inside out, and
                    // only this task writes column c.
                    unsafe {
                        *ptr.get().add(r * n + c) = a;
                        if second.is_some() {
                            *ptr.get().add((r + 1) * n + c) = b;
                        }
                    }
                }
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0};

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
            check::<BlockQ5_0>(m, k, n);
        }
        // K-quants: rows of 256-value blocks; odd row counts end in a single row.
        for (m, k, n) in [(1, 256, 5), (2, 512, 9), (3, 1024, 17)] {
            check::<BlockQ4K>(m, k, n);
            check::<BlockQ6K>(m, k, n);
        }
    }
}
