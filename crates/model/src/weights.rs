//! `WeightData` (a tensor's blocks, typed by GGML type) and `Linear` (y = x·Wᵀ + b):
//! quantized dot products for the fast path, f32 for the exact path.

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

use crate::kernels::gemm_f32::gemm_f32;
use crate::kernels::packed_gemm::PackedMatrix;
use crate::kernels::q4_1_rows::Q4_1Rows;
use crate::kernels::q8_0_rows::Q8_0Rows;

/// One tensor's data, in the file's own block format.
#[derive(Clone)]
pub enum WeightData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q8_0(Vec<BlockQ8_0>),
    Q2K(Vec<BlockQ2K>),
    Q3K(Vec<BlockQ3K>),
    Q4K(Vec<BlockQ4K>),
    Q5K(Vec<BlockQ5K>),
    Q6K(Vec<BlockQ6K>),
}

/// Runs `$body` with `$v` bound to the typed block vector, whatever the variant.
macro_rules! with_blocks {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            WeightData::F32($v) => $body,
            WeightData::F16($v) => $body,
            WeightData::BF16($v) => $body,
            WeightData::Q4_0($v) => $body,
            WeightData::Q4_1($v) => $body,
            WeightData::Q5_0($v) => $body,
            WeightData::Q5_1($v) => $body,
            WeightData::Q8_0($v) => $body,
            WeightData::Q2K($v) => $body,
            WeightData::Q3K($v) => $body,
            WeightData::Q4K($v) => $body,
            WeightData::Q5K($v) => $body,
            WeightData::Q6K($v) => $body,
        }
    };
}

/// Copies raw little-endian block bytes into a properly aligned typed vector.
fn cast_blocks<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    let mut out: Vec<T> = vec![T::zeros(); n];
    // SAFETY: GGML block types are plain `repr(C)` structs of integers and halves,
    // valid for any bit pattern; `out` has room for exactly n * size bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, n * size);
    }
    out
}

impl WeightData {
    pub fn from_bytes(dtype: GgmlDType, bytes: &[u8]) -> Option<Self> {
        Some(match dtype {
            GgmlDType::F32 => WeightData::F32(cast_blocks(bytes)),
            GgmlDType::F16 => WeightData::F16(cast_blocks(bytes)),
            GgmlDType::BF16 => WeightData::BF16(cast_blocks(bytes)),
            GgmlDType::Q4_0 => WeightData::Q4_0(cast_blocks(bytes)),
            GgmlDType::Q4_1 => WeightData::Q4_1(cast_blocks(bytes)),
            GgmlDType::Q5_0 => WeightData::Q5_0(cast_blocks(bytes)),
            GgmlDType::Q5_1 => WeightData::Q5_1(cast_blocks(bytes)),
            GgmlDType::Q8_0 => WeightData::Q8_0(cast_blocks(bytes)),
            GgmlDType::Q2K => WeightData::Q2K(cast_blocks(bytes)),
            GgmlDType::Q3K => WeightData::Q3K(cast_blocks(bytes)),
            GgmlDType::Q4K => WeightData::Q4K(cast_blocks(bytes)),
            GgmlDType::Q5K => WeightData::Q5K(cast_blocks(bytes)),
            GgmlDType::Q6K => WeightData::Q6K(cast_blocks(bytes)),
            _ => return None,
        })
    }

