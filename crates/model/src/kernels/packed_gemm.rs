//! `PackedMatrix`: an f32 weight matrix `[n, k]` packed once, at load, into column
//! panels of 16 outputs (`[n/16][k][16]`, 64-byte rows), and the blocked GEMM that
//! multiplies activations by it: 6x16 register tiles of AVX2 FMAs over K blocks that
//! stay in L1. Packing at load is what a general GEMM redoes on every call.
//!
//! Every output element is accumulated in the same order (k ascending, one FMA chain
//! per `KC` block, blocks summed in order) whatever the batch's size or the row's
//! place in it, so results are batch-invariant.

use crate::kernels::cpu::{has_avx2, OutPtr};
use crate::kernels::pool::parallel_tiles;

/// Outputs per panel (two AVX registers).
const NR: usize = 16;
/// Rows per register tile.
const MR: usize = 6;
/// K per block: a 16 x KC panel slice (16 KiB) stays in L1 across the row tiles.
const KC: usize = 256;
/// Rows per task: an MC x KC slice of the activations (96 KiB) stays in L2.
const MC: usize = 96;

/// One 64-byte-aligned row of a panel.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelRow([f32; NR]);

pub struct PackedMatrix {
    n: usize,
    k: usize,
    /// `n.div_ceil(16)` panels of `k` rows; columns past `n` are zero.
    rows: Vec<PanelRow>,
}

impl PackedMatrix {
    /// Packs a row-major `[n, k]` matrix.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert!(w.len() >= n * k);
        let panels = n.div_ceil(NR);
        let mut rows = vec![PanelRow([0.0; NR]); panels * k];
        for (p, panel) in rows.chunks_exact_mut(k.max(1)).enumerate().take(panels) {
            for j in 0..NR.min(n - p * NR) {
                let src = &w[(p * NR + j) * k..][..k];
                for (row, &v) in panel.iter_mut().zip(src) {
                    row.0[j] = v;
                }
            }
        }
        PackedMatrix { n, k, rows }
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of_val(self.rows.as_slice())
    }

    /// Row `r` of W (`k` values).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let (p, j) = (r / NR, r % NR);
        for (o, row) in out[..self.k].iter_mut().zip(&self.rows[p * self.k..]) {
            *o = row.0[j];
        }
    }

    /// `out[m, n] = x[m, k] · Wᵀ`. Callers check `cpu::has_avx2()` first.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(has_avx2() && x.len() >= m * k && out.len() >= m * n);
        if m == 0 || n == 0 {
            return;
        }
        let out_ptr = OutPtr(out.as_mut_ptr());
        parallel_tiles(m, MC, n.div_ceil(NR), &|rows, panels| {
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                for p in panels.clone() {
                    let cols = NR.min(n - p * NR);
                    let b = &self.rows[p * k + k0..][..kc];
                    let mut r = rows.start;
                    while r < rows.end {
                        let mr = tile_rows(rows.end - r);
                        let a = &x[r * k + k0..];
                        // SAFETY: the tile (r..r+mr, p*16..p*16+cols) lies inside out
                        // and only this task writes it; a holds mr rows of stride k
                        // from k0 with kc values each; the CPU has AVX2 and FMA.
                        unsafe {
                            let c = out_ptr.get().add(r * n + p * NR);
                            tile(mr, a, k, b, c, n, cols, k0 > 0);
                        }
                        r += mr;
                    }
                }
            }
        });
    }
}

/// Rows of the next tile when `left` rows remain: six, except that 7-9 rows split
/// into two tiles of 3-5 rather than leave a tile of 1-3 (too few accumulators to
/// hide the FMA latency).
fn tile_rows(left: usize) -> usize {
    match left {
        7..=9 => left.div_ceil(2),
        _ => left.min(MR),
    }
}

/// Dispatches an `mr`-row tile to its monomorphised kernel.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    mr: usize,
    a: &[f32],
    lda: usize,
    b: &[PanelRow],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    match mr {
        6 => kernel::<6>(a, lda, b, c, ldc, cols, accumulate),
        5 => kernel::<5>(a, lda, b, c, ldc, cols, accumulate),
        4 => kernel::<4>(a, lda, b, c, ldc, cols, accumulate),
        3 => kernel::<3>(a, lda, b, c, ldc, cols, accumulate),
        2 => kernel::<2>(a, lda, b, c, ldc, cols, accumulate),
        _ => kernel::<1>(a, lda, b, c, ldc, cols, accumulate),
    }
}

/// `c[R, cols] (+)= a[R, kc] · b[kc, 16]` with 2R accumulators held in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize>(
    a: &[f32],
    lda: usize,
    b: &[PanelRow],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let kc = b.len();
    debug_assert!(a.len() >= (R - 1) * lda + kc);
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let ap = a.as_ptr();
    for (p, row) in b.iter().enumerate() {
        let b0 = _mm256_load_ps(row.0.as_ptr());
        let b1 = _mm256_load_ps(row.0.as_ptr().add(8));
        for r in 0..R {
            let av = _mm256_broadcast_ss(&*ap.add(r * lda + p));
            lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
        }
    }
    for r in 0..R {
        let dst = c.add(r * ldc);
        if cols == NR {
            if accumulate {
                lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(dst));
                hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(dst.add(8)));
            }
            _mm256_storeu_ps(dst, lo[r]);
            _mm256_storeu_ps(dst.add(8), hi[r]);
        } else {
            let mut tmp = [0f32; NR];
            _mm256_storeu_ps(tmp.as_mut_ptr(), lo[r]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), hi[r]);
            for (j, v) in tmp.iter().enumerate().take(cols) {
                let d = dst.add(j);
                *d = if accumulate { *d + v } else { *v };
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel<const R: usize>(
    _: &[f32],
    _: usize,
    _: &[PanelRow],
    _: *mut f32,
    _: usize,
    _: usize,
    _: bool,
) {
    unreachable!("guarded by has_avx2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data as data;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[c * k + i] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matches_naive_on_ragged_shapes() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        // Rows past a tile, a chunk, columns past a panel, K past a block.
        for (m, k, n) in [
            (1, 7, 3),
            (5, 64, 17),
            (13, 300, 40),
            (97, 576, 33),
            (200, 513, 64),
        ] {
            let (x, w) = (data(m * k, 3), data(n * k, 7));
            let mut out = vec![f32::NAN; m * n];
            PackedMatrix::pack(&w, n, k).matmul(&x, m, &mut out);
            for (a, b) in out.iter().zip(naive(&x, &w, m, k, n)) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m}x{k}x{n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        let (k, n) = (600, 48);
        let w = PackedMatrix::pack(&data(n * k, 9), n, k);
        let x = data(40 * k, 5);
        let mut all = vec![0f32; 40 * n];
        w.matmul(&x, 40, &mut all);
        for r in [0, 6, 17, 39] {
            let mut one = vec![0f32; n];
            w.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }
}
