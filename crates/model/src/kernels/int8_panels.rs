//! `Int8Panels`: quantized weights re-laid once, at load, for the 8-bit GEMM
//! (`int8_gemm`). Every 32-weight block of the supported types is affine in a small
//! unsigned integer: `w = d·q + m`, `q` in `0..2^bits` (Q4_0, Q4_1, Q4_K: 4 bits; Q5_0,
//! Q5_1, Q5_K: 5; Q8_0: 8, its signed values shifted by 128). The panels keep `q`
//! exactly, one byte each, so the GEMM's integer products are exact and only the
//! per-block scale work is in float — the same arithmetic as the decode kernels.
//!
//! Layout: panels of 16 output columns; per panel and block, 8 groups of
//! `[16 columns][4 consecutive weights]` (64 bytes, one AVX-512 register, or two AVX2
//! registers of 8 columns); beside them (`Scales`) the block's 16 scales and, for
//! types with minimums, 16 minimums: f16 where every one is an f16 value (the
//! file's own for Q4_0 … Q8_0), else f32 (K-quants' products of two scales).
//! Symmetric types (Q4_0, Q5_0, Q8_0) store `q + zero` (zero 8, 16, 128) and `m = 0`:
//! the GEMM subtracts `zero · Σ activations` from the integer sums (exact).
//! Q6_K and Q3_K have one scale per 16 weights (`w = d·(q - zero)`, `q` in `0..64`,
//! zero 32; `q` in `0..8`, zero 4, its high bit from `hmask`): their panels keep two
//! scales per block (`sub`), one for each half, and the GEMM sums each half's
//! integer products apart. Q2_K has a scale and a minimum per 16 weights
//! (`w = d·q + m`, `q` in `0..4`): four lanes per block, each half's scale and
//! minimum, the minimum times each half's activation sum. (`block_scales` reads
//! each type's scales, `block_values` its values.)
//!
//! Types of at most 4 bits (Q2_K and Q3_K included) may keep their values as
//! nibbles (`to_nibbles`): groups `g` and `g + 4` of a block share one 64-byte
//! vector (low and high halves of each byte; for `sub` types the low nibbles are
//! the first half, the high the second), so a row reads the file's 0.625 bytes per
//! weight (Q4_1: 0.5 of values, 0.125 of f16 scale and minimum) instead of 1.25:
//! what a matrix-vector product at one row is bound by.

use half::f16;

use crate::kernels::block_scales;

mod pack;

/// Output columns per panel.
pub const NR: usize = 16;

/// One group: 16 columns x 4 weights.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Group(pub [u8; 64]);

/// 16 f32 values, one per column of a panel.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Lanes(pub [f32; NR]);

/// 16 f16 values (their bits), one per column of a panel.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct HalfLanes(pub [u16; NR]);

/// `[panel][block][lanes_per_block]`: each block's scales, then (types with
/// minimums) its minimums. f16 only if that is exact for every value, so the
/// GEMM's results do not depend on which is stored. At one row the GEMM is bound by
/// the bytes it reads: f32 scales and minimums would be a third of a 4-bit panel's,
/// so K-quants keep theirs `Factored` as the file does.
pub enum Scales {
    F16(Vec<HalfLanes>),
    F32(Vec<Lanes>),
    /// K-quants: each value the f32 product of a super-block's f16 factor and a
    /// block's small integer, as the file stores them (Q4_K, Q5_K: `d·sc` and
    /// `-(dmin·mn)`, 6-bit unsigned; Q6_K, Q3_K: `d·sc` for each half, signed;
    /// Q2_K: `d·sc` for each half, then `-(dmin·mn)` for each, 4-bit unsigned). The
    /// kernels form the same f32 products the other forms store.
    Factored {
        /// `[panel][super-block][2]`: `d`, then `dmin` (Q6_K, Q3_K: `d` twice).
        outer: Vec<HalfLanes>,
        /// `[panel][block][lanes_per_block]`: the block's integers.
        inner: Vec<ByteLanes>,
        /// Whether `inner` holds signed bytes (Q6_K, Q3_K).
        signed: bool,
    },
}

/// 16 small integers, one per column of a panel.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub struct ByteLanes(pub [u8; NR]);

pub struct Int8Panels {
    pub n: usize,
    pub k: usize,
    /// Blocks per row.
    pub kb: usize,
    /// The largest stored value the type can hold (3, 7, 15, 31, 63 or 255).
    pub qmax: u8,
    /// Subtracted from every stored value (symmetric types), else 0.
    pub zero: i32,
    /// Whether blocks carry a float minimum `m` (asymmetric types).
    pub has_min: bool,
    /// Whether each block has two scales, one per 16 weights (Q2_K, Q3_K, Q6_K),
    /// and (Q2_K, with `has_min`) two minimums.
    pub sub: bool,
    /// `[panel][block][8]` groups, or with `nibbles` `[panel][block][4]` pairs.
    pub groups: Vec<Group>,
    /// Whether groups are packed in pairs as 4-bit values (`to_nibbles`).
    pub nibbles: bool,
    /// Per panel and block: the scales, then (`has_min`) the minimums.
    pub scales: Scales,
    /// 8-bit types only (`qmax` 255): `[panel][block]`, `128 · Σ (stored − zero)` over
    /// each column's 32 values, what the AVX2 GEMM's shifted activations add.
    pub wsum128: Vec<[i32; NR]>,
}

