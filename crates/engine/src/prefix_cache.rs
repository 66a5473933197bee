//! The radix prefix cache at block granularity: a trie whose edges are full blocks of
//! token ids and whose nodes own the KV block holding them. A new sequence reuses the
//! longest cached prefix of its tokens and prefills only the rest.
//!
//! Interface (mini-sglang style): [`PrefixCache::match_prefix`],
//! [`PrefixCache::insert`], [`PrefixCache::lock`] / [`PrefixCache::unlock`] (the
//! reference counts live in the [`BlockPool`]: a block table holding a block locks it),
//! [`PrefixCache::evict`] and [`PrefixCache::size`], plus [`PrefixCache::flush`].
//!
//! A salt (vLLM's `cache_salt`, or the API key's scope) picks one of several
//! tries: blocks cached under one salt are never reachable with another; salt 0
//! is the shared trie. A salted trie's root goes when its last block does.
//!
//! Each cached block has a chain hash (its tokens, its parent's hash, the salt at
//! the root: [`chain_hash`]); what was stored and removed is logged as
//! [`CacheChange`]s, drained once per step ([`PrefixCache::take_changes`]) into the
//! index other threads read (`cached_index.rs`).
//!
//! Eviction is least-recently-used among leaves no sequence holds, and happens only
//! when the pool runs out of free blocks. Candidates sit in a lazily validated
//! min-heap keyed by last access, fed by the pool's "became idle" notifications, so
//! an eviction costs O(log n) amortized rather than a scan.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::block_pool::{BlockPool, BlockTable};

const NONE: u32 = u32::MAX;
const ROOT: u32 = 0;

struct Node {
    parent: u32,
    block: u32,
    /// The block's tokens (the edge label from the parent).
    key: Box<[u32]>,
    children: HashMap<Box<[u32]>, u32>,
    last_access: u64,
    alive: bool,
    /// The salt of a root node (roots have no parent and no block).
    salt: u64,
    /// Chain hash: the root's is [`root_hash`] of its salt, a block's
    /// [`chain_hash`] of its parent's and its tokens.
    hash: u64,
}

/// What changed in the cache since the last [`PrefixCache::take_changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheChange {
    /// The cache is new and empty (engine start or restart).
    Cleared,
    /// A block was cached: its chain hash and its parent's, the KV block holding
    /// it and the salt of its trie.
    Stored {
        hash: u64,
        parent: u64,
        block: u32,
        salt: u64,
    },
    /// A cached block was evicted.
    Removed { hash: u64 },
    /// The disk tier (`crate::disk_tier`) wrote a block (or found it at start):
    /// its chain hash, its parent's and the salt of its trie.
    DiskStored { hash: u64, parent: u64, salt: u64 },
    /// The disk tier deleted a block's file (its size limit, or a damaged file).
    DiskRemoved { hash: u64 },
}

/// The chain hash of the root of `salt`'s trie.
pub fn root_hash(salt: u64) -> u64 {
    mix(0x9e37_79b9_7f4a_7c15 ^ salt)
}

/// The chain hash of a full block of `tokens` under a parent of hash `parent`.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = mix(parent ^ 0x5851_f42d_4c95_7f2d);
    for &t in tokens {
        h = mix(h ^ t as u64);
    }
    h
}

/// A 64-bit finalizer (splitmix64): every input bit reaches every output bit.
#[inline]
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The radix prefix cache. See the module docs.
pub struct PrefixCache {
    pool: BlockPool,
    block_size: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    /// Salt -> root of its trie (salt 0: `ROOT`, always there).
    roots: HashMap<u64, u32>,
    /// Block id -> node caching it (NONE if not cached).
    block_node: Vec<u32>,
    /// Eviction candidates: (last access when pushed, node), oldest first.
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    idle_buf: Vec<u32>,
    tick: u64,
    num_cached: usize,
    /// Stored and removed blocks since the last `take_changes`.
    changes: Vec<CacheChange>,
    /// The token ids of each `Stored` in `changes`, `block_size` apiece.
    stored_tokens: Vec<u32>,
}

