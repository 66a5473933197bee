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
//! Q6_K has one scale per 16 weights (`w = d·(q - 32)`, `q` in `0..64`): its panels
//! keep two scales per block (`sub`), one for each half, and the GEMM sums each
//! half's integer products apart. Q2_K and Q3_K are not packed: `pack` returns
//! `None` and the caller keeps the file's blocks.
//!
//! 4-bit types may keep their values as nibbles (`to_nibbles`): groups `g` and
//! `g + 4` of a block share one 64-byte vector (low and high halves of each byte),
//! so a row reads the file's 0.625 bytes per weight (Q4_1: 0.5 of values, 0.125 of
//! f16 scale and minimum) instead of 1.25: what a matrix-vector product at one row
//! is bound by.

use candle_core::quantized::GgmlDType;
use half::f16;

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
    /// `-(dmin·mn)`, 6-bit unsigned; Q6_K: `d·sc` for each half, 8-bit signed). The
    /// kernels form the same f32 products the other forms store.
    Factored {
        /// `[panel][super-block][2]`: `d`, then `dmin` (Q6_K: `d` twice).
        outer: Vec<HalfLanes>,
        /// `[panel][block][lanes_per_block]`: the block's integers.
        inner: Vec<ByteLanes>,
        /// Whether `inner` holds signed bytes (Q6_K).
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
    /// The largest stored value the type can hold (15, 31 or 255).
    pub qmax: u8,
    /// Subtracted from every stored value (symmetric types), else 0.
    pub zero: i32,
    /// Whether blocks carry a float minimum `m` (asymmetric types).
    pub has_min: bool,
    /// Whether each block has two scales, one per 16 weights (Q6_K), in place of
    /// a scale and a minimum.
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
}

/// How one type's 32-weight blocks map to `d·(q - zero) + m`.
struct Affine {
    qmax: u8,
    zero: i32,
    has_min: bool,
    sub: bool,
    layout: Layout,
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

impl Affine {
    fn of(dtype: GgmlDType) -> Option<Affine> {
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
        Some(match dtype {
            GgmlDType::Q4_0 => simple(18, 15, 8, false),
            GgmlDType::Q4_1 => simple(20, 15, 0, true),
            GgmlDType::Q5_0 => simple(22, 31, 16, false),
            GgmlDType::Q5_1 => simple(24, 31, 0, true),
            GgmlDType::Q8_0 => simple(34, 255, 128, false),
            GgmlDType::Q4K => k_quant(144, 15),
            GgmlDType::Q5K => k_quant(176, 31),
            GgmlDType::Q6K => Affine {
                qmax: 63,
                zero: 32,
                has_min: false,
                sub: true,
                layout: Layout::Q6K,
            },
            _ => return None,
        })
    }

    /// `(d, m)` of each 16-weight half of 32-weight block `b` of the tensor (in
    /// element order): the same pair twice except for `sub` types.
    fn dm(&self, bytes: &[u8], b: usize) -> [(f32, f32); 2] {
        if let Layout::Q6K = self.layout {
            let sb = &bytes[(b / 8) * 210..][..210];
            let d = f16_at(sb, 208);
            let sc = |j: usize| sb[192 + j] as i8 as f32;
            // candle computes `d * scale` in f32, then times the value, as here.
            return [(d * sc(2 * (b % 8)), 0.0), (d * sc(2 * (b % 8) + 1), 0.0)];
        }
        [self.dm32(bytes, b); 2]
    }

