//! MXFP4 (GGML type 39, gpt-oss's expert weights): blocks of 32 values, one E8M0
//! shared exponent byte and 16 bytes of 4-bit E2M1 codes (value `j` in the low nibble
//! of byte `j`, value `j + 16` in its high nibble), as ggml's `block_mxfp4`. A value is
//! `kvalues[code] · 2^(e - 128)` (`kvalues` are the E2M1 values doubled, integers).
//!
//! sloserve holds MXFP4 tensors as Q8_0 blocks, converted as the file is read: the same
//! 32 values with `qs = kvalues[code] · 2^s` and `d = 2^(e - 128 - s)` in f16, which is
//! exact whenever some shift `s >= 0` puts `d` in f16's range (2^-24 ..= 2^15) with the
//! codes still in an i8: every block whose scale `2^(e - 128)` lies in 2^-24 ..= 2^18
//! (more with small codes), far wider than real weights use (near 2^-8). A product then
//! runs on the Q8_0 paths with activations rounded to Q8_0 blocks, the arithmetic of
//! llama.cpp's `ggml_vec_dot_mxfp4_q8_0` (an integer sum per block times both scales).
//! Outside that range a block is rounded (to multiples of 2^-24, or saturated at
//! 127 · 2^15) and counted. The Q8_0 form is 34 bytes a block instead of 17: twice the
//! file's size for these tensors.

use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;
/// Bytes per block in the file: the exponent, then 16 bytes of codes.
pub const BLOCK_BYTES: usize = 17;
/// Bytes per Q8_0 block (f16 scale, then 32 i8 values).
pub const Q8_0_BYTES: usize = 34;

/// The E2M1 values doubled (ggml's `kvalues_mxfp4`).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: half the E8M0 scale, as ggml's `ggml_e8m0_to_fp32_half`.
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (u32::from(e) - 1) << 23
    };
    f32::from_bits(bits)
}

/// The codes of one block, in value order.
fn codes(block: &[u8]) -> [i8; BLOCK] {
    let mut q = [0i8; BLOCK];
    for j in 0..BLOCK / 2 {
        q[j] = KVALUES[usize::from(block[1 + j] & 0x0f)];
        q[j + BLOCK / 2] = KVALUES[usize::from(block[1 + j] >> 4)];
    }
    q
}

/// Dequantizes whole blocks into `out` (`blocks.len() / 17 * 32` values), as ggml's
/// `dequantize_row_mxfp4`: the scalar reference.
pub fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = e8m0_half(b[0]);
        for (o, q) in o.iter_mut().zip(codes(b)) {
            *o = f32::from(q) * d;
        }
    }
}

/// `2^p` as f16, for `p` in -24 ..= 15 (exact there).
fn pow2_f16(p: i32) -> f16 {
    debug_assert!((-24..=15).contains(&p));
    f16::from_f32(f32::from_bits(((p + 127) as u32) << 23))
}

