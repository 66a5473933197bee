//! The paged KV block pool: which of the runner's KV blocks are free, owned by
//! sequences (reference-counted) or idle in the prefix cache, and the per-sequence
//! `BlockTable` whose `Drop` gives its blocks back, so blocks cannot leak.
//!
//! Every block is in exactly one of three states:
//! - **free**: on the free list, ref count 0, not cached;
//! - **owned**: ref count >= 1 (held by that many block tables), maybe also cached;
//! - **cached idle**: in the prefix cache with ref count 0 (evictable).
//!
//! A block is writable only while its single owner is filling it (ref count 1, not
//! cached); only full blocks enter the cache and only cached blocks are shared, so a
//! shared block is never written.
//!
//! The pool lives on the engine thread: handles are `Rc`-shared, not `Send`.

use std::cell::RefCell;
use std::rc::Rc;

struct PoolInner {
    block_size: usize,
    ref_count: Vec<u32>,
    cached: Vec<bool>,
    /// Free blocks, used as a stack (recently freed blocks are reused first).
    free: Vec<u32>,
    num_cached_idle: usize,
    /// Cached blocks whose ref count dropped to 0 since the prefix cache last looked
    /// (so it can find new eviction candidates without scanning).
    newly_idle: Vec<u32>,
}

impl PoolInner {
    fn release(&mut self, id: u32) {
        let rc = &mut self.ref_count[id as usize];
        assert!(*rc > 0, "double free of KV block {id}");
        *rc -= 1;
        if *rc == 0 {
            if self.cached[id as usize] {
                self.num_cached_idle += 1;
                self.newly_idle.push(id);
            } else {
                self.free.push(id);
            }
        }
    }
}

/// Cheap-to-clone handle to the block pool.
#[derive(Clone)]
pub struct BlockPool {
    inner: Rc<RefCell<PoolInner>>,
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be > 0");
        assert!(num_blocks <= u32::MAX as usize, "too many KV blocks");
        BlockPool {
            inner: Rc::new(RefCell::new(PoolInner {
                block_size,
                ref_count: vec![0; num_blocks],
                cached: vec![false; num_blocks],
                // Reversed so that block 0 is handed out first.
                free: (0..num_blocks as u32).rev().collect(),
                num_cached_idle: 0,
                newly_idle: Vec::new(),
            })),
        }
    }

    /// A new, empty block table drawing from this pool.
    pub fn new_table(&self) -> BlockTable {
        BlockTable {
            pool: self.clone(),
            ids: Vec::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.inner.borrow().block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.inner.borrow().ref_count.len()
    }
    /// Blocks allocatable right now without evicting anything.
    pub fn num_free(&self) -> usize {
        self.inner.borrow().free.len()
    }
    /// Cached blocks no sequence holds (reclaimable by evicting from the cache).
    pub fn num_cached_idle(&self) -> usize {
        self.inner.borrow().num_cached_idle
    }
    /// Blocks held by at least one sequence.
    pub fn num_used(&self) -> usize {
        let p = self.inner.borrow();
        p.ref_count.len() - p.free.len() - p.num_cached_idle
    }
    /// Blocks needed to hold `num_tokens` tokens.
    #[inline]
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }
    pub fn ref_count(&self, id: u32) -> u32 {
        self.inner.borrow().ref_count[id as usize]
    }
    pub fn is_cached(&self, id: u32) -> bool {
        self.inner.borrow().cached[id as usize]
    }

    /// Marks an owned, full block as held by the prefix cache (it will become cached
    /// idle instead of free when its last owner releases it).
    pub(crate) fn mark_cached(&self, id: u32) {
        let mut p = self.inner.borrow_mut();
        assert!(!p.cached[id as usize], "block {id} cached twice");
        assert!(p.ref_count[id as usize] > 0, "caching unowned block {id}");
        p.cached[id as usize] = true;
    }

    /// Takes a cached idle block out of the cache onto the free list.
    pub(crate) fn evict(&self, id: u32) {
        let mut p = self.inner.borrow_mut();
        assert!(p.cached[id as usize], "evicting uncached block {id}");
        assert_eq!(p.ref_count[id as usize], 0, "evicting block {id} in use");
        p.cached[id as usize] = false;
        p.num_cached_idle -= 1;
        p.free.push(id);
    }

    /// Cached blocks that became idle since the last call.
    pub(crate) fn take_newly_idle(&self, out: &mut Vec<u32>) {
        let mut p = self.inner.borrow_mut();
        out.append(&mut p.newly_idle);
    }

    /// Checks the pool's own bookkeeping: the free list holds distinct, unowned,
    /// uncached blocks, the idle count matches, and free + cached idle + used ==
    /// total. (Ref counts against tables are checked by the tests that own them.)
    pub fn check_invariants(&self) -> Result<(), String> {
        let p = self.inner.borrow();
        let n = p.ref_count.len();
        let mut on_free = vec![false; n];
        for &id in &p.free {
            let i = id as usize;
            if i >= n {
                return Err(format!("free list holds bad id {id}"));
            }
            if on_free[i] {
                return Err(format!("block {id} twice on the free list"));
            }
            on_free[i] = true;
            if p.ref_count[i] != 0 || p.cached[i] {
                return Err(format!("free block {id} is owned or cached"));
            }
        }
        let mut idle = 0;
        let mut used = 0;
        for (i, &free) in on_free.iter().enumerate() {
            if free {
                continue;
            }
            match (p.ref_count[i], p.cached[i]) {
                (0, true) => idle += 1,
                (0, false) => return Err(format!("block {i} leaked: unowned, uncached, not free")),
                _ => used += 1,
            }
        }
        if idle != p.num_cached_idle {
            return Err(format!(
                "cached idle count {} != actual {idle}",
                p.num_cached_idle
            ));
        }
        if p.free.len() + idle + used != n {
            return Err("free + cached idle + used != total".into());
        }
        Ok(())
    }
}

