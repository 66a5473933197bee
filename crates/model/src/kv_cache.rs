//! `KvCache`: the paged key/value memory the runner owns: for each layer, keys and
//! values of `num_blocks x block_size` token slots, addressed through block tables,
//! stored as f32 (exact precision), f16 (fast: half the memory and bandwidth, the
//! element type llama.cpp's cache uses by default), or, asked for with
//! `--kv-cache-type`, llama.cpp's q8_0 or q4_0 blocks (`kv_quant`), quantized as each
//! token's row is written.

use half::f16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;

use crate::kv_quant::{quantize_row, zeroed, BlockQ4_0, BlockQ8_0, QK};

/// Element type of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvDtype {
    /// Bytes one row of `kv_size` values takes (a whole number of blocks for the
    /// quantized types).
    pub fn row_bytes(self, kv_size: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * kv_size,
            KvDtype::F16 => 2 * kv_size,
            KvDtype::Q8_0 => kv_size / QK * std::mem::size_of::<BlockQ8_0>(),
            KvDtype::Q4_0 => kv_size / QK * std::mem::size_of::<BlockQ4_0>(),
        }
    }

    /// Whether rows are blocks of `QK` values (a head dimension must then be a
    /// multiple of `QK`).
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// Values one element of the layer's storage holds (`QK` for a block).
    pub fn values_per_elem(self) -> usize {
        if self.is_quantized() {
            QK
        } else {
            1
        }
    }
}

/// One layer's keys or values, `[num_slots, kv_size]`.
pub enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// `[num_slots, kv_size / QK]` blocks.
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
}

impl KvData {
    fn zeros(dtype: KvDtype, len: usize) -> Self {
        match dtype {
            KvDtype::F32 => KvData::F32(vec![0.0; len]),
            // Zeroed u16s come from the allocator's zeroed pages (`vec![f16::ZERO; n]`
            // would write every one): the pool is resident only as it fills.
            KvDtype::F16 => KvData::F16(vec![0u16; len].reinterpret_into()),
            KvDtype::Q8_0 => KvData::Q8_0(zeroed(len / QK)),
            KvDtype::Q4_0 => KvData::Q4_0(zeroed(len / QK)),
        }
    }

    /// The storage as bytes.
    fn bytes(&self) -> &[u8] {
        // SAFETY: f32, f16 and the `repr(C)` quantized blocks (no padding: their
        // sizes are asserted in `kv_quant`) are plain data: any of their bytes may
        // be read, the slice covers exactly the vector's initialized elements, and
        // u8 has alignment 1.
        unsafe {
            match self {
                KvData::F32(d) => std::slice::from_raw_parts(d.as_ptr().cast(), 4 * d.len()),
                KvData::F16(d) => std::slice::from_raw_parts(d.as_ptr().cast(), 2 * d.len()),
                KvData::Q8_0(d) => std::slice::from_raw_parts(
                    d.as_ptr().cast(),
                    std::mem::size_of_val(d.as_slice()),
                ),
                KvData::Q4_0(d) => std::slice::from_raw_parts(
                    d.as_ptr().cast(),
                    std::mem::size_of_val(d.as_slice()),
                ),
            }
        }
    }

    /// The storage as bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and every bit pattern is a valid f32, f16 or
        // block (an f16 scale and bytes), so any bytes written leave valid values;
        // the borrow is exclusive.
        unsafe {
            match self {
                KvData::F32(d) => {
                    std::slice::from_raw_parts_mut(d.as_mut_ptr().cast(), 4 * d.len())
                }
                KvData::F16(d) => {
                    std::slice::from_raw_parts_mut(d.as_mut_ptr().cast(), 2 * d.len())
                }
                KvData::Q8_0(d) => {
                    let n = std::mem::size_of_val(d.as_slice());
                    std::slice::from_raw_parts_mut(d.as_mut_ptr().cast(), n)
                }
                KvData::Q4_0(d) => {
                    let n = std::mem::size_of_val(d.as_slice());
                    std::slice::from_raw_parts_mut(d.as_mut_ptr().cast(), n)
                }
            }
        }
    }

    /// Writes `src` at value offset `at` (for blocks, a multiple of `QK`, as is
    /// `src.len()`).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvData::F32(d) => d[at..at + src.len()].copy_from_slice(src),
            KvData::F16(d) => d[at..at + src.len()].convert_from_f32_slice(src),
            KvData::Q8_0(d) => quantize_row(&mut d[at / QK..(at + src.len()) / QK], src),
            KvData::Q4_0(d) => quantize_row(&mut d[at / QK..(at + src.len()) / QK], src),
        }
    }
}

pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    /// Values per token slot per layer (`num_kv_heads * head_dim`).
    pub kv_size: usize,
    pub dtype: KvDtype,
    /// Per layer, `[num_slots, kv_size]`.
    pub keys: Vec<KvData>,
    pub values: Vec<KvData>,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        kv_size: usize,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        assert!(
            !dtype.is_quantized() || kv_size.is_multiple_of(QK),
            "{dtype:?} KV rows need whole blocks of {QK}"
        );
        let slots = num_blocks * block_size * kv_size;
        KvCache {
            block_size,
            num_blocks,
            kv_size,
            dtype,
            keys: (0..num_layers)
                .map(|_| KvData::zeros(dtype, slots))
                .collect(),
            values: (0..num_layers)
                .map(|_| KvData::zeros(dtype, slots))
                .collect(),
        }
    }

    /// Number of blocks that fit in `budget_bytes`, given the bytes one token takes.
    pub fn blocks_for_budget(
        budget_bytes: usize,
        bytes_per_token: usize,
        block_size: usize,
    ) -> usize {
        budget_bytes / bytes_per_token.saturating_mul(block_size).max(1)
    }

    #[inline]
    pub fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Bytes of one block's keys and values over all layers, as
    /// [`Self::copy_block_out`] lays them out (per layer: keys, then values).
    pub fn block_bytes(&self) -> usize {
        2 * self.keys.len() * self.block_size * self.dtype.row_bytes(self.kv_size)
    }

    /// Copies block `block`'s keys and values, every layer, into `out`
    /// (`block_bytes` long).
    pub fn copy_block_out(&self, block: usize, out: &mut [u8]) {
        let n = self.block_size * self.dtype.row_bytes(self.kv_size);
        let at = block * n;
        let parts = self.keys.iter().zip(&self.values).flat_map(|(k, v)| [k, v]);
        for (d, o) in parts.zip(out.chunks_exact_mut(n)) {
            o.copy_from_slice(&d.bytes()[at..at + n]);
        }
    }

    /// Writes what [`Self::copy_block_out`] copied into block `block`.
    pub fn copy_block_in(&mut self, block: usize, data: &[u8]) {
        let n = self.block_size * self.dtype.row_bytes(self.kv_size);
        let at = block * n;
        let parts = self
            .keys
            .iter_mut()
            .zip(self.values.iter_mut())
            .flat_map(|(k, v)| [k, v]);
        for (d, src) in parts.zip(data.chunks_exact(n)) {
            d.bytes_mut()[at..at + n].copy_from_slice(src);
        }
    }

    /// Writes one token's keys and values into `slot` of `layer`.
    #[inline]
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * self.kv_size;
        self.keys[layer].write(at, &k[..self.kv_size]);
        self.values[layer].write(at, &v[..self.kv_size]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block copied out of one cache and into another block of a second one
    /// holds the same bytes, for every element type; nothing else changes.
    #[test]
    fn blocks_copy_out_and_in_exactly() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
            let (layers, kv, bs) = (3, 64, 4);
            let mut a = KvCache::new(layers, kv, bs, 4, dtype);
            for layer in 0..layers {
                for slot in 0..4 * bs {
                    let row = |s: f32| -> Vec<f32> {
                        (0..kv)
                            .map(|i| ((i * 7 + slot * 13 + layer) as f32 * s).sin())
                            .collect()
                    };
                    a.write(layer, slot, &row(0.37), &row(-0.11));
                }
            }
            let mut out = vec![0u8; a.block_bytes()];
            assert_eq!(out.len(), 2 * layers * bs * dtype.row_bytes(kv));
            a.copy_block_out(2, &mut out);
            let mut b = KvCache::new(layers, kv, bs, 4, dtype);
            b.copy_block_in(1, &out);
            let n = bs * dtype.row_bytes(kv);
            for layer in 0..layers {
                for (x, y) in [
                    (&a.keys[layer], &b.keys[layer]),
                    (&a.values[layer], &b.values[layer]),
                ] {
                    assert_eq!(&x.bytes()[2 * n..3 * n], &y.bytes()[n..2 * n], "{dtype:?}");
                    assert!(
                        y.bytes()[..n].iter().all(|&v| v == 0),
                        "{dtype:?}: block 0 untouched"
                    );
                    assert!(y.bytes()[2 * n..].iter().all(|&v| v == 0), "{dtype:?}");
                }
            }
        }
    }
}
