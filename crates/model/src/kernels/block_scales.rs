//! `Affine`: how each type the 8-bit panels hold (`int8_panels`) maps a 32-weight
//! block to `d·(q - zero) + m`, and each block's scales and minimums read from the
//! GGML block's bits (the values are `block_values`'s). The scales are f32 products
//! formed as candle's dequantization forms them, so that the panels' weights are the
//! file's bit for bit.
//!
//! Lanes of a block, in order: its scale, then its minimum (types with minimums);
//! `sub` types (one scale per 16 weights: Q2_K, Q3_K, Q6_K) the first half's scale,
//! the second's, then (Q2_K) the first half's minimum and the second's.

use candle_core::quantized::GgmlDType;
use half::f16;

/// Where a type's blocks keep their scale (and minimum), in ggml's layouts.
#[derive(Clone, Copy)]
enum Layout {
    /// Blocks of 32 weights, `size` bytes: f16 `d`, then (with `min`) f16 `m`.
    Simple { size: usize, min: bool },
    /// Super-blocks of 256, `size` bytes: f16 `d`, f16 `dmin`, 12 bytes of packed
    /// 6-bit scales and minimums (Q4_K, Q5_K).
    KQuant { size: usize },
    /// Q6_K's super-blocks of 256 (210 bytes): 192 bytes of values, 16 signed
    /// 8-bit scales (one per 16 weights), f16 `d` last.
    Q6K,
    /// Q3_K's super-blocks of 256 (110 bytes): 96 bytes of values, 12 bytes of
    /// 16 packed 6-bit scales (each minus 32), f16 `d` last.
    Q3K,
    /// Q2_K's super-blocks of 256 (84 bytes): 16 bytes of 4-bit scales (low) and
    /// minimums (high), one each per 16 weights, 64 bytes of values, f16 `d` and
    /// `dmin`.
    Q2K,
}

/// How one type's 32-weight blocks map to `d·(q - zero) + m`.
#[derive(Clone, Copy)]
pub struct Affine {
    /// The largest stored value.
    pub qmax: u8,
    /// Subtracted from every stored value (symmetric types), else 0.
    pub zero: i32,
    /// Whether blocks carry a float minimum.
    pub has_min: bool,
    /// Whether each 16 weights have their own scale (and minimum).
    pub sub: bool,
    layout: Layout,
}

/// Lanes per block: a scale, a minimum, or one or both per 16 weights.
pub fn lanes_per_block(has_min: bool, sub: bool) -> usize {
    (1 + has_min as usize) * (1 + sub as usize)
}

/// Whether lane `j` of a block is a minimum.
pub fn lane_is_min(has_min: bool, sub: bool, j: usize) -> bool {
    has_min && j >= lanes_per_block(has_min, sub) / 2
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K super-block
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Scale `j` (0..16) of a Q3_K super-block, from its 12 scale bytes `s`: the low
/// 4 bits from `s[j]` (`s[j - 8]`'s high nibble past 8), the high 2 from
/// `s[8 + j % 4]` at bit `2·(j / 4)`; minus 32.
fn scale_q3k(s: &[u8], j: usize) -> i8 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | high << 4) as i8 - 32
}

impl Affine {
    /// `None` for a type the panels do not hold.
    pub fn of(dtype: GgmlDType) -> Option<Affine> {
        let simple = |size, qmax, zero, min| Affine {
            qmax,
            zero,
            has_min: min,
            sub: false,
            layout: Layout::Simple { size, min },
        };
        let k_quant = |size, qmax| Affine {
            qmax,
            zero: 0,
            has_min: true,
            sub: false,
            layout: Layout::KQuant { size },
        };
        let sub = |qmax, zero, has_min, layout| Affine {
            qmax,
            zero,
            has_min,
            sub: true,
            layout,
        };
        Some(match dtype {
            GgmlDType::Q4_0 => simple(18, 15, 8, false),
            GgmlDType::Q4_1 => simple(20, 15, 0, true),
            GgmlDType::Q5_0 => simple(22, 31, 16, false),
            GgmlDType::Q5_1 => simple(24, 31, 0, true),
            GgmlDType::Q8_0 => simple(34, 255, 128, false),
            GgmlDType::Q4K => k_quant(144, 15),
            GgmlDType::Q5K => k_quant(176, 31),
            GgmlDType::Q6K => sub(63, 32, false, Layout::Q6K),
            GgmlDType::Q3K => sub(7, 4, false, Layout::Q3K),
            GgmlDType::Q2K => sub(3, 0, true, Layout::Q2K),
            _ => return None,
        })
    }

    pub fn lanes_per_block(&self) -> usize {
        lanes_per_block(self.has_min, self.sub)
    }