    /// The blocks' raw bytes (the file's layout).
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: block types are plain `repr(C)` data; the view covers exactly
            // the vector's initialised elements.
            unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        }
        with_blocks!(self, v => bytes(v))
    }

    /// The rows of several `[n_i, k]` tensors of one type stacked into one
    /// `[sum n_i, k]` tensor (e.g. q, k and v projections, multiplied in one pass);
    /// `None` if their types differ.
    pub fn concat_rows(parts: &[&WeightData]) -> Option<WeightData> {
        let dtype = parts.first()?.dtype();
        if parts.iter().any(|p| p.dtype() != dtype) {
            return None;
        }
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.as_bytes()).copied().collect();
        WeightData::from_bytes(dtype, &bytes)
    }

    pub fn dtype(&self) -> GgmlDType {
        fn dt<T: GgmlType>(_: &[T]) -> GgmlDType {
            T::DTYPE
        }
        with_blocks!(self, v => dt(v))
    }

    /// Dequantizes rows `row..row + out.len() / k` of a `[rows, k]` matrix into `out`.
    pub fn dequantize_rows(&self, row: usize, k: usize, out: &mut [f32]) {
        fn rows<T: GgmlType>(v: &[T], row: usize, k: usize, out: &mut [f32]) {
            let kb = k / T::BLCK_SIZE;
            let n = out.len() / k;
            T::to_float(&v[row * kb..(row + n) * kb], out);
        }
        with_blocks!(self, v => rows(v, row, k, out))
    }

    /// The whole tensor as f32.
    pub fn to_f32(&self) -> Vec<f32> {
        fn all<T: GgmlType>(v: &[T]) -> Vec<f32> {
            let mut out = vec![0f32; v.len() * T::BLCK_SIZE];
            T::to_float(v, &mut out);
            out
        }
        with_blocks!(self, v => all(v))
    }

    /// `out[m, n] = x[m, k] · selfᵀ` where self is `[n, k]`. Quantized types quantize
    /// the activations to their dot-product type (8-bit), as llama.cpp does.
    pub fn matmul(&self, x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
        fn mm<T: GgmlType>(v: &[T], x: &[f32], mkn: (usize, usize, usize), out: &mut [f32]) {
            let (m, k, n) = mkn;
            crate::kernels::qmatmul::qmatmul::<T>(v, x, m, k, n, out);
        }
        with_blocks!(self, v => mm(v, x, (m, k, n), &mut out[..m * n]))
    }
}

/// How a model's weights are computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Quantized weights, 8-bit activations inside the dot products (llama.cpp's fast path).
    #[default]
    Fast,
    /// Weights dequantized to f32 and every product in f32: matches the exact reference.
    Exact,
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fast" => Ok(Precision::Fast),
            "exact" => Ok(Precision::Exact),
            _ => Err(format!("unknown precision '{s}' (expected fast or exact)")),
        }
    }
}

/// Without repacked decode kernels (`Rows`), batches with at least this many rows
/// run as an f32 GEMM on dequantized weights (compute-bound); smaller ones as
/// quantized dot products (memory-bound: one or two decoding sequences). Measured
/// with the forward bench: at 3 rows the f32 GEMM is already ahead (71 vs 68
/// tok/s), at 4 rows by 1.3x, at 8 by 1.7x.
pub const GEMM_MIN_ROWS: usize = 3;

/// The f32 copy of quantized weights that large batches multiply with.
enum Dense {
    /// Packed for our AVX2 kernel.
    Packed(PackedMatrix),
    /// Row-major, for the `gemm` crate (CPUs without AVX2).
    RowMajor(Vec<f32>),
}

/// The earlier of two path switches (`Linear::small_batch_max_rows`).
pub fn first_switch(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Quantized weights repacked for the decode kernels.
enum Rows {
    Q4_1(Q4_1Rows),
    Q8_0(Q8_0Rows),
}

impl Rows {
    /// Batches up to this many rows run on the repacked kernel; larger ones on
    /// the f32 GEMM. The repacked kernels read the quantized bytes once for all
    /// rows (memory-bound at a few rows) where the GEMM reads 4-byte weights, so
    /// they win well past `GEMM_MIN_ROWS`. Measured on the default model's shapes
    /// (forward bench `--only decode_bN`, 2 threads, AVX2, stop 11), tok/s rows
    /// kernel vs GEMM: Q4_1 b4 295 vs 146, b16 316 vs 290, b20 314 vs 320, b24 262
    /// vs 335; Q8_0 b8 265 vs 200, b12 277 vs 256, b16 284 vs 300.
    fn max_rows(&self) -> usize {
        match self {
            Rows::Q4_1(_) => 16,
            Rows::Q8_0(_) => 12,
        }
    }

    fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        match self {
            Rows::Q4_1(r) => r.matmul(x, m, out),
            Rows::Q8_0(r) => r.matmul(x, m, out),
        }
    }
}

