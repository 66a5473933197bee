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
//! nibbles (`repack`): groups `g` and `g + 4` of a block share one 64-byte
//! vector (low and high halves of each byte; for `sub` types the low nibbles are
//! the first half, the high the second), so a row reads the file's 0.625 bytes per
//! weight (Q4_1: 0.5 of values, 0.125 of f16 scale and minimum) instead of 1.25:
//! what a matrix-vector product at one row is bound by. Types of 5 or 6 bits (Q5_0,
//! Q5_1, Q5_K, Q6_K) may keep their low 4 bits as nibbles likewise and their bits 4-5
//! in two more vectors a block, the high planes: byte `x` of plane `h` holds, at bits
//! `2u..2u + 2`, bits 4-5 of byte `x` of group `4h + u`. Six vectors a block, 0.75
//! bytes a weight instead of 1 (Q6_K's file: 0.82 with its scales).

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
    /// Whether groups are packed in pairs as 4-bit values (`repack`).
    pub nibbles: bool,
    /// With `nibbles`, values of 5 or 6 bits: each block's 4 nibble vectors are
    /// followed by its 2 high planes.
    pub high: bool,
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

    /// Factored panels' parts: the super-block factors, the blocks' small integers,
    /// and whether those are signed.
    #[inline(always)]
    pub fn factored(&self) -> (&[HalfLanes], &[ByteLanes], bool) {
        match &self.scales {
            Scales::Factored {
                outer,
                inner,
                signed,
            } => (outer, inner, *signed),
            _ => unreachable!("factored parts of stored scales"),
        }
    }

    /// Factored panels: block `b` of panel `p` as the tiles read it: its
    /// super-block's two f16 factors (`d`, then `dmin`; Q3_K: `d` twice), the
    /// block's `lanes_per_block` rows of small integers, and whether they are signed.
    pub fn block_factors(&self, p: usize, b: usize) -> (&[HalfLanes], &[ByteLanes], bool) {
        let (outer, inner, signed) = self.factored();
        let (kb, lpb) = (self.kb, self.lanes_per_block());
        let at = (p * (kb / 8) + b / 8) * 2;
        (
            &outer[at..at + 2],
            &inner[(p * kb + b) * lpb..][..lpb],
            signed,
        )
    }

    /// Groups stored per block.
    pub fn groups_per_block(&self) -> usize {
        vectors_per_block(self.nibbles, self.high)
    }

    /// Packs values held one byte each as `packing` takes this type (`false`
    /// where it leaves them so, or they are packed already).
    pub fn repack(&mut self, packing: Packing) -> bool {
        if self.nibbles || vectors_per_block_of(packing, self.qmax) == 8 {
            return false;
        }
        let high = self.qmax > 15;
        let per = vectors_per_block(true, high);
        // In place: block i's vectors go to slots per·i.., before block i+1's 8
        // groups (which start at 8i + 8 > per·i + per - 1) are read.
        let blocks = self.groups.len() / 8;
        for b in 0..blocks {
            let block: [Group; 8] = std::array::from_fn(|g| self.groups[b * 8 + g]);
            let out = &mut self.groups[b * per..b * per + per];
            for j in 0..NR {
                let vals: [u8; 32] = std::array::from_fn(|i| block[i / 4].0[j * 4 + i % 4]);
                put_column(&vals, j, out);
            }
        }
        self.groups.truncate(blocks * per);
        self.groups.shrink_to_fit();
        (self.nibbles, self.high) = (true, high);
        true
    }

    /// Whether `o` has this matrix's shape and is read by the same tiles (value
    /// width, packing, zero point, minimums, halves, scale form): what one job of
    /// several matrices (`int8_gemm::matmul_parts`) requires.
    pub fn same_layout(&self, o: &Int8Panels) -> bool {
        let form = |s: &Scales| match s {
            Scales::F16(_) => 0,
            Scales::F32(_) => 1,
            Scales::Factored { signed, .. } => 2 + *signed as u8,
        };
        (self.n, self.k, self.qmax, self.zero, self.has_min, self.sub)
            == (o.n, o.k, o.qmax, o.zero, o.has_min, o.sub)
            && (self.nibbles, self.high, form(&self.scales)) == (o.nibbles, o.high, form(&o.scales))
    }

    /// Panel `p`'s values one byte each (8 groups a block, as `Packing::Bytes` lays
    /// them out) into `out`, from its nibbles and high planes (`high` panels): a
    /// task of many rows merges them once per panel here rather than in every tile.
    pub fn panel_bytes(&self, p: usize, out: &mut Vec<Group>) {
        assert!(self.high, "values kept as nibbles and high planes");
        out.resize(self.kb * 8, Group([0; 64]));
        const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
        const TWO: u64 = 0x0303_0303_0303_0303;
        let word =
            |g: &Group, j: usize| u64::from_le_bytes(g.0[8 * j..8 * j + 8].try_into().unwrap());
        for (b, dst) in out.chunks_exact_mut(8).enumerate() {
            let src = &self.groups[(p * self.kb + b) * 6..][..6];
            for (g, d) in dst.iter_mut().enumerate() {
                let (u, shift) = (g % 4, 4 * (g / 4) as u32);
                for j in 0..8 {
                    let low = (word(&src[u], j) >> shift) & LOW;
                    let high = (word(&src[4 + g / 4], j) >> (2 * u)) & TWO;
                    d.0[8 * j..8 * j + 8].copy_from_slice(&(low | high << 4).to_le_bytes());
                }
            }
        }
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
        let per = self.groups_per_block();
        let q = if self.nibbles {
            let low = (self.groups[at * per + g % 4].0[x] >> (4 * (g / 4))) & 0xF;
            let high = match self.high {
                true => (self.groups[at * per + 4 + g / 4].0[x] >> (2 * (g % 4))) & 3,
                false => 0,
            };
            low | high << 4
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

/// How the panels keep their values: one byte each; values of at most 4 bits as
/// nibbles (the rest as bytes); or also values of 5 and 6 bits as nibbles and high
/// planes. At one row the GEMM is bound by the bytes it reads, so `Planes` (Q6_K:
/// 0.75 bytes a value instead of 1) where merging the planes back costs little:
/// with AVX-512 (one `vpternlogd` a vector; Q6_K's output-matrix GEMV on 2 cores
/// 59.6 against 54.5 GOP/s, prompts about 5% slower). AVX2's merge takes three
/// instructions a vector and slows Q6_K prompts by about a quarter: `Nibbles` there.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Packing {
    Bytes,
    Nibbles,
    Planes,
}

/// Vectors a block takes: 8 groups of bytes, 4 nibble pairs, or those and 2 high
/// planes.
pub fn vectors_per_block(nibbles: bool, high: bool) -> usize {
    match (nibbles, high) {
        (false, _) => 8,
        (true, false) => 4,
        (true, true) => 6,
    }
}

/// Vectors a block of a type whose values reach `qmax` takes under `packing`.
pub fn vectors_per_block_of(packing: Packing, qmax: u8) -> usize {
    match (packing, qmax) {
        (Packing::Nibbles | Packing::Planes, ..=15) => 4,
        (Packing::Planes, ..=63) => 6,
        _ => 8,
    }
}

/// Writes column `j`'s 32 values of one block (`vals`, in order) into the block's
/// vectors `out`, laid out by their count (`vectors_per_block`): group `g` holds
/// values `4g..4g + 4` at bytes `4j..4j + 4`; as nibbles, vector `v` holds groups
/// `v` (low 4 bits) and `v + 4` (high 4 bits); the high planes hold bits 4-5.
fn put_column(vals: &[u8; 32], j: usize, out: &mut [Group]) {
    let at = j * 4;
    if out.len() == 8 {
        for (g, v) in out.iter_mut().zip(vals.chunks_exact(4)) {
            g.0[at..at + 4].copy_from_slice(v);
        }
        return;
    }
    for t in 0..4 {
        for v in 0..4 {
            out[v].0[at + t] = (vals[4 * v + t] & 0xF) | (vals[16 + 4 * v + t] & 0xF) << 4;
        }
        if out.len() == 6 {
            for h in 0..2 {
                out[4 + h].0[at + t] = (0..4)
                    .map(|u| ((vals[16 * h + 4 * u + t] >> 4) & 3) << (2 * u))
                    .sum();
            }
        }
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
            for packing in [Packing::Bytes, Packing::Nibbles, Packing::Planes] {
                if packing != Packing::Bytes && !p.repack(packing) {
                    continue;
                }
                for c in 0..n {
                    for i in 0..k {
                        let (ours, want) = (p.weight(c, i), f[c * k + i]);
                        assert_eq!(ours, want, "{:?} {packing:?} ({c}, {i})", w.dtype());
                    }
                }
            }
            let packed = vectors_per_block_of(Packing::Planes, p.qmax) < 8;
            assert_eq!(p.nibbles, packed, "{:?}: packed where it can be", w.dtype());
        }
    }

    /// A panel of 5- and 6-bit values kept as nibbles and high planes, merged back
    /// into bytes, is the panel packed one byte a value.
    #[test]
    fn panel_bytes_are_the_byte_packing() {
        let (n, k) = (40, 512);
        for w in every_type(n, k)
            .iter()
            .filter(|w| matches!(w.dtype(), D::Q5_0 | D::Q5_1 | D::Q5K | D::Q6K))
        {
            let bytes = Int8Panels::pack(w, n, k).unwrap();
            let mut planes = Int8Panels::pack(w, n, k).unwrap();
            assert!(
                planes.repack(Packing::Planes) && planes.high,
                "{:?}",
                w.dtype()
            );
            let mut out = Vec::new();
            for p in 0..n.div_ceil(NR) {
                planes.panel_bytes(p, &mut out);
                let want = &bytes.groups[p * bytes.kb * 8..][..bytes.kb * 8];
                assert_eq!(out.len(), want.len());
                for (i, (a, b)) in out.iter().zip(want).enumerate() {
                    assert_eq!(a.0, b.0, "{:?} panel {p} group {i}", w.dtype());
                }
            }
        }
    }

    /// Random bits in every field of the K-quants' blocks (scales of either sign,
    /// every high bit and minimum): the panels hold exactly the dequantized weights,
    /// one byte a value, as nibbles, or as nibbles and high planes.
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
                for packing in [Packing::Bytes, Packing::Nibbles, Packing::Planes] {
                    if packing != Packing::Bytes && !p.repack(packing) {
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
