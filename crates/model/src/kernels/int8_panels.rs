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
//! Other types (Q6_K, Q2_K, Q3_K: two scales per 32 weights) are not representable:
//! `pack` returns `None` and the caller keeps its f32 route.
//!
//! 4-bit types may keep their values as nibbles (`to_nibbles`): groups `g` and
//! `g + 4` of a block share one 64-byte vector (low and high halves of each byte),
//! so a row reads the file's 0.625 bytes per weight (Q4_1: 0.5 of values, 0.125 of
//! f16 scale and minimum) instead of 1.25: what a matrix-vector product at one row
//! is bound by.

use candle_core::quantized::GgmlDType;
use half::f16;

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
/// the bytes it reads: f32 scales and minimums are a third of a 4-bit panel's.
pub enum Scales {
    F16(Vec<HalfLanes>),
    F32(Vec<Lanes>),
}

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
}

/// How one type's 32-weight blocks map to `d·(q - zero) + m`.
struct Affine {
    qmax: u8,
    zero: i32,
    has_min: bool,
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
            layout: Layout::Simple { size, min },
        };
        let k_quant = |size, qmax| Affine {
            qmax,
            zero: 0,
            has_min: true,
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
            _ => return None,
        })
    }

    /// `(d, m)` of 32-weight block `b` of the tensor (in element order).
    fn dm(&self, bytes: &[u8], b: usize) -> (f32, f32) {
        match self.layout {
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
    /// `d·q + m` with one `(d, m)` per 32 weights, or if any weight disagrees with
    /// its recovered `q` (never for a well-formed file).
    pub fn pack(w: &WeightData, n: usize, k: usize) -> Option<Self> {
        let a = Affine::of(w.dtype())?;
        if !k.is_multiple_of(256) && matches!(w.dtype(), GgmlDType::Q4K | GgmlDType::Q5K) {
            return None;
        }
        let kb = k / 32;
        let panels = n.div_ceil(NR);
        let bytes = w.as_bytes();
        let mut groups = vec![Group([0; 64]); panels * kb * 8];
        let per = if a.has_min { 2 } else { 1 };
        let mut scales = vec![Lanes([0.0; NR]); panels * kb * per];
        let mut row = vec![0f32; k];
        for c in 0..n {
            w.dequantize_rows(c, k, &mut row);
            let (p, j) = (c / NR, c % NR);
            for b in 0..kb {
                let (d, m) = a.dm(bytes, c * kb + b);
                let at = p * kb + b;
                scales[at * per].0[j] = d;
                if a.has_min {
                    scales[at * per + 1].0[j] = m;
                } else if m != 0.0 {
                    return None;
                }
                for (i, &v) in row[b * 32..][..32].iter().enumerate() {
                    let q = if d == 0.0 { 0.0 } else { ((v - m) / d).round() };
                    let stored = q + a.zero as f32;
                    let off = (d * q + m - v).abs();
                    if !(0.0..=a.qmax as f32).contains(&stored) || off > 1e-6 * v.abs() + 1e-30 {
                        return None;
                    }
                    groups[at * 8 + i / 4].0[j * 4 + i % 4] = stored as u8;
                }
            }
        }
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
            groups,
            nibbles: false,
            scales: Scales::narrowed(scales),
        })
    }

    /// Scale rows per block: 2 with minimums, else 1.
    pub fn lanes_per_block(&self) -> usize {
        if self.has_min {
            2
        } else {
            1
        }
    }

    /// Scale (`j` 0) or minimum (`j` 1) of column `c % NR` at lane row `at` (tests).
    #[cfg(test)]
    fn scale(&self, at: usize, j: usize, c: usize) -> f32 {
        if j == 1 && !self.has_min {
            return 0.0;
        }
        let i = at * self.lanes_per_block() + j;
        match &self.scales {
            Scales::F16(s) => f16::from_bits(s[i].0[c % NR]).to_f32(),
            Scales::F32(s) => s[i].0[c % NR],
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
        self.groups = self
            .groups
            .chunks_exact(8)
            .flat_map(|block| {
                (0..4).map(move |g| {
                    let (lo, hi) = (&block[g].0, &block[g + 4].0);
                    Group(std::array::from_fn(|x| lo[x] | hi[x] << 4))
                })
            })
            .collect();
        self.nibbles = true;
        true
    }

    /// Weight `(c, i)` as the panels hold it (tests).
    #[cfg(test)]
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
        self.scale(at, 0, j) * q as f32 + self.scale(at, 1, j)
    }
}

impl Scales {
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
        BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
        GgmlType,
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
        ];
        for w in &cases {
            let mut p = Int8Panels::pack(w, n, k).unwrap_or_else(|| panic!("{:?}", w.dtype()));
            let file_scales = !matches!(w.dtype(), GgmlDType::Q4K | GgmlDType::Q5K);
            assert!(
                !file_scales || p.scales.is_half(),
                "{:?}: the file's f16 scales",
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
        let q6k = WeightData::Q6K(quantized::<BlockQ6K>(n, k));
        assert!(
            Int8Panels::pack(&q6k, n, k).is_none(),
            "two scales per block"
        );
    }
}
