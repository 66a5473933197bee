//! Our f32 -> GGML block quantizers for `--quantize` (q8_0, q4_0, q4_1, f16): each
//! writes the blocks' on-disk bytes exactly as ggml's reference `quantize_row_*` does.

use half::f16;
use rayon::prelude::*;

/// Values per block of the 32-value formats.
pub const QK: usize = 32;
/// Bytes per block: q8_0 (f16 scale, 32 i8), q4_0 (f16 scale, 16 nibble pairs),
/// q4_1 (f16 scale, f16 min, 16 nibble pairs).
pub const Q8_0_BYTES: usize = 2 + QK;
pub const Q4_0_BYTES: usize = 2 + QK / 2;
pub const Q4_1_BYTES: usize = 4 + QK / 2;

/// One q8_0 block: `d = amax / 127`, `q = round(x / d)`.
pub fn block_q8_0(xs: &[f32], out: &mut [u8]) {
    let amax = xs.iter().fold(0f32, |a, x| a.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (o, &x) in out[2..2 + QK].iter_mut().zip(xs) {
        *o = (x * id).round() as i8 as u8;
    }
}

/// One q4_0 block: `d = max / -8` where `max` is the value of largest magnitude,
/// `q = min(15, x / d + 8.5)`; value j in the low nibble of byte j, value j + 16 in
/// its high nibble.
pub fn block_q4_0(xs: &[f32], out: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xs {
        if amax < x.abs() {
            amax = x.abs();
            max = x;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let q = |x: f32| ((x * id + 8.5) as u8).min(15);
    for j in 0..QK / 2 {
        out[2 + j] = q(xs[j]) | (q(xs[j + QK / 2]) << 4);
    }
}

/// One q4_1 block: `d = (max - min) / 15`, `m = min`, `q = min(15, (x - m) / d + 0.5)`.
pub fn block_q4_1(xs: &[f32], out: &mut [u8]) {
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in xs {
        min = min.min(x);
        max = max.max(x);
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
    let q = |x: f32| (((x - min) * id + 0.5) as u8).min(15);
    for j in 0..QK / 2 {
        out[4 + j] = q(xs[j]) | (q(xs[j + QK / 2]) << 4);
    }
}

/// One "block" of f16: a single value, rounded to nearest even.
pub fn block_f16(xs: &[f32], out: &mut [u8]) {
    out[..2].copy_from_slice(&f16::from_f32(xs[0]).to_le_bytes());
}

/// Quantizes `xs` (a whole number of blocks of `block` values) with `f`, `bytes` per
/// block, over the compute pool; returns the blocks' bytes.
pub fn quantize_blocks(
    xs: &[f32],
    block: usize,
    bytes: usize,
    f: fn(&[f32], &mut [u8]),
) -> Vec<u8> {
    assert_eq!(
        xs.len() % block,
        0,
        "{} values, blocks of {block}",
        xs.len()
    );
    let mut out = vec![0u8; xs.len() / block * bytes];
    // Large chunks: each task quantizes many blocks.
    const PER_TASK: usize = 4096;
    out.par_chunks_mut(PER_TASK * bytes)
        .zip(xs.par_chunks(PER_TASK * block))
        .for_each(|(o, x)| {
            for (ob, xb) in o.chunks_exact_mut(bytes).zip(x.chunks_exact(block)) {
                f(xb, ob);
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{BlockQ4_0, BlockQ4_1, BlockQ8_0, GgmlType};

    /// Our bytes against candle's `from_float` blocks (bit for bit), and both
    /// dequantized with candle's `to_float`.
    fn check<T: GgmlType + PartialEq + std::fmt::Debug>(
        xs: &[f32],
        block: usize,
        bytes: usize,
        f: fn(&[f32], &mut [u8]),
    ) {
        assert_eq!(std::mem::size_of::<T>(), bytes);
        assert_eq!(T::BLCK_SIZE, block);
        let ours = quantize_blocks(xs, block, bytes, f);
        let mut theirs = vec![T::zeros(); xs.len() / block];
        T::from_float(xs, &mut theirs);
        // SAFETY: GGML block types are plain repr(C) structs without padding
        // (their sizes are asserted equal to the format's byte count above).
        let theirs_bytes = unsafe {
            std::slice::from_raw_parts(theirs.as_ptr() as *const u8, theirs.len() * bytes)
        };
        assert_eq!(ours.len(), theirs_bytes.len());
        for (i, (a, b)) in ours
            .chunks_exact(bytes)
            .zip(theirs_bytes.chunks_exact(bytes))
            .enumerate()
        {
            assert_eq!(a, b, "block {i} differs from candle's");
        }
        let blocks = crate::weights::WeightData::from_bytes(T::DTYPE, &ours).unwrap();
        let mut reference = vec![0f32; xs.len()];
        T::to_float(&theirs, &mut reference);
        assert_eq!(blocks.to_f32(), reference, "round trip differs");
    }

    /// Pseudo-random values in [-1, 1) at full f32 resolution (xorshift64*).
    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                r as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Random data at several scales, plus blocks that are all zero, constant, or
    /// hold one outlier.
    fn inputs() -> Vec<Vec<f32>> {
        let mut special = vec![0f32; 4 * QK];
        special[QK..2 * QK].fill(0.75);
        special[2 * QK + 5] = -3.0;
        special[3 * QK + 7] = 1e-3;
        let mut v = vec![special];
        for (seed, scale) in [(1u64, 1.0f32), (2, 0.02), (3, 40.0)] {
            v.push(random(QK * 9001, seed).iter().map(|x| x * scale).collect());
        }
        v
    }

    #[test]
    fn q8_0_matches_candle() {
        for xs in inputs() {
            check::<BlockQ8_0>(&xs, QK, Q8_0_BYTES, block_q8_0);
        }
    }

    #[test]
    fn q4_0_matches_candle() {
        for xs in inputs() {
            check::<BlockQ4_0>(&xs, QK, Q4_0_BYTES, block_q4_0);
        }
    }

    #[test]
    fn q4_1_matches_candle() {
        for xs in inputs() {
            check::<BlockQ4_1>(&xs, QK, Q4_1_BYTES, block_q4_1);
        }
    }

    #[test]
    fn f16_matches_candle() {
        for xs in inputs() {
            check::<f16>(&xs, 1, 2, block_f16);
        }
    }
}
