//! `KvCache`: the paged key/value memory the runner owns: for each layer, keys and
//! values of `num_blocks x block_size` token slots, addressed through block tables.

pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    /// Values per token slot per layer (`num_kv_heads * head_dim`).
    pub kv_size: usize,
    /// Per layer, `[num_slots, kv_size]`.
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(num_layers: usize, kv_size: usize, block_size: usize, num_blocks: usize) -> Self {
        let slots = num_blocks * block_size * kv_size;
        KvCache {
            block_size,
            num_blocks,
            kv_size,
            keys: (0..num_layers).map(|_| vec![0f32; slots]).collect(),
            values: (0..num_layers).map(|_| vec![0f32; slots]).collect(),
        }
    }

    /// Number of blocks that fit in `budget_bytes`, given the bytes one token takes.
    pub fn blocks_for_budget(
        budget_bytes: usize,
        bytes_per_token: usize,
        block_size: usize,
    ) -> usize {
        budget_bytes / (bytes_per_token * block_size).max(1)
    }

    #[inline]
    pub fn slot(&self, block_table: &[u32], pos: usize) -> usize {
        block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Writes one token's keys and values into `slot` of `layer`.
    #[inline]
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * self.kv_size;
        self.keys[layer][at..at + self.kv_size].copy_from_slice(k);
        self.values[layer][at..at + self.kv_size].copy_from_slice(v);
    }
}
