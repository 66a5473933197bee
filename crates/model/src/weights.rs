//! `WeightData` (a tensor's blocks, typed by GGML type) and `Precision` (how a
//! model computes with them).

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

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

impl WeightData {
    /// The whole blocks of `bytes` (little-endian, the file's layout) as `dtype`.
    pub fn from_bytes(dtype: GgmlDType, bytes: &[u8]) -> Option<Self> {
        let mut data = WeightData::zeroed(dtype, bytes.len())?;
        let n = data.as_bytes().len();
        data.as_bytes_mut().copy_from_slice(&bytes[..n]);
        Some(data)
    }

    /// `nbytes` of zeroed blocks of `dtype`, to read a tensor into in place (no
    /// second copy); `None` for a type sloserve does not hold.
    pub fn zeroed(dtype: GgmlDType, nbytes: usize) -> Option<Self> {
        fn z<T: GgmlType>(nbytes: usize) -> Vec<T> {
            vec![T::zeros(); nbytes / std::mem::size_of::<T>()]
        }
        Some(match dtype {
            GgmlDType::F32 => WeightData::F32(z(nbytes)),
            GgmlDType::F16 => WeightData::F16(z(nbytes)),
            GgmlDType::BF16 => WeightData::BF16(z(nbytes)),
            GgmlDType::Q4_0 => WeightData::Q4_0(z(nbytes)),
            GgmlDType::Q4_1 => WeightData::Q4_1(z(nbytes)),
            GgmlDType::Q5_0 => WeightData::Q5_0(z(nbytes)),
            GgmlDType::Q5_1 => WeightData::Q5_1(z(nbytes)),
            GgmlDType::Q8_0 => WeightData::Q8_0(z(nbytes)),
            GgmlDType::Q2K => WeightData::Q2K(z(nbytes)),
            GgmlDType::Q3K => WeightData::Q3K(z(nbytes)),
            GgmlDType::Q4K => WeightData::Q4K(z(nbytes)),
            GgmlDType::Q5K => WeightData::Q5K(z(nbytes)),
            GgmlDType::Q6K => WeightData::Q6K(z(nbytes)),
            _ => return None,
        })
    }

    /// The blocks' raw bytes, writable (to read the file into).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        fn bytes<T>(v: &mut [T]) -> &mut [u8] {
            // SAFETY: block types are plain `repr(C)` data valid for any bit
            // pattern; the view covers exactly the vector's elements.
            unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v))
            }
        }
        with_blocks!(self, v => bytes(v))
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
        let total = parts.iter().map(|p| p.as_bytes().len()).sum();
        let mut out = WeightData::zeroed(dtype, total)?;
        let mut at = 0;
        for p in parts {
            let b = p.as_bytes();
            out.as_bytes_mut()[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        Some(out)
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

    /// Dequantizes columns `k0..k0 + out.len()` of row `row` of a `[rows, k]` matrix
    /// into `out` (the row's blocks `k0 / bs ..`, bs the type's block size), with
    /// the type's own dequantization: the values `to_f32` gives there. `k0` and
    /// `out.len()` must be multiples of bs (a K block of the f32 GEMM is, as is what
    /// is left of a row: K-quant rows are whole 256-blocks).
    pub fn dequantize_cols(&self, row: usize, k: usize, k0: usize, out: &mut [f32]) {
        fn cols<T: GgmlType>(v: &[T], row: usize, k: usize, k0: usize, out: &mut [f32]) {
            let bs = T::BLCK_SIZE;
            assert!(k0.is_multiple_of(bs) && out.len().is_multiple_of(bs) && k0 + out.len() <= k);
            let first = row * (k / bs) + k0 / bs;
            T::to_float(&v[first..first + out.len() / bs], out);
        }
        with_blocks!(self, v => cols(v, row, k, k0, out))
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
    /// Quantized weights held once (8-bit panels or the file's blocks), every
    /// product on activations rounded to 8 bits a block (llama.cpp's arithmetic),
    /// decode rows and prompts alike: batch-invariant. `int8` is another name for it
    /// (until stop 18 it was a separate mode: fast precision then kept an f32 copy
    /// of the weights for prompts).
    #[default]
    Fast,
    /// Weights dequantized to f32 and every product in f32: matches the exact reference.
    Exact,
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fast" | "int8" => Ok(Precision::Fast),
            "exact" => Ok(Precision::Exact),
            _ => Err(format!(
                "unknown precision '{s}' (expected fast, int8 or exact)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;

    fn blocks<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&test_data(n * k, 5), &mut w);
        w
    }

    /// A row's column range dequantizes to the same values as the whole tensor does
    /// there: K blocks of 256 and a row's last, shorter one (896 = 3.5 blocks).
    #[test]
    fn column_ranges_dequantize_as_the_whole_tensor() {
        let n = 3;
        for k in [256, 896, 1536] {
            let mut types = vec![
                WeightData::Q4_0(blocks::<BlockQ4_0>(n, k)),
                WeightData::Q5_1(blocks::<BlockQ5_1>(n, k)),
                WeightData::Q8_0(blocks::<BlockQ8_0>(n, k)),
                WeightData::F16(blocks::<f16>(n, k)),
            ];
            if k.is_multiple_of(256) {
                types.push(WeightData::Q3K(blocks::<BlockQ3K>(n, k)));
                types.push(WeightData::Q6K(blocks::<BlockQ6K>(n, k)));
            }
            for w in types {
                let all = w.to_f32();
                for r in 0..n {
                    for k0 in (0..k).step_by(256) {
                        let kc = 256.min(k - k0);
                        let mut out = vec![f32::NAN; kc];
                        w.dequantize_cols(r, k, k0, &mut out);
                        assert_eq!(out, all[r * k + k0..][..kc], "{:?} {r} {k0}", w.dtype());
                    }
                }
            }
        }
    }
}
