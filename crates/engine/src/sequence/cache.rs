//! A sequence's blocks in the prefix cache: the cached prefix it locks at
//! admission, blocks read back from the disk tier that it adopts, and its newly
//! full blocks offered to the cache, all in its scope's trie (its salt).

use super::Sequence;
use crate::prefix_cache::PrefixCache;

impl Sequence {
    /// Takes references on the longest prefix of its tokens that `cache` holds
    /// (leaving at least one token to compute) as its leading blocks, computed and
    /// already offered to the cache; returns the matched token count.
    /// A sequence still scoring its prompt reads nothing from the cache (a cached
    /// prefix has no logits): 0.
    pub fn lock_cached_prefix(&mut self, cache: &mut PrefixCache, block_size: usize) -> usize {
        if self.scores_prompt() || self.pools() {
            return 0;
        }
        let len = self.tokens.len();
        let blocks = cache.match_prefix_salted(self.cache_salt, &self.tokens[..len - 1]);
        cache.lock(&blocks, &mut self.blocks);
        let matched = blocks.len() * block_size;
        self.num_computed = matched;
        self.num_cache_inserted = blocks.len();
        matched
    }

    /// The salt of its prefix-cache trie.
    pub fn cache_salt(&self) -> u64 {
        self.cache_salt
    }

    /// Caches the blocks pushed past its locked prefix (read back from disk:
    /// their KV is written before the next step runs) and counts them computed.
    pub fn adopt_cached_blocks(&mut self, cache: &mut PrefixCache, block_size: usize) {
        let n = self.blocks.len();
        cache.insert_salted(
            self.cache_salt,
            &self.tokens[..n * block_size],
            &mut self.blocks,
        );
        self.num_computed = n * block_size;
        self.num_cache_inserted = n;
    }

    /// Offers its newly full computed blocks to `cache`.
    pub fn cache_full_blocks(&mut self, cache: &mut PrefixCache, block_size: usize) {
        let full = self.num_computed / block_size;
        if full > self.num_cache_inserted {
            cache.insert_salted(
                self.cache_salt,
                &self.tokens[..self.num_computed],
                &mut self.blocks,
            );
            self.num_cache_inserted = full;
        }
    }
}