impl Int8Panels {
    /// Scale rows per block: 1, 2 with minimums or per-half scales, 4 with both.
    pub fn lanes_per_block(&self) -> usize {
        block_scales::lanes_per_block(self.has_min, self.sub)
    }

    /// Whether each block's halves are combined in integers (Q2_K, Q3_K): two
    /// scales (and minimums) a block, kept `Factored`, and values small enough
    /// (at most 7) that a half's integer sum fits 16 bits.
    pub fn int_halves(&self) -> bool {
        self.sub && self.qmax <= 7
    }

    /// Whether lane row `j` of a block is a minimum (the negated product of `dmin`
    /// and the block's integer, for `Factored` scales).
    pub fn lane_is_min(&self, j: usize) -> bool {
        block_scales::lane_is_min(self.has_min, self.sub, j)
    }

    /// Lane row `j` of block `at` (`block_scales`' order: the scale, or each
    /// half's, then the minimum, or each half's) at column `c % NR`.
    fn scale(&self, at: usize, j: usize, c: usize) -> f32 {
        let i = at * self.lanes_per_block() + j;
        match &self.scales {
            Scales::F16(s) => f16::from_bits(s[i].0[c % NR]).to_f32(),
            Scales::F32(s) => s[i].0[c % NR],
            Scales::Factored {
                outer,
                inner,
                signed,
            } => {
                let o = self.lane_is_min(j) as usize;
                let (p, b) = (at / self.kb, at % self.kb);
                let d = f16::from_bits(outer[(p * (self.kb / 8) + b / 8) * 2 + o].0[c % NR]);
                let q = inner[i].0[c % NR];
                let q = if *signed { q as i8 as f32 } else { q as f32 };
                let v = d.to_f32() * q;
                if self.lane_is_min(j) {
                    -v
                } else {
                    v
                }
            }
        }
    }

    /// Factored panels: block `b` of panel `p` as the tiles read it: its
    /// super-block's two f16 factors (`d`, then `dmin`; Q3_K: `d` twice), the
    /// block's `lanes_per_block` rows of small integers, and whether they are signed.
    pub fn block_factors(&self, p: usize, b: usize) -> (&[HalfLanes], &[ByteLanes], bool) {
        let Scales::Factored {
            outer,
            inner,
            signed,
        } = &self.scales
        else {
            unreachable!("int_halves panels are factored")
        };
        let (kb, lpb) = (self.kb, self.lanes_per_block());
        let at = (p * (kb / 8) + b / 8) * 2;
        (
            &outer[at..at + 2],
            &inner[(p * kb + b) * lpb..][..lpb],
            *signed,
        )
    }

    /// Groups stored per block.
    pub fn groups_per_block(&self) -> usize {
        if self.nibbles {
            4
        } else {
            8
        }
    }

    /// Packs the values as nibbles (4-bit types only; `false` otherwise).
    pub fn to_nibbles(&mut self) -> bool {
        if self.qmax > 15 || self.nibbles {
            return self.nibbles;
        }
        // In place: block i's 4 pairs go to slots 4i..4i+4, before block i+1's
        // 8 groups (which start at 8i + 8 > 4i + 3) are read.
        let blocks = self.groups.len() / 8;
        for b in 0..blocks {
            for g in 0..4 {
                let (lo, hi) = (self.groups[b * 8 + g].0, self.groups[b * 8 + g + 4].0);
                self.groups[b * 4 + g] = Group(std::array::from_fn(|x| lo[x] | hi[x] << 4));
            }
        }
        self.groups.truncate(blocks * 4);
        self.groups.shrink_to_fit();
        self.nibbles = true;
        true
    }

    /// Bytes held: values, scales and the 8-bit types' column sums.
    pub fn held_bytes(&self) -> usize {
        let scales = match &self.scales {
            Scales::F16(s) => std::mem::size_of_val(s.as_slice()),
            Scales::F32(s) => std::mem::size_of_val(s.as_slice()),
            Scales::Factored { outer, inner, .. } => {
                std::mem::size_of_val(outer.as_slice()) + std::mem::size_of_val(inner.as_slice())
            }
        };
        std::mem::size_of_val(self.groups.as_slice())
            + scales
            + std::mem::size_of_val(self.wsum128.as_slice())
    }

