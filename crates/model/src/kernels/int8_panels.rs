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

use std::ops::Range;

use candle_core::quantized::GgmlDType;
use half::f16;

use crate::kernels::block_scales::{self, Affine};
use crate::kernels::block_values::stored_values;
use crate::weights::WeightData;

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
    /// Re-lays a row-major `[n, k]` matrix; `None` for a type whose blocks are not
    /// `d·q + m` with one `(d, m)` per 32 weights (per 16 for Q2_K, Q3_K, Q6_K).
    pub fn pack(w: &WeightData, n: usize, k: usize) -> Option<Self> {
        Self::pack_as(w, n, k, false)
    }

    /// `pack`, 4-bit values as nibbles where `nibbles` (what `to_nibbles` gives,
    /// without the one-byte groups in between).
    pub fn pack_as(w: &WeightData, n: usize, k: usize, nibbles: bool) -> Option<Self> {
        let (a, kb) = Self::layout(w.dtype(), k)?;
        let gpb = Self::groups_for(&a, nibbles);
        let mut groups = vec![Group([0; 64]); n.div_ceil(NR) * kb * gpb];
        let part = Part::pack(&a, w.dtype(), w.as_bytes(), (n, kb), &mut groups);
        Some(Self::assemble(&a, n, k, groups, part))
    }

    /// Groups a block takes: 4 for values of at most 4 bits as nibbles, else 8.
    fn groups_for(a: &Affine, nibbles: bool) -> usize {
        if nibbles && a.qmax <= 15 {
            4
        } else {
            8
        }
    }

    /// `pack`, reading the file's blocks `chunk` rows at a time (`read(rows, buf)`
    /// puts those rows' bytes in `buf`), so only one chunk's blocks are held beside
    /// the panels and never the whole matrix's: a load's peak memory. `Ok(None)`
    /// where `pack` gives `None`, or where chunks' scales took different forms (f16
    /// for one, f32 for another; not seen in files): the caller packs the whole
    /// matrix then.
    pub fn pack_chunks<E>(
        dtype: GgmlDType,
        (n, k): (usize, usize),
        nibbles: bool,
        chunk: usize,
        mut read: impl FnMut(Range<usize>, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Option<Self>, E> {
        let Some((a, kb)) = Self::layout(dtype, k) else {
            return Ok(None);
        };
        // Whole panels a chunk, so each part's `[panel]` arrays append in order.
        let chunk = chunk.max(1).next_multiple_of(NR);
        let gpb = Self::groups_for(&a, nibbles);
        let mut groups = vec![Group([0; 64]); n.div_ceil(NR) * kb * gpb];
        let mut buf = Vec::new();
        let mut whole: Option<Part> = None;
        for r0 in (0..n).step_by(chunk) {
            let rows = r0..(r0 + chunk).min(n);
            read(rows.clone(), &mut buf)?;
            let g = &mut groups[r0 / NR * kb * gpb..rows.end.div_ceil(NR) * kb * gpb];
            let part = Part::pack(&a, dtype, &buf, (rows.len(), kb), g);
            match &mut whole {
                None => whole = Some(part),
                Some(w) => {
                    if !w.append(part) {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(whole.map(|part| Self::assemble(&a, n, k, groups, part)))
    }

    /// The type's layout and the blocks per row, if the panels hold it.
    fn layout(dtype: GgmlDType, k: usize) -> Option<(Affine, usize)> {
        let a = Affine::of(dtype)?;
        if !k.is_multiple_of(256) && a.is_k_quant() {
            return None;
        }
        Some((a, k / 32))
    }

    fn assemble(a: &Affine, n: usize, k: usize, groups: Vec<Group>, part: Part) -> Self {
        let nibbles = groups.len() < n.div_ceil(NR) * (k / 32) * 8;
        Int8Panels {
            wsum128: part.wsum128,
            n,
            k,
            kb: k / 32,
            qmax: a.qmax,
            zero: a.zero,
            has_min: a.has_min,
            sub: a.sub,
            groups,
            nibbles,
            scales: part.scales,
        }
    }

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

/// The scales and column sums of some consecutive whole panels' rows, before they
/// are appended (`Int8Panels::pack_chunks`); their groups are written in place.
struct Part {
    scales: Scales,
    wsum128: Vec<[i32; NR]>,
}

impl Part {
    /// Writes the panels of the `n` rows whose blocks are `bytes` into `groups`
    /// (their `[panel][block][8]` slots, or `[4]` as nibbles when that is their
    /// length), from the file's bits (no dequantization), and returns their scales.
    fn pack(
        a: &Affine,
        dtype: GgmlDType,
        bytes: &[u8],
        (n, kb): (usize, usize),
        groups: &mut [Group],
    ) -> Part {
        use rayon::prelude::*;
        let panels = n.div_ceil(NR);
        let gpb = groups.len() / (panels * kb);
        // Panels in parallel (load time): each writes only its own groups.
        groups
            .par_chunks_mut(kb * gpb)
            .enumerate()
            .for_each(|(p, groups)| {
                let mut vals = [0u8; 32];
                for c in p * NR..((p + 1) * NR).min(n) {
                    let j = c % NR;
                    for (b, block) in groups.chunks_exact_mut(gpb).enumerate() {
                        let known = stored_values(dtype, bytes, c * kb + b, &mut vals);
                        debug_assert!(known, "{dtype:?} has an affine layout");
                        if gpb == 8 {
                            for (g, v) in block.iter_mut().zip(vals.chunks_exact(4)) {
                                g.0[j * 4..j * 4 + 4].copy_from_slice(v);
                            }
                            continue;
                        }
                        // Nibbles (`to_nibbles`' layout): group g pairs groups g and g + 4.
                        let (lo, hi) = vals.split_at(16);
                        for (g, (lo, hi)) in block
                            .iter_mut()
                            .zip(lo.chunks_exact(4).zip(hi.chunks_exact(4)))
                        {
                            for (t, (l, h)) in lo.iter().zip(hi).enumerate() {
                                g.0[j * 4 + t] = l | h << 4;
                            }
                        }
                    }
                }
            });
        let wsum128 = if a.qmax == 255 {
            (0..panels * kb)
                .into_par_iter()
                .map(|at| {
                    std::array::from_fn(|j| {
                        let total: i32 = (0..32)
                            .map(|i| groups[at * 8 + i / 4].0[j * 4 + i % 4] as i32 - a.zero)
                            .sum();
                        128 * total
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let scales = match a.super_block() {
            Some(_) => Scales::factored(a, bytes, n, kb),
            None => Scales::narrowed(Scales::lanes(a, bytes, n, kb)),
        };
        Part { scales, wsum128 }
    }

    /// Appends the next rows' part; `false` if its scales took another form.
    fn append(&mut self, next: Part) -> bool {
        match (&mut self.scales, next.scales) {
            (Scales::F16(s), Scales::F16(t)) => s.extend(t),
            (Scales::F32(s), Scales::F32(t)) => s.extend(t),
            (
                Scales::Factored {
                    outer,
                    inner,
                    signed,
                },
                Scales::Factored {
                    outer: o,
                    inner: i,
                    signed: t,
                },
            ) if *signed == t => {
                outer.extend(o);
                inner.extend(i);
            }
            _ => return false,
        }
        self.wsum128.extend(next.wsum128);
        true
    }
}

impl Scales {
    /// A K-quant's scales `Factored` from the file's blocks (`bytes`). Exact by
    /// construction: `Affine::lanes`, the values each form must give, is defined as
    /// the f32 products of these factors, the ones `Int8Panels::scale` and the
    /// kernels form (tested: `factored_scales_are_the_blocks_lanes`).
    fn factored(a: &Affine, bytes: &[u8], n: usize, kb: usize) -> Scales {
        use rayon::prelude::*;
        let (size, signed) = a.super_block().expect("a K-quant");
        let (panels, sbs, lpb) = (n.div_ceil(NR), kb / 8, a.lanes_per_block());
        let mut outer = vec![HalfLanes([0; NR]); panels * sbs * 2];
        let mut inner = vec![ByteLanes([0; NR]); panels * kb * lpb];
        // Panels in parallel (load time), each writing only its own lanes.
        outer
            .par_chunks_mut(sbs * 2)
            .zip(inner.par_chunks_mut(kb * lpb))
            .enumerate()
            .for_each(|(p, (outer, inner))| {
                for c in p * NR..((p + 1) * NR).min(n) {
                    let j = c % NR;
                    for sb in 0..sbs {
                        let blk = &bytes[(c * sbs + sb) * size..][..size];
                        for bi in 0..8 {
                            let (d, ints) = a.factors(blk, bi);
                            (outer[sb * 2].0[j], outer[sb * 2 + 1].0[j]) = (d[0], d[1]);
                            let at = (sb * 8 + bi) * lpb;
                            for (l, &q) in ints[..lpb].iter().enumerate() {
                                inner[at + l].0[j] = q;
                            }
                        }
                    }
                }
            });
        Scales::Factored {
            outer,
            inner,
            signed,
        }
    }

    /// Blocks of 32 (Q4_0 … Q8_0): each block's scale and minimum, `[panel][block]
    /// [lanes_per_block]`, from the file's f16 values.
    fn lanes(a: &Affine, bytes: &[u8], n: usize, kb: usize) -> Vec<Lanes> {
        use rayon::prelude::*;
        let per = a.lanes_per_block();
        let mut lanes = vec![Lanes([0.0; NR]); n.div_ceil(NR) * kb * per];
        lanes
            .par_chunks_mut(kb * per)
            .enumerate()
            .for_each(|(p, lanes)| {
                for c in p * NR..((p + 1) * NR).min(n) {
                    for b in 0..kb {
                        let v = a.lanes(bytes, c * kb + b);
                        for (l, v) in v[..per].iter().enumerate() {
                            lanes[b * per + l].0[c % NR] = *v;
                        }
                    }
                }
            });
        lanes
    }

    /// `f32` as f16 if every value survives the round trip, else as it is.
    fn narrowed(f32: Vec<Lanes>) -> Scales {
        let half: Vec<HalfLanes> = f32
            .iter()
            .map(|l| HalfLanes(l.0.map(|v| f16::from_f32(v).to_bits())))
            .collect();
        let exact = f32.iter().zip(&half).all(|(l, h)| {
            l.0.iter()
                .zip(h.0)
                .all(|(&v, b)| f16::from_bits(b).to_f32().to_bits() == v.to_bits())
        });
        if exact {
            Scales::F16(half)
        } else {
            Scales::F32(f32)
        }
    }

    /// Whether the values are f16.
    pub fn is_half(&self) -> bool {
        matches!(self, Scales::F16(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;
    use candle_core::quantized::k_quants::{
        BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
        BlockQ6K, BlockQ8_0, GgmlType,
    };
    use candle_core::quantized::GgmlDType;
    use GgmlDType as D;

    fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let x: Vec<f32> = test_data(n * k, 11).iter().map(|v| v * 3.0).collect();
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&x, &mut w);
        w
    }

    /// `[n, k]` weights of every type the panels hold.
    fn every_type(n: usize, k: usize) -> [WeightData; 10] {
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

    /// Built from rows a chunk at a time (the loader's way), the panels are those of
    /// the whole matrix, byte for byte: groups, every scale form, the column sums.
    #[test]
    fn chunked_packing_equals_whole() {
        let (n, k) = (53, 512);
        let cases = every_type(n, k);
        let lanes = |p: &Int8Panels| -> Vec<f32> {
            let at = p.n.div_ceil(NR) * p.kb;
            (0..at)
                .flat_map(|a| {
                    (0..p.lanes_per_block()).flat_map(move |j| (0..NR).map(move |c| (a, j, c)))
                })
                .map(|(a, j, c)| p.scale(a, j, c))
                .collect()
        };
        for (w, nibbles) in cases.iter().flat_map(|w| [(w, false), (w, true)]) {
            let mut whole = Int8Panels::pack(w, n, k).unwrap();
            if nibbles {
                whole.to_nibbles();
            }
            let bytes = w.as_bytes();
            let row = bytes.len() / n;
            let direct = Int8Panels::pack_as(w, n, k, nibbles).unwrap();
            assert_eq!(direct.nibbles, whole.nibbles, "{:?}", w.dtype());
            assert!(direct
                .groups
                .iter()
                .zip(&whole.groups)
                .all(|(a, b)| a.0 == b.0));
            // Not a multiple of NR (rounded up to one), one panel, and more than n.
            for chunk in [1, 20, 32, 100] {
                let mut reads = 0;
                let read = |rows: Range<usize>, buf: &mut Vec<u8>| {
                    reads += 1;
                    buf.clear();
                    buf.extend_from_slice(&bytes[rows.start * row..rows.end * row]);
                    Ok::<_, ()>(())
                };
                let p = Int8Panels::pack_chunks(w.dtype(), (n, k), nibbles, chunk, read)
                    .unwrap()
                    .unwrap();
                let what = format!("{:?} chunk {chunk} nibbles {nibbles}", w.dtype());
                assert_eq!(p.nibbles, whole.nibbles, "{what}");
                assert_eq!(reads, n.div_ceil(chunk.next_multiple_of(NR)), "{what}");
                assert_eq!(p.groups.len(), whole.groups.len(), "{what}");
                assert!(
                    p.groups.iter().zip(&whole.groups).all(|(a, b)| a.0 == b.0),
                    "{what}"
                );
                assert_eq!(p.wsum128, whole.wsum128, "{what}");
                assert_eq!(
                    std::mem::discriminant(&p.scales),
                    std::mem::discriminant(&whole.scales),
                    "{what}"
                );
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(bits(lanes(&p)), bits(lanes(&whole)), "{what}");
                assert_eq!(p.held_bytes(), whole.held_bytes(), "{what}");
            }
        }
    }

    /// K-quants' factored scales (kept without a check at load) give each block's
    /// lanes, the values `Affine::lanes` reads from the file, bit for bit: random
    /// blocks, every sign and size of factor.
    #[test]
    fn factored_scales_are_the_blocks_lanes() {
        use crate::kernels::block_scales::random_blocks;
        let (n, k) = (37, 512);
        for dtype in [D::Q2K, D::Q3K, D::Q4K, D::Q5K, D::Q6K] {
            let w = random_blocks(dtype, n, k, 5);
            let p = Int8Panels::pack(&w, n, k).unwrap();
            assert!(matches!(p.scales, Scales::Factored { .. }), "{dtype:?}");
            let a = Affine::of(dtype).unwrap();
            for c in 0..n {
                for b in 0..p.kb {
                    let want = a.lanes(w.as_bytes(), c * p.kb + b);
                    for (j, v) in want[..p.lanes_per_block()].iter().enumerate() {
                        let at = (c / NR) * p.kb + b;
                        assert_eq!(
                            p.scale(at, j, c).to_bits(),
                            v.to_bits(),
                            "{dtype:?} {c} {b} {j}"
                        );
                    }
                }
            }
        }
    }

    /// A read that fails ends the packing with its error.
    #[test]
    fn chunked_packing_passes_a_read_error_on() {
        let (n, k) = (40, 256);
        let w = WeightData::Q4K(quantized::<BlockQ4K>(n, k));
        let row = w.as_bytes().len() / n;
        let read = |rows: Range<usize>, buf: &mut Vec<u8>| match rows.start {
            0 => {
                *buf = w.as_bytes()[..rows.len() * row].to_vec();
                Ok(())
            }
            _ => Err("truncated"),
        };
        let r = Int8Panels::pack_chunks(w.dtype(), (n, k), true, 16, read);
        assert_eq!(r.err(), Some("truncated"));
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
