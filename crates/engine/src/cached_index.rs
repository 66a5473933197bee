//! What the prefix cache holds, readable from any thread: the chain hashes of its
//! cached blocks. `submit` counts how much of a prompt is already cached with it
//! (admission predicts a request's TTFT from the uncached rest); the engine thread
//! applies the cache's [`CacheChange`]s once per step, under one short lock.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::prefix_cache::{chain_hash, root_hash, CacheChange};

/// The set of cached block hashes (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct CachedIndex {
    blocks: Mutex<HashSet<u64>>,
}

impl CachedIndex {
    /// Applies a step's changes.
    pub fn apply(&self, changes: &[CacheChange]) {
        if changes.is_empty() {
            return;
        }
        let mut set = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        for c in changes {
            match *c {
                CacheChange::Cleared => set.clear(),
                CacheChange::Stored { hash, .. } => {
                    set.insert(hash);
                }
                CacheChange::Removed { hash } => {
                    set.remove(&hash);
                }
                // The disk tier's blocks are counted by its own view (`prefetch.rs`).
                CacheChange::DiskStored { .. } | CacheChange::DiskRemoved { .. } => {}
            }
        }
    }

    /// Tokens of `prompt` the cache of `salt` holds as a prefix of full blocks
    /// (at most all but the last token, which is always computed). A hint: the
    /// cache may change before the request runs.
    pub fn cached_prefix_tokens(&self, salt: u64, prompt: &[u32], block_size: usize) -> usize {
        let usable = prompt.len().saturating_sub(1);
        if block_size == 0 || usable < block_size {
            return 0;
        }
        let mut h = root_hash(salt);
        let hashes: Vec<u64> = prompt[..usable]
            .chunks_exact(block_size)
            .map(|b| {
                h = chain_hash(h, b);
                h
            })
            .collect();
        let set = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        hashes.iter().take_while(|h| set.contains(h)).count() * block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_pool::BlockPool;
    use crate::prefix_cache::PrefixCache;

    #[test]
    fn counts_the_cached_prefix_as_the_cache_changes() {
        let pool = BlockPool::new(8, 4);
        let mut cache = PrefixCache::new(pool.clone());
        let index = CachedIndex::default();
        let prompt: Vec<u32> = (0..13).collect();
        let mut t = pool.new_table();
        for _ in 0..2 {
            t.push_new().unwrap();
        }
        cache.insert_salted(3, &prompt[..8], &mut t);
        let mut log = Vec::new();
        cache.take_changes(&mut log);
        index.apply(&log);
        assert_eq!(index.cached_prefix_tokens(3, &prompt, 4), 8);
        assert_eq!(index.cached_prefix_tokens(0, &prompt, 4), 0, "another salt");
        assert_eq!(
            index.cached_prefix_tokens(3, &prompt[..8], 4),
            4,
            "last token"
        );
        let mut other = prompt.clone();
        other[5] = 99;
        assert_eq!(
            index.cached_prefix_tokens(3, &other, 4),
            4,
            "diverges in block 2"
        );
        drop(t);
        cache.flush();
        log.clear();
        cache.take_changes(&mut log);
        index.apply(&log);
        assert_eq!(index.cached_prefix_tokens(3, &prompt, 4), 0);
        index.apply(&[
            CacheChange::Stored {
                hash: 1,
                parent: 0,
                block: 0,
                salt: 0,
            },
            CacheChange::Cleared,
        ]);
        assert!(index.blocks.lock().unwrap().is_empty());
    }
}
