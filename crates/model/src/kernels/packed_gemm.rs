//! `PackedMatrix`: an f32 weight matrix `[n, k]` packed once, at load, into column
//! panels of 16 outputs (`[n/16][k][16]`, 64-byte rows), and the blocked GEMM that
//! multiplies activations by it: 6x16 register tiles of AVX2 FMAs over K blocks that
//! stay in L1. Packing at load is what a general GEMM redoes on every call.
//!
//! The same blocked loop and kernel also multiply by a matrix held in another form
//! (`matmul_rows`, e.g. a quantized matrix in exact precision): for each K block and
//! each panel, the 16 x KC slice is written once per task into a small buffer laid
//! out as the packed panels (dequantized on the fly), and the row tiles run on it.
//!
//! Every output element is accumulated in the same order (k ascending, one FMA chain
//! per `KC` block, blocks summed in order) whatever the batch's size or the row's
//! place in it, so results are batch-invariant; and whatever the form the weights
//! come from, so equal f32 weights give bit-identical products.

use crate::kernels::cpu::{has_avx2, OutPtr};
use crate::kernels::pool::parallel_tiles;

/// Outputs per panel (two AVX registers).
const NR: usize = 16;
/// Rows per register tile.
const MR: usize = 6;
/// K per block: a 16 x KC panel slice (16 KiB) stays in L1 across the row tiles.
/// A multiple of every GGML block size (`RowBlocks` relies on it).
pub const KC: usize = 256;
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
        blocked(self, x, m, out);
    }
}

/// Where the blocked loop reads panel `p`'s rows `k0..k0 + kc` from: the packed
/// matrix itself, or a buffer (one per task) they are written into.
trait Panels: Sync {
    type Buf: Default;
    fn n(&self) -> usize;
    fn k(&self) -> usize;
    fn panel<'a>(
        &'a self,
        p: usize,
        k0: usize,
        kc: usize,
        buf: &'a mut Self::Buf,
    ) -> &'a [PanelRow];
}

impl Panels for PackedMatrix {
    type Buf = ();
    fn n(&self) -> usize {
        self.n
    }
    fn k(&self) -> usize {
        self.k
    }
    fn panel<'a>(&'a self, p: usize, k0: usize, kc: usize, _: &'a mut ()) -> &'a [PanelRow] {
        &self.rows[p * self.k + k0..][..kc]
    }
}

/// A `[n, k]` matrix read a row's K block at a time (a quantized matrix's blocks,
/// dequantized on the fly).
pub trait RowBlocks: Sync {
    /// Writes `W[r, k0..k0 + out.len()]` as f32 into `out`; `k0` is a multiple of
    /// `KC` and `out.len()` is `KC` or what is left of the row.
    fn row_block(&self, r: usize, k0: usize, out: &mut [f32]);
}

/// A `RowBlocks` matrix as panels: each slice written into the task's buffer.
struct OnTheFly<'w, W> {
    w: &'w W,
    n: usize,
    k: usize,
}

/// One task's panel slice, and the 16 row blocks it is transposed from.
struct SliceBuf {
    rows: [PanelRow; KC],
    blocks: [[f32; KC]; NR],
}

impl Default for SliceBuf {
    fn default() -> Self {
        SliceBuf {
            rows: [PanelRow([0.0; NR]); KC],
            blocks: [[0.0; KC]; NR],
        }
    }
}

impl<W: RowBlocks> Panels for OnTheFly<'_, W> {
    type Buf = SliceBuf;
    fn n(&self) -> usize {
        self.n
    }
    fn k(&self) -> usize {
        self.k
    }
    fn panel<'a>(
        &'a self,
        p: usize,
        k0: usize,
        kc: usize,
        buf: &'a mut SliceBuf,
    ) -> &'a [PanelRow] {
        let cols = NR.min(self.n - p * NR);
        for (j, block) in buf.blocks.iter_mut().enumerate() {
            match j < cols {
                true => self.w.row_block(p * NR + j, k0, &mut block[..kc]),
                // Columns past n: zero, as in a packed matrix.
                false => block[..kc].fill(0.0),
            }
        }
        let rows = &mut buf.rows[..kc];
        let whole = kc / 8 * 8;
        // SAFETY: the CPU has AVX (callers check has_avx2); whole <= kc <= KC.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            transpose8(&buf.blocks, rows, whole)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let whole = 0;
        for (i, row) in rows.iter_mut().enumerate().skip(whole) {
            for (j, v) in row.0.iter_mut().enumerate() {
                *v = buf.blocks[j][i];
            }
        }
        rows
    }
}

/// `rows[i].0[j] = blocks[j][i]` for `i < whole` (a multiple of 8), in 8 x 8 tiles
/// of register transposes.
///
/// # Safety
/// The CPU must have AVX; `whole` must be a multiple of 8, at most `rows.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose8(blocks: &[[f32; KC]; NR], rows: &mut [PanelRow], whole: usize) {
    use std::arch::x86_64::*;
    assert!(whole.is_multiple_of(8) && whole <= rows.len());
    for half in 0..2 {
        let src = &blocks[half * 8..half * 8 + 8];
        for i in (0..whole).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (v, block) in r.iter_mut().zip(src) {
                *v = _mm256_loadu_ps(block.as_ptr().add(i));
            }
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (c, v) in cols.into_iter().enumerate() {
                _mm256_store_ps(rows[i + c].0.as_mut_ptr().add(half * 8), v);
            }
        }
    }
}

/// `out[m, n] = x[m, k] · Wᵀ` for a `[n, k]` matrix held as `w`, with the same
/// arithmetic as `PackedMatrix::pack(W).matmul` (bit for bit), each panel slice
/// written once per task. Callers check `cpu::has_avx2()` first.
pub fn matmul_rows<W: RowBlocks>(w: &W, n: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    blocked(&OnTheFly { w, n, k }, x, m, out);
}

/// The blocked GEMM: tasks of up to `MC` rows and a run of panels; in each, K block
/// by K block, each panel's slice is fetched once and multiplied by every row tile.
fn blocked<S: Panels>(s: &S, x: &[f32], m: usize, out: &mut [f32]) {
    let (n, k) = (s.n(), s.k());
    assert!(has_avx2() && x.len() >= m * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    parallel_tiles(m, MC, n.div_ceil(NR), &|rows, panels| {
        let mut buf = S::Buf::default();
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for p in panels.clone() {
                let cols = NR.min(n - p * NR);
                let b = s.panel(p, k0, kc, &mut buf);
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
    use crate::kernels::isa_ledger::{route, TestIsa};

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
        if !route("packed_gemm", TestIsa::Avx2) {
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
        if !route("packed_gemm_batch_invariance", TestIsa::Avx2) {
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