    /// Row `c` of the matrix (`k` values) as f32: a token's embedding when the
    /// output matrix is tied to it.
    pub fn row_f32(&self, c: usize, out: &mut [f32]) {
        for (i, o) in out[..self.k].iter_mut().enumerate() {
            *o = self.weight(c, i);
        }
    }

    /// Weight `(c, i)` as the panels hold it.
    pub fn weight(&self, c: usize, i: usize) -> f32 {
        let (p, j, b) = (c / NR, c % NR, i / 32);
        let at = p * self.kb + b;
        let (g, x) = ((i % 32) / 4, j * 4 + i % 4);
        let q = if self.nibbles {
            (self.groups[at * 4 + g % 4].0[x] >> (4 * (g / 4))) & 0xF
        } else {
            self.groups[at * 8 + g].0[x]
        } as i32
            - self.zero;
        if self.sub {
            let half = (i % 32) / 16;
            let v = self.scale(at, half, j) * q as f32;
            return match self.has_min {
                true => v + self.scale(at, 2 + half, j),
                false => v,
            };
        }
        let m = if self.has_min {
            self.scale(at, 1, j)
        } else {
            0.0
        };
        self.scale(at, 0, j) * q as f32 + m
    }
}

impl Scales {
    /// Whether the values are f16.
    pub fn is_half(&self) -> bool {
        matches!(self, Scales::F16(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;
    use crate::weights::WeightData;
    use candle_core::quantized::k_quants::{
        BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
        BlockQ6K, BlockQ8_0, GgmlType,
    };
    use candle_core::quantized::GgmlDType;
    use GgmlDType as D;

    pub(super) fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let x: Vec<f32> = test_data(n * k, 11).iter().map(|v| v * 3.0).collect();
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&x, &mut w);
        w
    }

    /// `[n, k]` weights of every type the panels hold.
    pub(super) fn every_type(n: usize, k: usize) -> [WeightData; 10] {
        [
            WeightData::Q4_0(quantized::<BlockQ4_0>(n, k)),
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            WeightData::Q5_0(quantized::<BlockQ5_0>(n, k)),
            WeightData::Q5_1(quantized::<BlockQ5_1>(n, k)),
            WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)),
            WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
            WeightData::Q5K(quantized::<BlockQ5K>(n, k)),
            WeightData::Q6K(quantized::<BlockQ6K>(n, k)),
            WeightData::Q3K(quantized::<BlockQ3K>(n, k)),
            WeightData::Q2K(quantized::<BlockQ2K>(n, k)),
        ]
    }

    /// Every supported type's panels hold exactly the file's weights.
    #[test]
    fn panels_hold_each_types_weights_exactly() {
        let (n, k) = (19, 512);
        let cases = every_type(n, k);
        for w in &cases {
            let mut p = Int8Panels::pack(w, n, k).unwrap_or_else(|| panic!("{:?}", w.dtype()));
            let file_scales = !matches!(w.dtype(), D::Q2K | D::Q3K | D::Q4K | D::Q5K | D::Q6K);
            assert!(
                !file_scales || p.scales.is_half(),
                "{:?}: the file's f16 scales",
                w.dtype()
            );
            assert!(
                file_scales || matches!(p.scales, Scales::Factored { .. }),
                "{:?}: the file's factors",
                w.dtype()
            );
            let f = w.to_f32();
            for nibbles in [false, true] {
                if nibbles && !p.to_nibbles() {
                    assert!(p.qmax > 15, "{:?}", w.dtype());
                    continue;
                }
                for c in 0..n {
                    for i in 0..k {
                        let (ours, want) = (p.weight(c, i), f[c * k + i]);
                        assert_eq!(ours, want, "{:?} {nibbles} ({c}, {i})", w.dtype());
                    }
                }
            }
        }
    }

    /// Random bits in every field of the K-quants' blocks (scales of either sign,
    /// every high bit and minimum): the panels hold exactly the dequantized weights,
    /// one byte or a nibble a value.
    #[test]
    fn panels_hold_random_k_quant_blocks_exactly() {
        use crate::kernels::block_scales::random_blocks;
        let (n, k) = (21, 768);
        for dtype in [
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            for seed in 1..4 {
                let w = random_blocks(dtype, n, k, seed);
                let mut p = Int8Panels::pack(&w, n, k).unwrap();
                assert!(matches!(p.scales, Scales::Factored { .. }), "{dtype:?}");
                let f = w.to_f32();
                for nibbles in [false, true] {
                    if nibbles && !p.to_nibbles() {
                        assert!(p.qmax > 15, "{dtype:?}");
                        continue;
                    }
                    for (i, &want) in f.iter().enumerate() {
                        let ours = p.weight(i / k, i % k);
                        assert_eq!(ours.to_bits(), want.to_bits(), "{dtype:?} {seed} at {i}");
                    }
                }
            }
        }
    }
}
