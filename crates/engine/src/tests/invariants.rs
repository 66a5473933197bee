//! Seeded randomized invariant tests (100k+ operations each) of the block pool and
//! the radix prefix cache: reference counts match the tables, no double free, every
//! block accounted for, the cache never returns a block with other contents, a
//! shared block is never written, a paused sequence's kept blocks still hold its
//! KV when it resumes (released only when memory is needed), and everything is
//! free at the end.

use super::Rng;
use crate::block_pool::{BlockPool, BlockTable};
use crate::prefix_cache::PrefixCache;

const OPS: usize = 120_000;

fn assert_counts(pool: &BlockPool, tables: &[BlockTable]) {
    let mut counts = vec![0u32; pool.num_blocks()];
    for t in tables {
        for &b in t.ids() {
            counts[b as usize] += 1;
        }
    }
    for (b, &n) in counts.iter().enumerate() {
        assert_eq!(pool.ref_count(b as u32), n, "ref count of block {b}");
    }
    pool.check_invariants().unwrap();
    assert_eq!(
        pool.num_free() + pool.num_cached_idle() + pool.num_used(),
        pool.num_blocks()
    );
}

#[test]
fn block_pool_random_operations() {
    for seed in 0..2 {
        let mut rng = Rng::new(seed);
        let pool = BlockPool::new(48, 4);
        let mut tables: Vec<BlockTable> = Vec::new();
        let mut cached: Vec<u32> = Vec::new(); // blocks marked cached
        for op in 0..OPS {
            match rng.below(10) {
                0 if tables.len() < 12 => tables.push(pool.new_table()),
                1..=3 if !tables.is_empty() => {
                    let k = rng.below(tables.len());
                    let free = pool.num_free();
                    match tables[k].push_new() {
                        Some(id) => {
                            assert!(free > 0 && pool.ref_count(id) == 1 && !pool.is_cached(id));
                            assert!(tables[k].is_writable(4 * (tables[k].len() - 1)));
                        }
                        None => assert_eq!(free, 0),
                    }
                }
                4 if !tables.is_empty() => {
                    // Cache the last block of a table (a "full" block).
                    let k = rng.below(tables.len());
                    if let Some(&id) = tables[k].ids().last() {
                        if !pool.is_cached(id) {
                            pool.mark_cached(id);
                            cached.push(id);
                        }
                    }
                }
                5 if !tables.is_empty() && !cached.is_empty() => {
                    let k = rng.below(tables.len());
                    let id = cached[rng.below(cached.len())];
                    tables[k].push_shared(id);
                    assert!(!tables[k].is_writable(4 * (tables[k].len() - 1)));
                }
                6 if !tables.is_empty() => {
                    let k = rng.below(tables.len());
                    tables.swap_remove(k); // drop releases
                }
                7 if !tables.is_empty() => {
                    let k = rng.below(tables.len());
                    tables[k].clear();
                }
                8 => {
                    // Evict an idle cached block.
                    if let Some(pos) = cached.iter().position(|&b| pool.ref_count(b) == 0) {
                        let id = cached.swap_remove(pos);
                        pool.evict(id);
                    }
                }
                _ => {}
            }
            if op % 64 == 0 {
                assert_counts(&pool, &tables);
            }
        }
        assert_counts(&pool, &tables);
        tables.clear();
        for id in cached.drain(..) {
            pool.evict(id);
        }
        pool.check_invariants().unwrap();
        assert_eq!(pool.num_free(), 48);
    }
}

/// A simulated sequence: its tokens, how many have KV, its table, and whether it
/// is paused (preempted with its blocks kept: it computes nothing until resumed).
struct Seq {
    tokens: Vec<u32>,
    computed: usize,
    table: BlockTable,
    paused: bool,
}

/// Checks `s`'s full blocks hold its KV (the prefix hash of their tokens).
fn assert_holds(s: &Seq, contents: &[Option<u64>], what: &str) {
    for (i, &b) in s.table.ids()[..s.computed / BS].iter().enumerate() {
        let expect = prefix_hash(&s.tokens[..(i + 1) * BS]);
        assert_eq!(contents[b as usize], Some(expect), "{what}");
    }
}

/// Releases the kept blocks of one paused sequence (as the scheduler does
/// before preempting running work); false if none holds any.
fn release_one_paused(seqs: &mut [Seq]) -> bool {
    let Some(s) = seqs
        .iter_mut()
        .rev()
        .find(|s| s.paused && !s.table.is_empty())
    else {
        return false;
    };
    s.table.clear();
    s.computed = 0;
    true
}

const BS: usize = 4;
const NUM_BLOCKS: usize = 24;