impl PrefixCache {
    pub fn new(pool: BlockPool) -> Self {
        let root = Node {
            parent: NONE,
            block: NONE,
            key: Box::new([]),
            children: HashMap::new(),
            last_access: 0,
            alive: true,
            salt: 0,
            hash: root_hash(0),
        };
        PrefixCache {
            roots: HashMap::from([(0, ROOT)]),
            block_size: pool.block_size(),
            block_node: vec![NONE; pool.num_blocks()],
            pool,
            nodes: vec![root],
            free_nodes: Vec::new(),
            heap: BinaryHeap::new(),
            idle_buf: Vec::new(),
            tick: 0,
            num_cached: 0,
            changes: vec![CacheChange::Cleared],
            stored_tokens: Vec::new(),
        }
    }

    /// Moves the changes since the last call into `out` (appended).
    pub fn take_changes(&mut self, out: &mut Vec<CacheChange>) {
        out.append(&mut self.changes);
    }

    /// Moves the token ids of the blocks stored since the last call into `out`
    /// (`block_size` per `Stored` change, in order; the disk tier's
    /// `DiskStored` changes, appended after them, carry theirs likewise). A caller that reads only
    /// [`take_changes`](Self::take_changes) need not call it: a full block's ids
    /// are copied per stored block, and the buffer is kept in step by the engine.
    pub fn take_stored_tokens(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.stored_tokens);
    }

    /// The chain hash of the block KV block `block` caches (`None`: not cached).
    pub fn hash_of(&self, block: u32) -> Option<u64> {
        match self.block_node.get(block as usize) {
            Some(&n) if n != NONE => Some(self.nodes[n as usize].hash),
            _ => None,
        }
    }

    /// Number of cached blocks.
    pub fn size(&self) -> usize {
        self.num_cached
    }

    /// The cached blocks holding the longest prefix of `tokens` made of full blocks,
    /// in order; marks them recently used. (To leave a token to compute, pass all but
    /// the last token.)
    pub fn match_prefix(&mut self, tokens: &[u32]) -> Vec<u32> {
        self.match_prefix_salted(0, tokens)
    }

    /// `match_prefix` in the trie of `salt`.
    pub fn match_prefix_salted(&mut self, salt: u64, tokens: &[u32]) -> Vec<u32> {
        self.tick += 1;
        self.absorb_idle();
        let mut out = Vec::new();
        let Some(&root) = self.roots.get(&salt) else {
            return out;
        };
        let mut node = root;
        for chunk in tokens.chunks_exact(self.block_size) {
            let Some(&child) = self.nodes[node as usize].children.get(chunk) else {
                break;
            };
            node = child;
            self.nodes[node as usize].last_access = self.tick;
            out.push(self.nodes[node as usize].block);
        }
        out
    }

    /// Takes a reference on each of `blocks` (from `match_prefix`) into `table`.
    pub fn lock(&self, blocks: &[u32], table: &mut BlockTable) {
        for &id in blocks {
            table.push_shared(id);
        }
    }

    /// Drops the table's references (what dropping the table does too).
    pub fn unlock(&self, table: &mut BlockTable) {
        table.clear();
    }

    /// Caches the full blocks of a sequence whose KV is computed: `tokens` are its
    /// tokens with KV (at least `table.len()` full blocks' worth is not required; only
    /// full blocks covered by both are inserted). A block whose prefix is already
    /// cached under another block id is deduplicated: the table switches to the
    /// cached block and its private copy is freed. Returns the number of new blocks
    /// cached.
    pub fn insert(&mut self, tokens: &[u32], table: &mut BlockTable) -> usize {
        self.insert_salted(0, tokens, table)
    }

    /// `insert` into the trie of `salt` (created on first use).
    pub fn insert_salted(&mut self, salt: u64, tokens: &[u32], table: &mut BlockTable) -> usize {
        self.tick += 1;
        self.absorb_idle();
        let n = table.len().min(tokens.len() / self.block_size);
        if n == 0 {
            return 0;
        }
        let mut node = match self.roots.get(&salt) {
            Some(&r) => r,
            None => {
                let r = self.new_node(NONE, NONE, &[]);
                self.nodes[r as usize].salt = salt;
                self.nodes[r as usize].hash = root_hash(salt);
                self.roots.insert(salt, r);
                r
            }
        };
        let mut added = 0;
        for i in 0..n {
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let block = table.ids()[i];
            if let Some(&child) = self.nodes[node as usize].children.get(chunk) {
                node = child;
                self.nodes[node as usize].last_access = self.tick;
                let cached = self.nodes[node as usize].block;
                if cached != block {
                    table.replace_with_shared(i, cached);
                }
                continue;
            }
            if self.pool.is_cached(block) {
                // Cannot happen while tables hold whole cached paths; stay safe.
                debug_assert!(false, "block {block} cached under another prefix");
                break;
            }
            let id = self.new_node(node, block, chunk);
            let parent = self.nodes[node as usize].hash;
            let hash = chain_hash(parent, chunk);
            self.nodes[id as usize].hash = hash;
            self.changes.push(CacheChange::Stored {
                hash,
                parent,
                block,
                salt,
            });
            self.stored_tokens.extend_from_slice(chunk);
            self.nodes[node as usize].children.insert(chunk.into(), id);
            self.pool.mark_cached(block);
            self.block_node[block as usize] = id;
            self.num_cached += 1;
            self.heap.push(Reverse((self.tick, id)));
            added += 1;
            node = id;
        }
        added
    }

    /// Evicts up to `n` least-recently-used idle leaf blocks to the free list; returns
    /// how many were evicted.
    pub fn evict(&mut self, n: usize) -> usize {
        self.absorb_idle();
        let mut evicted = 0;
        let mut rebuilt = false;
        while evicted < n {
            let Some(Reverse((stamp, id))) = self.heap.pop() else {
                if rebuilt || self.pool.num_cached_idle() == 0 {
                    break;
                }
                self.rebuild_heap();
                rebuilt = true;
                continue;
            };
            if !self.is_evictable(id) {
                continue; // re-pushed when it becomes idle or a leaf again
            }
            let last = self.nodes[id as usize].last_access;
            if last != stamp {
                self.heap.push(Reverse((last, id)));
                continue;
            }
            let parent = self.remove_leaf(id);
            evicted += 1;
            if self.is_evictable(parent) {
                let last = self.nodes[parent as usize].last_access;
                self.heap.push(Reverse((last, parent)));
            }
        }
        evicted
    }

    /// Evicts everything no sequence holds; returns how many blocks were evicted.
    pub fn flush(&mut self) -> usize {
        self.evict(usize::MAX)
    }

    /// Checks the trie against the pool: every node's block is marked cached and maps
    /// back to it, children link to their parents, and the counts agree.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut alive = 0;
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if !n.alive || n.parent == NONE {
                continue;
            }
            alive += 1;
            if !self.pool.is_cached(n.block) || self.block_node[n.block as usize] != i as u32 {
                return Err(format!("node {i}: block {} not mapped as cached", n.block));
            }
            let p = &self.nodes[n.parent as usize];
            if !p.alive || p.children.get(&n.key) != Some(&(i as u32)) {
                return Err(format!("node {i}: parent link broken"));
            }
            if n.key.len() != self.block_size {
                return Err(format!("node {i}: key of {} tokens", n.key.len()));
            }
        }
        if alive != self.num_cached {
            return Err(format!("{alive} live nodes but size {}", self.num_cached));
        }
        for (b, &node) in self.block_node.iter().enumerate() {
            if (node != NONE) != self.pool.is_cached(b as u32) {
                return Err(format!("block {b}: cache map and pool disagree"));
            }
        }
        Ok(())
    }

    fn new_node(&mut self, parent: u32, block: u32, key: &[u32]) -> u32 {
        let node = Node {
            parent,
            block,
            key: key.into(),
            children: HashMap::new(),
            last_access: self.tick,
            alive: true,
            salt: 0,
            hash: 0,
        };
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn is_evictable(&self, id: u32) -> bool {
        let n = &self.nodes[id as usize];
        n.parent != NONE && n.alive && n.children.is_empty() && self.pool.ref_count(n.block) == 0
    }

    /// Removes an evictable leaf; returns its parent.
    fn remove_leaf(&mut self, id: u32) -> u32 {
        let n = &mut self.nodes[id as usize];
        n.alive = false;
        let (parent, block) = (n.parent, n.block);
        self.changes.push(CacheChange::Removed { hash: n.hash });
        let key = std::mem::take(&mut n.key);
        self.nodes[parent as usize].children.remove(&key);
        self.pool.evict(block);
        self.block_node[block as usize] = NONE;
        self.num_cached -= 1;
        self.free_nodes.push(id);
        let p = &mut self.nodes[parent as usize];
        if parent != ROOT && p.parent == NONE && p.children.is_empty() {
            // A salted trie's last block: its root goes too.
            p.alive = false;
            let salt = p.salt;
            self.roots.remove(&salt);
            self.free_nodes.push(parent);
        }
        parent
    }

    /// Turns the pool's "became idle" notifications into heap candidates; rebuilds
    /// the heap when stale entries pile up.
    fn absorb_idle(&mut self) {
        self.pool.take_newly_idle(&mut self.idle_buf);
        for i in 0..self.idle_buf.len() {
            let node = self.block_node[self.idle_buf[i] as usize];
            if node != NONE {
                let last = self.nodes[node as usize].last_access;
                self.heap.push(Reverse((last, node)));
            }
        }
        self.idle_buf.clear();
        if self.heap.len() > 4 * self.num_cached + 1024 {
            self.rebuild_heap();
        }
    }

    fn rebuild_heap(&mut self) {
        self.heap.clear();
        for id in 1..self.nodes.len() as u32 {
            if self.is_evictable(id) {
                self.heap
                    .push(Reverse((self.nodes[id as usize].last_access, id)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(pool: &BlockPool, cache: &mut PrefixCache, tokens: &[u32]) -> BlockTable {
        let mut t = pool.new_table();
        for _ in 0..pool.blocks_for(tokens.len()) {
            t.push_new().unwrap();
        }
        cache.insert(tokens, &mut t);
        t
    }

    #[test]
    fn reuses_longest_prefix_of_full_blocks() {
        let pool = BlockPool::new(8, 2);
        let mut cache = PrefixCache::new(pool.clone());
        let a = seq(&pool, &mut cache, &[1, 2, 3, 4, 5]);
        assert_eq!(cache.size(), 2);
        assert_eq!(
            cache.match_prefix(&[1, 2, 3, 4, 5, 6]),
            a.ids()[..2].to_vec()
        );
        assert_eq!(cache.match_prefix(&[1, 2, 3, 9]), a.ids()[..1].to_vec());
        assert!(cache.match_prefix(&[2, 2]).is_empty());
        drop(a);
        assert_eq!(pool.num_cached_idle(), 2);
        assert_eq!(cache.flush(), 2);
        assert_eq!(pool.num_free(), 8);
        cache.check_invariants().unwrap();
    }

    #[test]
    fn evicts_least_recently_used_leaf_only_when_idle() {
        let pool = BlockPool::new(8, 2);
        let mut cache = PrefixCache::new(pool.clone());
        drop(seq(&pool, &mut cache, &[1, 1, 2, 2]));
        drop(seq(&pool, &mut cache, &[3, 3, 4, 4]));
        let held = seq(&pool, &mut cache, &[5, 5]);
        cache.match_prefix(&[1, 1, 2, 2]); // touch: [3,3,4,4] is now the LRU
        assert_eq!(cache.evict(1), 1);
        assert_eq!(cache.match_prefix(&[3, 3, 4, 4]).len(), 1);
        assert_eq!(cache.match_prefix(&[1, 1, 2, 2]).len(), 2);
        assert_eq!(cache.flush(), 3);
        assert_eq!(cache.size(), 1); // [5, 5] is held
        drop(held);
        assert_eq!(cache.flush(), 1);
        pool.check_invariants().unwrap();
        cache.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_blocks_are_deduplicated_on_insert() {
        let pool = BlockPool::new(8, 2);
        let mut cache = PrefixCache::new(pool.clone());
        let a = seq(&pool, &mut cache, &[1, 2, 3, 4]);
        let b = seq(&pool, &mut cache, &[1, 2, 3, 4, 7]);
        assert_eq!(a.ids(), &b.ids()[..2]);
        assert_eq!(pool.ref_count(a.ids()[0]), 2);
        assert_eq!(pool.num_used(), 3);
        let mut c = pool.new_table();
        let m = cache.match_prefix(&[1, 2, 3]);
        cache.lock(&m, &mut c);
        assert_eq!(pool.ref_count(m[0]), 3);
        cache.unlock(&mut c);
        assert_eq!(pool.ref_count(m[0]), 2);
        pool.check_invariants().unwrap();
        cache.check_invariants().unwrap();
    }

    #[test]
    fn changes_log_chain_hashes_of_stored_and_removed_blocks() {
        let pool = BlockPool::new(8, 2);
        let mut cache = PrefixCache::new(pool.clone());
        let mut log = Vec::new();
        cache.take_changes(&mut log);
        assert_eq!(log, vec![CacheChange::Cleared]);
        let a = seq(&pool, &mut cache, &[1, 2, 3, 4]);
        let mut t = pool.new_table();
        t.push_new().unwrap();
        cache.insert_salted(9, &[1, 2], &mut t);
        log.clear();
        cache.take_changes(&mut log);
        let h1 = chain_hash(root_hash(0), &[1, 2]);
        let h2 = chain_hash(h1, &[3, 4]);
        let s1 = chain_hash(root_hash(9), &[1, 2]);
        assert_eq!(
            log,
            vec![
                CacheChange::Stored {
                    hash: h1,
                    parent: root_hash(0),
                    block: a.ids()[0],
                    salt: 0,
                },
                CacheChange::Stored {
                    hash: h2,
                    parent: h1,
                    block: a.ids()[1],
                    salt: 0,
                },
                CacheChange::Stored {
                    hash: s1,
                    parent: root_hash(9),
                    block: t.ids()[0],
                    salt: 9,
                },
            ]
        );
        assert!(h1 != s1 && h1 != h2, "salt and position change the hash");
        // Each stored block's token ids, in the order of the `Stored` changes.
        let mut tokens = Vec::new();
        cache.take_stored_tokens(&mut tokens);
        assert_eq!(tokens, vec![1, 2, 3, 4, 1, 2]);
        // A second copy of the same tokens is deduplicated: nothing new.
        let b = seq(&pool, &mut cache, &[1, 2, 3, 4]);
        log.clear();
        cache.take_changes(&mut log);
        assert!(log.is_empty(), "{log:?}");
        tokens.clear();
        cache.take_stored_tokens(&mut tokens);
        assert!(tokens.is_empty());
        drop((a, b, t));
        assert_eq!(cache.flush(), 3);
        cache.take_changes(&mut log);
        let mut removed: Vec<u64> = log
            .iter()
            .filter_map(|c| match c {
                CacheChange::Removed { hash } => Some(*hash),
                _ => None,
            })
            .collect();
        removed.sort_unstable();
        let mut want = vec![h1, h2, s1];
        want.sort_unstable();
        assert_eq!(removed, want);
    }

    #[test]
    fn salts_isolate_tries() {
        let pool = BlockPool::new(8, 2);
        let mut cache = PrefixCache::new(pool.clone());
        let mut t = pool.new_table();
        for _ in 0..2 {
            t.push_new().unwrap();
        }
        assert_eq!(cache.insert_salted(7, &[1, 2, 3, 4], &mut t), 2);
        assert!(cache.match_prefix(&[1, 2, 3, 4, 5]).is_empty());
        assert!(cache.match_prefix_salted(8, &[1, 2, 3, 4, 5]).is_empty());
        assert_eq!(
            cache.match_prefix_salted(7, &[1, 2, 3, 4, 5]),
            t.ids().to_vec()
        );
        // The same tokens unsalted are a separate copy.
        let b = seq(&pool, &mut cache, &[1, 2, 3, 4]);
        assert_ne!(b.ids(), t.ids());
        assert_eq!(cache.size(), 4);
        cache.check_invariants().unwrap();
        drop(t);
        drop(b);
        assert_eq!(cache.flush(), 4);
        assert_eq!(pool.num_free(), 8);
        assert!(cache.match_prefix_salted(7, &[1, 2, 3, 4, 5]).is_empty());
        // The salted root went with its last block; a new insert recreates it.
        assert_eq!(cache.roots.len(), 1);
        drop(seq(&pool, &mut cache, &[1, 2]));
        cache.check_invariants().unwrap();
    }
}