/// A linear layer `y = x·Wᵀ (+ b)` with W of shape `[n_out, k]`.
pub struct Linear {
    /// Quantized (fast) or f32 (exact) weights.
    pub weight: WeightData,
    /// f32 copy of quantized weights for large batches (fast mode only).
    dense: Option<Dense>,
    /// Q4_1 or Q8_0 weights repacked for small batches (fast mode, AVX2).
    rows: Option<Rows>,
    pub n_out: usize,
    pub k: usize,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn new(
        weight: WeightData,
        n_out: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        precision: Precision,
    ) -> Self {
        let rows = match (&weight, precision) {
            (_, Precision::Fast) if !crate::kernels::cpu::has_avx2() => None,
            (WeightData::Q4_1(w), Precision::Fast) => Some(Rows::Q4_1(Q4_1Rows::pack(w, n_out, k))),
            (WeightData::Q8_0(w), Precision::Fast) => Some(Rows::Q8_0(Q8_0Rows::pack(w, n_out, k))),
            _ => None,
        };
        let (weight, dense) = match (precision, weight) {
            (_, WeightData::F32(w)) => (WeightData::F32(w), None),
            (Precision::Exact, w) => (WeightData::F32(w.to_f32()), None),
            // f16/bf16 dot products would round activations to 16 bits; f32 is as fast here.
            (Precision::Fast, w @ (WeightData::F16(_) | WeightData::BF16(_))) => {
                (WeightData::F32(w.to_f32()), None)
            }
            (Precision::Fast, w) => {
                let f = w.to_f32();
                let dense = if crate::kernels::cpu::has_avx2() {
                    Dense::Packed(PackedMatrix::pack(&f, n_out, k))
                } else {
                    Dense::RowMajor(f)
                };
                (w, Some(dense))
            }
        };
        Linear {
            weight,
            dense,
            rows,
            n_out,
            k,
            bias,
        }
    }

    /// The smallest batch (rows of `x`) that `forward` multiplies with the dense
    /// f32 copy instead of the quantized weights; `None` without one (f32 weights).
    fn dense_from(&self) -> Option<usize> {
        self.dense.as_ref()?;
        let rows_end = self.rows.as_ref().map_or(0, |r| r.max_rows() + 1);
        Some(rows_end.max(GEMM_MIN_ROWS))
    }

    /// The largest batch multiplied on the quantized path before `forward`
    /// switches to the f32 GEMM (a step's cost jumps there); `None` when it never
    /// switches (f32 weights).
    pub fn small_batch_max_rows(&self) -> Option<usize> {
        self.dense_from().map(|d| d - 1)
    }

    /// `x` is `[m, k]`, `out` is `[m, n_out]`.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (k, n) = (self.k, self.n_out);
        let dense = self.dense_from().is_some_and(|d| m >= d);
        match (&self.weight, &self.dense, &self.rows) {
            (WeightData::F32(w), _, _) => gemm_f32(x, w, m, k, n, out),
            (_, Some(Dense::Packed(w)), _) if dense => w.matmul(x, m, out),
            (_, Some(Dense::RowMajor(w)), _) if dense => gemm_f32(x, w, m, k, n, out),
            (_, _, Some(r)) => r.matmul(x, m, out),
            (q, _, _) => q.matmul(x, m, k, n, out),
        }
        if let Some(b) = &self.bias {
            for row in out[..m * n].chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{has_avx2, test_data};
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_1, GgmlType};

    fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&test_data(n * k, 5), &mut w);
        w
    }

    /// Each batch size gives the same product on whichever path it takes, and the
    /// reported switch is where the path changes.
    #[test]
    fn every_batch_size_agrees_across_the_path_switch() {
        let (n, k) = (24, 256);
        let q41 = Linear::new(
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            n,
            k,
            None,
            Precision::Fast,
        );
        let q4k = Linear::new(
            WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
            n,
            k,
            None,
            Precision::Fast,
        );
        let exact = Linear::new(
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            n,
            k,
            None,
            Precision::Exact,
        );
        assert_eq!(
            exact.small_batch_max_rows(),
            None,
            "f32 weights never switch"
        );
        assert_eq!(q4k.small_batch_max_rows(), Some(GEMM_MIN_ROWS - 1));
        let switch = q41.small_batch_max_rows().unwrap();
        assert_eq!(switch, if has_avx2() { 16 } else { GEMM_MIN_ROWS - 1 });
        assert_eq!(first_switch(Some(16), Some(2)), Some(2));
        assert_eq!(first_switch(None, Some(16)), Some(16));
        let x = test_data(20 * k, 9);
        for m in [1, switch, switch + 1, 20] {
            let (mut fast, mut reference) = (vec![0f32; m * n], vec![0f32; m * n]);
            q41.forward(&x[..m * k], m, &mut fast);
            exact.forward(&x[..m * k], m, &mut reference);
            for (a, b) in fast.iter().zip(&reference) {
                // 8-bit activations on the quantized path: each of the 256 products
                // off by at most |w| * amax / 254 (typically ~0.03 in all).
                assert!((a - b).abs() <= 0.1, "m={m}: {a} vs {b}");
            }
        }
    }
}
