//! The quantized KV cache's blocks, llama.cpp's layouts (`block_q8_0`, `block_q4_0`):
//! 32 consecutive values of one head's key or value row and one f16 scale, and the
//! row quantizers the cache write uses (ggml's reference rounding).

use half::f16;

/// Values per block (a head dimension is a whole number of blocks).
pub const QK: usize = 32;

/// 32 values as `d · qs[i]`: 34 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// 32 values as `d · (nibble - 8)`: value `i < 16` is the low nibble of `qs[i]`,
/// value `16 + i` its high nibble: 18 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 2);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 2);

/// A block type of the cache: its quantizer and its values (the scalar reference
/// the kernels are tested against).
pub trait KvBlock: Copy + Send + Sync + 'static {
    /// Quantizes 32 values into `self`.
    fn quantize(&mut self, x: &[f32]);
    /// Value `i` (0..32), exact in f32: a small integer times an f16 scale.
    fn value(&self, i: usize) -> f32;
    /// u16 words a block takes (blocks are allocated as zeroed words).
    const WORDS: usize = std::mem::size_of::<Self>() / 2;
}

impl KvBlock for BlockQ8_0 {
    /// ggml's `quantize_row_q8_0_ref`: `d = max|x| / 127`, values rounded half away
    /// from zero.
    fn quantize(&mut self, x: &[f32]) {
        let amax = x[..QK].iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        self.d = f16::from_f32(d);
        for (q, v) in self.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }

    #[inline(always)]
    fn value(&self, i: usize) -> f32 {
        self.d.to_f32() * self.qs[i] as f32
    }
}

impl KvBlock for BlockQ4_0 {
    /// ggml's `quantize_row_q4_0_ref`: `d = max / -8` for the value of largest
    /// magnitude, values `min(15, trunc(x / d + 8.5))`.
    fn quantize(&mut self, x: &[f32]) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in &x[..QK] {
            if amax < v.abs() {
                (amax, max) = (v.abs(), v);
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        self.d = f16::from_f32(d);
        for (j, q) in self.qs.iter_mut().enumerate() {
            let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((x[QK / 2 + j] * id + 8.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
    }

    #[inline(always)]
    fn value(&self, i: usize) -> f32 {
        let q = self.qs[i % (QK / 2)];
        let n = if i < QK / 2 { q & 15 } else { q >> 4 };
        self.d.to_f32() * (n as i32 - 8) as f32
    }
}

/// `n` zeroed blocks (all zero bits is a valid block of zeros), from the
/// allocator's zeroed pages: the pool is resident only as it fills.
pub fn zeroed<B: KvBlock>(n: usize) -> Vec<B> {
    let mut words = std::mem::ManuallyDrop::new(vec![0u16; n * B::WORDS]);
    let (ptr, len, cap) = (words.as_mut_ptr(), words.len(), words.capacity());
    debug_assert!(len == n * B::WORDS && cap == len);
    // SAFETY: a block is `repr(C)` of an f16 and bytes, align 2 (checked above) like
    // u16, exactly `WORDS` u16s long with no padding, and every bit pattern is a
    // valid block; `vec![0u16; n]` has capacity `n` exactly, so the allocation's
    // size and alignment are those of `n` blocks, as `Vec<B>` will free it.
    unsafe { Vec::from_raw_parts(ptr as *mut B, n, n) }
}

/// Quantizes `src` (a whole number of blocks) into `dst`.
#[inline]
pub fn quantize_row<B: KvBlock>(dst: &mut [B], src: &[f32]) {
    for (b, x) in dst.iter_mut().zip(src.chunks_exact(QK)) {
        b.quantize(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;
    use candle_core::quantized::k_quants::{self, GgmlType};

    /// The blocks equal candle's (ggml's reference port) and round trip within half
    /// a step.
    #[test]
    fn blocks_equal_ggml_reference_and_round_trip() {
        let x: Vec<f32> = test_data(4 * QK, 7).iter().map(|v| v * 3.0).collect();
        let mut q8 = zeroed::<BlockQ8_0>(4);
        quantize_row(&mut q8, &x);
        let mut c8 = vec![k_quants::BlockQ8_0::zeros(); 4];
        k_quants::BlockQ8_0::from_float(&x, &mut c8);
        let mut q4 = zeroed::<BlockQ4_0>(4);
        quantize_row(&mut q4, &x);
        let mut c4 = vec![k_quants::BlockQ4_0::zeros(); 4];
        k_quants::BlockQ4_0::from_float(&x, &mut c4);
        let mut back8 = vec![0f32; 4 * QK];
        k_quants::BlockQ8_0::to_float(&c8, &mut back8);
        let mut back4 = vec![0f32; 4 * QK];
        k_quants::BlockQ4_0::to_float(&c4, &mut back4);
        for (i, v) in x.iter().enumerate() {
            let (b, j) = (i / QK, i % QK);
            assert_eq!(q8[b].value(j), back8[i], "q8_0 value {i}");
            assert_eq!(q4[b].value(j), back4[i], "q4_0 value {i}");
            // Half a step, and the scale's f16 rounding over 127 steps.
            assert!((q8[b].value(j) - v).abs() <= q8[b].d.to_f32() * 0.6 + 1e-6);
            assert!((q4[b].value(j) - v).abs() <= q4[b].d.to_f32().abs() * 1.0 + 1e-6);
        }
        let zero = zeroed::<BlockQ4_0>(3);
        assert!(zero.iter().all(|b| b.d == f16::ZERO && b.qs == [0; 16]));
    }
}