/// Converts whole MXFP4 blocks to Q8_0 blocks (the file's little-endian layout),
/// appended to `out`. Returns how many blocks could not be held exactly (see the
/// module doc; 0 for any real checkpoint).
pub fn to_q8_0(blocks: &[u8], out: &mut Vec<u8>) -> usize {
    let mut inexact = 0;
    out.reserve(blocks.len() / BLOCK_BYTES * Q8_0_BYTES);
    for b in blocks.chunks_exact(BLOCK_BYTES) {
        let q = codes(b);
        let amax = q.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        let e = i32::from(b[0]);
        // The largest shift that keeps the codes in an i8 (127 / 12 -> 3, 127 / 1 -> 6).
        let s_max = match amax {
            0 => 0,
            a => (127 / i32::from(a)).ilog2() as i32,
        };
        // d = 2^(e - 128 - s) must lie in 2^-24 ..= 2^15.
        let (s_lo, s_hi) = ((e - 143).max(0), s_max.min(e - 104));
        let (d_pow, values): (i32, [i8; BLOCK]) = if amax == 0 {
            (0, q)
        } else if s_lo <= s_hi {
            (e - 128 - s_lo, q.map(|v| v << s_lo))
        } else {
            inexact += 1;
            // Too small: multiples of 2^-24; too large: saturated at 2^15 steps.
            let p = if e - 104 < s_lo { -24 } else { 15 };
            let scale = (e - 128 - p) as f32;
            let round = |v: i8| (f32::from(v) * scale.exp2()).round().clamp(-127.0, 127.0) as i8;
            (p, q.map(round))
        };
        out.extend_from_slice(&pow2_f16(d_pow).to_le_bytes());
        out.extend(values.iter().map(|&v| v as u8));
    }
    inexact
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType};

    /// Seeded blocks with exponents `exps` cycled and every code.
    fn blocks(n: usize, exps: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(n * BLOCK_BYTES);
        let mut x = 0x9e37_79b9u32;
        for i in 0..n {
            v.push(exps[i % exps.len()]);
            for _ in 0..16 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                v.push(x as u8);
            }
        }
        v
    }

    fn q8_0(bytes: &[u8]) -> Vec<BlockQ8_0> {
        let mut w = vec![BlockQ8_0::zeros(); bytes.len() / Q8_0_BYTES];
        // SAFETY: BlockQ8_0 is `repr(C)` f16 + [i8; 32], 34 bytes, valid for any bits;
        // the view covers exactly the vector's elements.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(w.as_mut_ptr() as *mut u8, w.len() * Q8_0_BYTES)
        };
        dst.copy_from_slice(bytes);
        w
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=254u8 {
            // The reference in f64, where 2^-128 is normal: `f32::powi(-128)` is
            // 1 / 2^128 on some targets, which overflows to 0 before the division.
            assert_eq!(e8m0_half(e), 2f64.powi(i32::from(e) - 128) as f32, "{e}");
        }
    }

    /// The Q8_0 blocks hold exactly the MXFP4 values for every scale from 2^-24 to
    /// 2^18 (real weights sit near 2^-8), zero blocks included.
    #[test]
    fn q8_0_holds_the_values_exactly_in_range() {
        let exps: Vec<u8> = (104..=146).collect();
        let mut src = blocks(exps.len() * 4, &exps);
        // A block of zero codes with a tiny exponent.
        src.extend_from_slice(&[3; 1]);
        src.extend_from_slice(&[0; 16]);
        let n = src.len() / BLOCK_BYTES;
        let mut want = vec![0f32; n * BLOCK];
        dequantize(&src, &mut want);
        let mut bytes = Vec::new();
        assert_eq!(to_q8_0(&src, &mut bytes), 0);
        assert_eq!(bytes.len(), n * Q8_0_BYTES);
        let mut got = vec![f32::NAN; n * BLOCK];
        BlockQ8_0::to_float(&q8_0(&bytes), &mut got);
        assert_eq!(got, want);
    }

    /// Blocks with small codes stay exact beyond 2^15 by moving the scale into them;
    /// what cannot be held is counted, rounded to the nearest step and saturated.
    #[test]
    fn out_of_range_blocks_are_counted_and_rounded() {
        // Codes ±1 only (nibbles 1 and 9), exponent 149: values ±2^21.
        let mut small = vec![149u8];
        small.extend_from_slice(&[0x91; 16]);
        let mut bytes = Vec::new();
        assert_eq!(to_q8_0(&small, &mut bytes), 0);
        let mut got = vec![0f32; BLOCK];
        BlockQ8_0::to_float(&q8_0(&bytes), &mut got);
        assert_eq!(got[0], 2_097_152.0);
        assert_eq!(got[16], -2_097_152.0);
        // Exponent 90: ±12 · 2^-38, far below f16's 2^-24: flushed to zero.
        let mut tiny = vec![90u8];
        tiny.extend_from_slice(&[0x7f; 16]);
        bytes.clear();
        assert_eq!(to_q8_0(&tiny, &mut bytes), 1);
        BlockQ8_0::to_float(&q8_0(&bytes), &mut got);
        assert!(got.iter().all(|&v| v == 0.0));
        // Exponent 150 with code 12: 12 · 2^22 saturates at 127 · 2^15.
        let mut huge = vec![150u8];
        huge.extend_from_slice(&[0x77; 16]);
        bytes.clear();
        assert_eq!(to_q8_0(&huge, &mut bytes), 1);
        BlockQ8_0::to_float(&q8_0(&bytes), &mut got);
        assert!(got.iter().all(|&v| v == 127.0 * 32768.0));
    }

    /// A dot product on the converted blocks with Q8_0 activations is llama.cpp's
    /// `ggml_vec_dot_mxfp4_q8_0` (generic): per block, the integer sum of code x
    /// activation times both scales, summed in f32.
    #[test]
    fn q8_0_dot_is_llamacpps_mxfp4_dot() {
        let exps: Vec<u8> = (115..=125).collect();
        let src = blocks(8, &exps);
        let mut bytes = Vec::new();
        to_q8_0(&src, &mut bytes);
        let w = q8_0(&bytes);
        let x: Vec<f32> = (0..8 * BLOCK)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut xq = vec![BlockQ8_0::zeros(); 8];
        BlockQ8_0::from_float(&x, &mut xq);
        // SAFETY: BlockQ8_0 is `repr(C)`, 34 bytes; the view covers exactly `xq`.
        let xb = unsafe { std::slice::from_raw_parts(xq.as_ptr() as *const u8, 8 * Q8_0_BYTES) };
        let mut want = 0f32;
        for (b, y) in src
            .chunks_exact(BLOCK_BYTES)
            .zip(xb.chunks_exact(Q8_0_BYTES))
        {
            let sumi: i32 = codes(b)
                .iter()
                .zip(&y[2..])
                .map(|(&a, &b)| i32::from(a) * i32::from(b as i8))
                .sum();
            let dy = f16::from_le_bytes([y[0], y[1]]).to_f32();
            want += e8m0_half(b[0]) * dy * sumi as f32;
        }
        let got = BlockQ8_0::vec_dot(8 * BLOCK, &w, &xq);
        assert!((got - want).abs() <= want.abs() * 1e-6, "{got} vs {want}");
    }
}