    /// `(d, m)` of 32-weight block `b` of a type with one pair per block.
    fn dm32(&self, bytes: &[u8], b: usize) -> (f32, f32) {
        match self.layout {
            Layout::Q6K => unreachable!("two scales per block"),
            Layout::Simple { size, min } => {
                let m = if min {
                    f16_at(bytes, b * size + 2)
                } else {
                    0.0
                };
                (f16_at(bytes, b * size), m)
            }
            Layout::KQuant { size } => {
                let sb = &bytes[(b / 8) * size..][..size];
                let (sc, mn) = scale_min_k4(&sb[4..16], b % 8);
                // candle computes these products in f32, as here.
                (f16_at(sb, 0) * sc as f32, -(f16_at(sb, 2) * mn as f32))
            }
        }
    }
}

impl Int8Panels {
    /// Re-lays a row-major `[n, k]` matrix; `None` for a type whose blocks are not
    /// `d·q + m` with one `(d, m)` per 32 weights (per 16 for Q6_K).
    pub fn pack(w: &WeightData, n: usize, k: usize) -> Option<Self> {
        use rayon::prelude::*;
        let a = Affine::of(w.dtype())?;
        if !k.is_multiple_of(256)
            && matches!(w.dtype(), GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K)
        {
            return None;
        }
        let kb = k / 32;
        let panels = n.div_ceil(NR);
        let bytes = w.as_bytes();
        let mut groups = vec![Group([0; 64]); panels * kb * 8];
        let per = if a.has_min || a.sub { 2 } else { 1 };
        let mut scales = vec![Lanes([0.0; NR]); panels * kb * per];
        // Panels in parallel (load time): each writes only its own groups and
        // scales, from the file's bits (no dequantization).
        let dtype = w.dtype();
        groups
            .par_chunks_mut(kb * 8)
            .zip(scales.par_chunks_mut(kb * per))
            .enumerate()
            .for_each(|(p, (groups, scales))| {
                let mut vals = [0u8; 32];
                for c in p * NR..((p + 1) * NR).min(n) {
                    let j = c % NR;
                    for b in 0..kb {
                        let halves = a.dm(bytes, c * kb + b);
                        scales[b * per].0[j] = halves[0].0;
                        if a.sub {
                            scales[b * per + 1].0[j] = halves[1].0;
                        } else if a.has_min {
                            scales[b * per + 1].0[j] = halves[0].1;
                        }
                        let known = stored_values(dtype, bytes, c * kb + b, &mut vals);
                        debug_assert!(known, "{dtype:?} has an affine layout");
                        for (i, &v) in vals.iter().enumerate() {
                            groups[b * 8 + i / 4].0[j * 4 + i % 4] = v;
                        }
                    }
                }
            });
        let wsum128 = if a.qmax == 255 {
            (0..panels * kb)
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
        Some(Int8Panels {
            wsum128,
            n,
            k,
            kb,
            qmax: a.qmax,
            zero: a.zero,
            has_min: a.has_min,
            sub: a.sub,
            groups,
            nibbles: false,
            scales: Scales::factored(&a, bytes, n, kb, &scales)
                .unwrap_or_else(|| Scales::narrowed(scales)),
        })
    }

    /// Scale rows per block: 2 with minimums, else 1.
    pub fn lanes_per_block(&self) -> usize {
        if self.has_min || self.sub {
            2
        } else {
            1
        }
    }

    /// Lane row `j` of block `at` (the scale, then the minimum or the second
    /// half's scale) at column `c % NR`.
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
                let o = if self.has_min { j } else { 0 };
                let (p, b) = (at / self.kb, at % self.kb);
                let d = f16::from_bits(outer[(p * (self.kb / 8) + b / 8) * 2 + o].0[c % NR]);
                let q = inner[i].0[c % NR];
                let q = if *signed { q as i8 as f32 } else { q as f32 };
                let v = d.to_f32() * q;
                if self.has_min && j == 1 {
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
            return self.scale(at, (i % 32) / 16, j) * q as f32;
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
    /// A K-quant's scales `Factored` from the file's blocks (`bytes`), if every
    /// product equals its `f32` lane bit for bit; `None` for other types.
    fn factored(a: &Affine, bytes: &[u8], n: usize, kb: usize, f32: &[Lanes]) -> Option<Scales> {
        let (size, signed) = match a.layout {
            Layout::KQuant { size } => (size, false),
            Layout::Q6K => (210, true),
            Layout::Simple { .. } => return None,
        };
        let (panels, sbs, lpb) = (n.div_ceil(NR), kb / 8, 2);
        let mut outer = vec![HalfLanes([0; NR]); panels * sbs * 2];
        let mut inner = vec![ByteLanes([0; NR]); panels * kb * lpb];
        for c in 0..n {
            let (p, j) = (c / NR, c % NR);
            for sb in 0..sbs {
                let blk = &bytes[(c * sbs + sb) * size..][..size];
                let bits = |at: usize| u16::from_le_bytes([blk[at], blk[at + 1]]);
                let o = (p * sbs + sb) * 2;
                if signed {
                    (outer[o].0[j], outer[o + 1].0[j]) = (bits(208), bits(208));
                } else {
                    (outer[o].0[j], outer[o + 1].0[j]) = (bits(0), bits(2));
                }
                for bi in 0..8 {
                    let at = (p * kb + sb * 8 + bi) * lpb;
                    let (x, y) = if signed {
                        (blk[192 + 2 * bi], blk[192 + 2 * bi + 1])
                    } else {
                        scale_min_k4(&blk[4..16], bi)
                    };
                    (inner[at].0[j], inner[at + 1].0[j]) = (x, y);
                }
            }
        }
        let s = Scales::Factored {
            outer,
            inner,
            signed,
        };
        // The kernels' products must be the lanes' values, bit for bit.
        let probe = Int8Panels {
            n,
            k: kb * 32,
            kb,
            qmax: a.qmax,
            zero: a.zero,
            has_min: a.has_min,
            sub: a.sub,
            groups: Vec::new(),
            nibbles: false,
            scales: s,
            wsum128: Vec::new(),
        };
        for at in 0..panels * kb {
            for jj in 0..lpb {
                for c in 0..NR.min(n - (at / kb) * NR) {
                    if probe.scale(at, jj, c).to_bits() != f32[at * lpb + jj].0[c].to_bits() {
                        return None;
                    }
                }
            }
        }
        Some(probe.scales)
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
        BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
        BlockQ8_0, GgmlType,
    };

    fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let x: Vec<f32> = test_data(n * k, 11).iter().map(|v| v * 3.0).collect();
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&x, &mut w);
        w
    }

    /// Every supported type's panels hold exactly the file's weights.
    #[test]
    fn panels_hold_each_types_weights_exactly() {
        let (n, k) = (19, 512);
        let cases = [
            WeightData::Q4_0(quantized::<BlockQ4_0>(n, k)),
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            WeightData::Q5_0(quantized::<BlockQ5_0>(n, k)),
            WeightData::Q5_1(quantized::<BlockQ5_1>(n, k)),
            WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)),
            WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
            WeightData::Q5K(quantized::<BlockQ5K>(n, k)),
            WeightData::Q6K(quantized::<BlockQ6K>(n, k)),
        ];
        for w in &cases {
            let mut p = Int8Panels::pack(w, n, k).unwrap_or_else(|| panic!("{:?}", w.dtype()));
            let file_scales =
                !matches!(w.dtype(), GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K);
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
        let q3k = WeightData::Q3K(quantized::<BlockQ3K>(n, k));
        assert!(Int8Panels::pack(&q3k, n, k).is_none(), "Q3_K is not packed");
    }
}