    /// Whether blocks come in super-blocks of 256 weights (K-quants).
    pub fn is_k_quant(&self) -> bool {
        !matches!(self.layout, Layout::Simple { .. })
    }

    /// The lanes of 32-weight block `b` of the tensor (in element order); the
    /// first `lanes_per_block` are used.
    pub fn lanes(&self, bytes: &[u8], b: usize) -> [f32; 4] {
        let Some((size, _)) = self.super_block() else {
            let Layout::Simple { size, min } = self.layout else {
                unreachable!("super-blocks")
            };
            let m = if min {
                f16_at(bytes, b * size + 2)
            } else {
                0.0
            };
            return [f16_at(bytes, b * size), m, 0.0, 0.0];
        };
        let sb = &bytes[(b / 8) * size..][..size];
        let (outer, inner) = self.factors(sb, b % 8);
        let (d, dmin) = (f16::from_bits(outer[0]), f16::from_bits(outer[1]));
        let (d, dmin) = (d.to_f32(), dmin.to_f32());
        // candle computes each product in f32 (the minimums negated), as here.
        let int = |q: u8| match self.signed() {
            true => q as i8 as f32,
            false => q as f32,
        };
        match (self.has_min, self.sub) {
            (true, false) => [d * int(inner[0]), -(dmin * int(inner[1])), 0.0, 0.0],
            (true, true) => [
                d * int(inner[0]),
                d * int(inner[1]),
                -(dmin * int(inner[2])),
                -(dmin * int(inner[3])),
            ],
            _ => [d * int(inner[0]), d * int(inner[1]), 0.0, 0.0],
        }
    }

    /// K-quants: the super-block's size in bytes and whether its small integers
    /// are signed; `None` for blocks of 32.
    pub fn super_block(&self) -> Option<(usize, bool)> {
        match self.layout {
            Layout::Simple { .. } => None,
            Layout::KQuant { size } => Some((size, false)),
            Layout::Q6K => Some((210, true)),
            Layout::Q3K => Some((110, true)),
            Layout::Q2K => Some((84, false)),
        }
    }

    fn signed(&self) -> bool {
        self.super_block().is_some_and(|(_, s)| s)
    }

    /// A K-quant super-block's factors for its block `bi` (0..8): the f16 bits of
    /// `d` and `dmin` (`d` twice for types without minimums), and the block's small
    /// integers in lane order (as bytes; signed types' as `i8`).
    pub fn factors(&self, sb: &[u8], bi: usize) -> ([u16; 2], [u8; 4]) {
        let bits = |at: usize| u16::from_le_bytes([sb[at], sb[at + 1]]);
        match self.layout {
            Layout::Simple { .. } => unreachable!("blocks of 32 are not factored"),
            Layout::KQuant { .. } => {
                let (sc, mn) = scale_min_k4(&sb[4..16], bi);
                ([bits(0), bits(2)], [sc, mn, 0, 0])
            }
            Layout::Q6K => ([bits(208); 2], [sb[192 + 2 * bi], sb[193 + 2 * bi], 0, 0]),
            Layout::Q3K => {
                let s = &sb[96..108];
                let sc = |j| scale_q3k(s, j) as u8;
                ([bits(108); 2], [sc(2 * bi), sc(2 * bi + 1), 0, 0])
            }
            Layout::Q2K => {
                let (lo, hi) = (sb[2 * bi], sb[2 * bi + 1]);
                ([bits(80), bits(82)], [lo & 0xF, hi & 0xF, lo >> 4, hi >> 4])
            }
        }
    }
}

/// Test weights: `[n, k]` blocks of `dtype` with random bits (seeded), their f16
/// factors set to small random values of either sign, as a file's could hold: every
/// value, scale and minimum pattern the layout allows.
#[cfg(test)]
pub fn random_blocks(
    dtype: GgmlDType,
    n: usize,
    k: usize,
    seed: u64,
) -> crate::weights::WeightData {
    let a = Affine::of(dtype).expect("a panels type");
    let (size, factors): (usize, &[usize]) = match a.layout {
        Layout::Simple { size, min } => (size, if min { &[0, 2] } else { &[0] }),
        Layout::KQuant { size } => (size, &[0, 2]),
        Layout::Q6K => (210, &[208]),
        Layout::Q3K => (110, &[108]),
        Layout::Q2K => (84, &[80, 82]),
    };
    let per = if a.is_k_quant() { 256 } else { 32 };
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    };
    let mut bytes: Vec<u8> = (0..n * k / per * size).map(|_| next() as u8).collect();
    for blk in bytes.chunks_exact_mut(size) {
        for &at in factors {
            let v = (next() % 1000 + 1) as f32 * 1e-5 * if next() % 2 == 0 { 1.0 } else { -1.0 };
            blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    crate::weights::WeightData::from_bytes(dtype, &bytes).expect("a block type")
}
