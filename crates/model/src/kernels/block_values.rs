//! `stored_values`: the small unsigned integer of each weight of one 32-weight block,
//! read from the GGML block's bits, as the 8-bit panels store it (`int8_panels`): the
//! file's own value for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (their
//! zero points, 8, 16, 4 and 32, stay in the value; Q3_K's is 4 where its high bit is
//! clear, so the value is the 2 low bits plus 4 times that bit), Q8_0's signed byte
//! plus 128. With the block's scale and minimum they give the weight exactly as
//! ggml's dequantization does.

use candle_core::quantized::GgmlDType;

/// Block `b` (the tensor's 32-weight blocks in element order) of a tensor of `dtype`
/// whose blocks are `bytes`, into `out`; `false` for a type not listed above.
pub fn stored_values(dtype: GgmlDType, bytes: &[u8], b: usize, out: &mut [u8; 32]) -> bool {
    match dtype {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let size = if dtype == GgmlDType::Q4_0 { 18 } else { 20 };
            let qs = &bytes[b * size + size - 16..][..16];
            for j in 0..16 {
                out[j] = qs[j] & 0xF;
                out[j + 16] = qs[j] >> 4;
            }
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let size = if dtype == GgmlDType::Q5_0 { 22 } else { 24 };
            let blk = &bytes[b * size..][..size];
            let qh = u32::from_le_bytes(blk[size - 20..size - 16].try_into().expect("4 bytes"));
            let qs = &blk[size - 16..];
            for j in 0..16 {
                out[j] = (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10) as u8;
                out[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10) as u8;
            }
        }
        GgmlDType::Q8_0 => {
            let qs = &bytes[b * 34 + 2..][..32];
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = (q as i8 as i16 + 128) as u8;
            }
        }
        GgmlDType::Q4K | GgmlDType::Q5K => {
            // 256 weights in 4 runs of 64: 32 bytes, low nibbles then high nibbles
            // (Q5_K: a fifth bit from qh, bit 2j for the low run, 2j+1 for the high).
            let size = if dtype == GgmlDType::Q4K { 144 } else { 176 };
            let sb = &bytes[(b / 8) * size..][..size];
            let (j, high) = ((b % 8) / 2, b % 2 == 1);
            let qs = &sb[size - 128 + 32 * j..][..32];
            for (l, o) in out.iter_mut().enumerate() {
                let v = if high { qs[l] >> 4 } else { qs[l] & 0xF };
                let bit = if dtype == GgmlDType::Q5K {
                    (sb[16 + l] >> (2 * j + high as usize)) & 1
                } else {
                    0
                };
                *o = v | bit << 4;
            }
        }
        GgmlDType::Q6K => {
            // Two halves of 128; in each, weights l, l+32, l+64, l+96 from ql[l],
            // ql[l+32] (low, then high nibbles) and the 2-bit pairs of qh[l].
            let sb = &bytes[(b / 8) * 210..][..210];
            let (n, quarter) = ((b % 8) / 4, b % 4);
            let (ql, qh) = (&sb[64 * n..][..64], &sb[128 + 32 * n..][..32]);
            for (l, o) in out.iter_mut().enumerate() {
                let low = match quarter {
                    0 => ql[l] & 0xF,
                    1 => ql[l + 32] & 0xF,
                    2 => ql[l] >> 4,
                    _ => ql[l + 32] >> 4,
                };
                *o = low | ((qh[l] >> (2 * quarter)) & 3) << 4;
            }
        }
        GgmlDType::Q2K | GgmlDType::Q3K => {
            // Two halves of 128; in each, 32 bytes whose 2-bit pairs (shift 2j) are
            // weights 32j..32j+32. Q3_K: a third bit, bit b of hmask[l] (b the
            // block's place in its super-block).
            let q3 = dtype == GgmlDType::Q3K;
            let size = if q3 { 110 } else { 84 };
            let sb = &bytes[(b / 8) * size..][..size];
            let (n, j) = ((b % 8) / 4, b % 4);
            let qs = &sb[if q3 { 32 } else { 16 } + 32 * n..][..32];
            for (l, o) in out.iter_mut().enumerate() {
                let high = if q3 { (sb[l] >> (b % 8)) & 1 } else { 0 };
                *o = ((qs[l] >> (2 * j)) & 3) | high << 2;
            }
        }
        _ => return false,
    }
    true
}