/// The "KV contents" of a block: the hash of every token up to its end.
fn prefix_hash(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn prefix_cache_random_operations() {
    for seed in 0..2 {
        let mut rng = Rng::new(100 + seed);
        // Small enough that memory runs short (paused sequences are released).
        let pool = BlockPool::new(NUM_BLOCKS, BS);
        let mut cache = PrefixCache::new(pool.clone());
        // contents[block] = prefix hash written there (None: garbage).
        let mut contents: Vec<Option<u64>> = vec![None; NUM_BLOCKS];
        let stems: Vec<Vec<u32>> = (0..4)
            .map(|i| (0..12 + 4 * i).map(|_| rng.below(3) as u32).collect())
            .collect();
        let mut seqs: Vec<Seq> = Vec::new();
        let mut hits = 0;
        let (mut kept_resumes, mut released) = (0, 0);
        for op in 0..OPS {
            match rng.below(9) {
                // Start a sequence: a shared stem plus a random tail; lock its cached prefix.
                0 if seqs.len() < 10 => {
                    let mut tokens = stems[rng.below(4)].clone();
                    tokens.truncate(rng.below(tokens.len() + 1));
                    tokens.extend((0..1 + rng.below(10)).map(|_| rng.below(3) as u32));
                    let mut table = pool.new_table();
                    let m = cache.match_prefix(&tokens[..tokens.len() - 1]);
                    for (i, &b) in m.iter().enumerate() {
                        let expect = prefix_hash(&tokens[..(i + 1) * BS]);
                        assert_eq!(
                            contents[b as usize],
                            Some(expect),
                            "cache returned wrong KV"
                        );
                    }
                    hits += m.len();
                    cache.lock(&m, &mut table);
                    let computed = m.len() * BS;
                    seqs.push(Seq {
                        tokens,
                        computed,
                        table,
                        paused: false,
                    });
                }
                // Compute a chunk: allocate blocks (evicting if needed), write, insert.
                1..=3 if !seqs.is_empty() => {
                    let k = rng.below(seqs.len());
                    let s = &seqs[k];
                    let n = (1 + rng.below(6)).min(s.tokens.len() - s.computed);
                    if n == 0 || s.paused {
                        continue;
                    }
                    let need = (s.computed + n).div_ceil(BS) - s.table.len();
                    // Idle cached blocks first, then paused sequences' kept ones.
                    loop {
                        if pool.num_free() < need {
                            cache.evict(need - pool.num_free());
                        }
                        if pool.num_free() >= need || !release_one_paused(&mut seqs) {
                            break;
                        }
                        released += 1;
                    }
                    if pool.num_free() < need {
                        continue; // would preempt in the engine
                    }
                    let s = &mut seqs[k];
                    for _ in 0..need {
                        s.table.push_new().unwrap();
                    }
                    for pos in s.computed..s.computed + n {
                        assert!(s.table.is_writable(pos), "writing a shared block");
                        if (pos + 1) % BS == 0 {
                            let b = s.table.ids()[pos / BS];
                            contents[b as usize] = Some(prefix_hash(&s.tokens[..pos + 1]));
                        }
                    }
                    s.computed += n;
                    cache.insert(&s.tokens[..s.computed], &mut s.table);
                    for (i, &b) in s.table.ids()[..s.computed / BS].iter().enumerate() {
                        let expect = prefix_hash(&s.tokens[..(i + 1) * BS]);
                        assert_eq!(contents[b as usize], Some(expect), "table holds wrong KV");
                    }
                }
                // Decode-like growth: append a token.
                4 if !seqs.is_empty() => {
                    let k = rng.below(seqs.len());
                    let t = rng.below(3) as u32;
                    seqs[k].tokens.push(t);
                }
                5 if !seqs.is_empty() => {
                    let k = rng.below(seqs.len());
                    seqs.swap_remove(k); // finish: drop releases
                }
                6 => {
                    cache.evict(rng.below(4));
                }
                7 if rng.below(50) == 0 => {
                    cache.flush();
                }
                // Preempt (pause, blocks kept) or resume a sequence: a kept one
                // still holds its KV; a released one locks its cached prefix again.
                8 if !seqs.is_empty() => {
                    let k = rng.below(seqs.len());
                    let s = &mut seqs[k];
                    if !s.paused {
                        s.table.truncate(s.computed.div_ceil(BS));
                        s.paused = true;
                    } else if !s.table.is_empty() {
                        assert_holds(s, &contents, "a kept block lost its KV");
                        s.paused = false;
                        kept_resumes += 1;
                    } else {
                        let m = cache.match_prefix(&s.tokens[..s.tokens.len() - 1]);
                        cache.lock(&m, &mut s.table);
                        s.computed = m.len() * BS;
                        assert_holds(s, &contents, "cache returned wrong KV");
                        s.paused = false;
                    }
                }
                _ => {}
            }
            if op % 32 == 0 {
                let tables: Vec<&BlockTable> = seqs.iter().map(|s| &s.table).collect();
                check_all(&pool, &cache, &tables);
            }
        }
        assert!(hits > 1000, "the workload should hit the cache ({hits})");
        assert!(
            kept_resumes > 1000 && released > 20,
            "paused sequences resumed on kept KV ({kept_resumes}) and released ({released})"
        );
        seqs.clear();
        cache.flush();
        assert_eq!(cache.size(), 0);
        pool.check_invariants().unwrap();
        assert_eq!(
            pool.num_free(),
            NUM_BLOCKS,
            "all blocks free after finishing and flushing"
        );
    }
}

fn check_all(pool: &BlockPool, cache: &PrefixCache, tables: &[&BlockTable]) {
    let mut counts = vec![0u32; pool.num_blocks()];
    for t in tables {
        for &b in t.ids() {
            counts[b as usize] += 1;
        }
    }
    for (b, &n) in counts.iter().enumerate() {
        assert_eq!(pool.ref_count(b as u32), n, "ref count of block {b}");
    }
    pool.check_invariants().unwrap();
    cache.check_invariants().unwrap();
    assert!(cache.size() <= pool.num_blocks());
}