/// The blocks of one sequence, in order (block `i` holds positions
/// `i * block_size .. (i + 1) * block_size`). Each entry holds one reference; they
/// are released by `clear` or when the table is dropped.
pub struct BlockTable {
    pool: BlockPool,
    ids: Vec<u32>,
}

impl BlockTable {
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Appends a fresh block from the free list (`None` if it is empty: evict from
    /// the prefix cache or preempt first).
    pub fn push_new(&mut self) -> Option<u32> {
        let mut p = self.pool.inner.borrow_mut();
        let id = p.free.pop()?;
        debug_assert!(p.ref_count[id as usize] == 0 && !p.cached[id as usize]);
        p.ref_count[id as usize] = 1;
        drop(p);
        self.ids.push(id);
        Some(id)
    }

    /// Appends a shared reference to a cached (full, read-only) block.
    pub fn push_shared(&mut self, id: u32) {
        let mut p = self.pool.inner.borrow_mut();
        assert!(p.cached[id as usize], "sharing uncached block {id}");
        if p.ref_count[id as usize] == 0 {
            p.num_cached_idle -= 1;
        }
        p.ref_count[id as usize] += 1;
        drop(p);
        self.ids.push(id);
    }

    /// Replaces entry `i` (a private, full block with the same contents) by a shared
    /// reference to the cached block `id`, releasing the private one.
    pub(crate) fn replace_with_shared(&mut self, i: usize, id: u32) {
        let old = self.ids[i];
        if old == id {
            return;
        }
        let mut p = self.pool.inner.borrow_mut();
        assert!(p.cached[id as usize], "sharing uncached block {id}");
        if p.ref_count[id as usize] == 0 {
            p.num_cached_idle -= 1;
        }
        p.ref_count[id as usize] += 1;
        p.release(old);
        drop(p);
        self.ids[i] = id;
    }

    /// Releases the blocks past the first `n` (KV written past a sequence's
    /// accepted tokens: a rejected speculative draft).
    pub fn truncate(&mut self, n: usize) {
        if n >= self.ids.len() {
            return;
        }
        let mut p = self.pool.inner.borrow_mut();
        for &id in &self.ids[n..] {
            p.release(id);
        }
        drop(p);
        self.ids.truncate(n);
    }

    /// Releases every block.
    pub fn clear(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut p = self.pool.inner.borrow_mut();
        for &id in &self.ids {
            p.release(id);
        }
        self.ids.clear();
    }

    /// Whether position `pos` may be written: its block is owned by this table alone
    /// and not cached.
    pub fn is_writable(&self, pos: usize) -> bool {
        let p = self.pool.inner.borrow();
        match self.ids.get(pos / p.block_size) {
            Some(&id) => p.ref_count[id as usize] == 1 && !p.cached[id as usize],
            None => false,
        }
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

impl std::fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.ids).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_return_blocks_on_drop() {
        let pool = BlockPool::new(4, 16);
        let mut t = pool.new_table();
        assert_eq!(t.push_new(), Some(0));
        assert_eq!(t.push_new(), Some(1));
        assert_eq!(pool.num_free(), 2);
        assert_eq!(pool.num_used(), 2);
        assert!(t.is_writable(17));
        drop(t);
        assert_eq!(pool.num_free(), 4);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn truncate_releases_the_tail_only() {
        let pool = BlockPool::new(4, 4);
        let mut t = pool.new_table();
        let ids: Vec<u32> = (0..3).map(|_| t.push_new().unwrap()).collect();
        t.truncate(5);
        assert_eq!(t.ids(), &ids[..], "longer than the table: nothing");
        t.truncate(1);
        assert_eq!((t.ids(), pool.num_free()), (&ids[..1], 3));
        pool.check_invariants().unwrap();
        t.truncate(0);
        assert_eq!(pool.num_free(), 4);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn cached_blocks_become_idle_then_evictable() {
        let pool = BlockPool::new(2, 4);
        let mut a = pool.new_table();
        let id = a.push_new().unwrap();
        pool.mark_cached(id);
        assert!(!a.is_writable(0));
        let mut b = pool.new_table();
        b.push_shared(id);
        assert_eq!(pool.ref_count(id), 2);
        drop(a);
        drop(b);
        assert_eq!(
            (pool.num_free(), pool.num_cached_idle(), pool.num_used()),
            (1, 1, 0)
        );
        pool.check_invariants().unwrap();
        let mut idle = Vec::new();
        pool.take_newly_idle(&mut idle);
        assert_eq!(idle, vec![id]);
        pool.evict(id);
        assert_eq!(pool.num_free(), 2);
        pool.check_invariants().unwrap();
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let pool = BlockPool::new(2, 4);
        let mut t = pool.new_table();
        let id = t.push_new().unwrap();
        t.clear();
        pool.inner.borrow_mut().release(id);
    }

    #[test]
    fn exhausted_pool_returns_none() {
        let pool = BlockPool::new(1, 4);
        let mut t = pool.new_table();
        assert!(t.push_new().is_some());
        assert!(t.push_new().is_none());
        assert_eq!(t.len(), 1);
    }
}
