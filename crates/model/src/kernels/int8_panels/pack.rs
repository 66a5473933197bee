//! Packing `Int8Panels` from a file's blocks: a whole matrix, or its rows a chunk
//! at a time (the loader's way, so the whole matrix is never held beside its
//! panels), values as bytes or nibbles, and each type's scales in their one form.

use std::ops::Range;

use candle_core::quantized::GgmlDType;
use half::f16;

use super::{
    put_column, vectors_per_block_of, ByteLanes, Group, HalfLanes, Int8Panels, Lanes, Packing,
    Scales, NR,
};
use crate::kernels::block_scales::Affine;
use crate::kernels::block_values::stored_values;
use crate::weights::WeightData;

impl Int8Panels {
    /// Re-lays a row-major `[n, k]` matrix; `None` for a type whose blocks are not
    /// `d·q + m` with one `(d, m)` per 32 weights (per 16 for Q2_K, Q3_K, Q6_K).
    pub fn pack(w: &WeightData, n: usize, k: usize) -> Option<Self> {
        Self::pack_as(w, n, k, Packing::Bytes)
    }

    /// `pack`, values as `packing` takes the type (what `repack` gives, without the
    /// one-byte groups in between).
    pub fn pack_as(w: &WeightData, n: usize, k: usize, packing: Packing) -> Option<Self> {
        let (a, kb) = Self::layout(w.dtype(), k)?;
        let gpb = vectors_per_block_of(packing, a.qmax);
        let mut groups = vec![Group([0; 64]); n.div_ceil(NR) * kb * gpb];
        let part = Part::pack(&a, w.dtype(), w.as_bytes(), (n, kb), &mut groups);
        Some(Self::assemble(&a, n, k, groups, part))
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
        packing: Packing,
        chunk: usize,
        mut read: impl FnMut(Range<usize>, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Option<Self>, E> {
        let Some((a, kb)) = Self::layout(dtype, k) else {
            return Ok(None);
        };
        // Whole panels a chunk, so each part's `[panel]` arrays append in order.
        let chunk = chunk.max(1).next_multiple_of(NR);
        let gpb = vectors_per_block_of(packing, a.qmax);
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
        let high = nibbles && a.qmax > 15;
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
            high,
            scales: part.scales,
        }
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
                        put_column(&vals, j, block);
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::{every_type, quantized};
    use super::*;
    use candle_core::quantized::k_quants::BlockQ4K;
    use GgmlDType as D;

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
        let packings = [Packing::Bytes, Packing::Nibbles, Packing::Planes];
        for (w, packing) in cases.iter().flat_map(|w| packings.map(|p| (w, p))) {
            let mut whole = Int8Panels::pack(w, n, k).unwrap();
            whole.repack(packing);
            let bytes = w.as_bytes();
            let row = bytes.len() / n;
            let direct = Int8Panels::pack_as(w, n, k, packing).unwrap();
            assert_eq!(direct.nibbles, whole.nibbles, "{:?}", w.dtype());
            assert_eq!(direct.high, whole.high, "{:?}", w.dtype());
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
                let p = Int8Panels::pack_chunks(w.dtype(), (n, k), packing, chunk, read)
                    .unwrap()
                    .unwrap();
                let what = format!("{:?} chunk {chunk} {packing:?}", w.dtype());
                assert_eq!(p.nibbles, whole.nibbles, "{what}");
                assert_eq!(p.high, whole.high, "{what}");
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
        let r = Int8Panels::pack_chunks(w.dtype(), (n, k), Packing::Nibbles, 16, read);
        assert_eq!(r.err(), Some("truncated"));
    }
}
