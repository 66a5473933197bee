//! The prefix cache's disk tier against the `MockRunner` (whose KV slots carry
//! the hash of their whole prefix, so a block read back wrong fails the step):
//! reuse across a restart (and what `submit` counts and prefetches), isolation
//! between salts, damaged files skipped, the load-or-recompute decision, the
//! size limit, and a seeded mixed workload.

use std::path::Path;

use super::*;
use crate::disk_tier::file;
use crate::mock::MockRunner;
use crate::prefix_cache::{chain_hash, root_hash, CacheChange};
use crate::step_cost::{StepCostModel, StepShape};

fn disk_cfg(blocks: usize, dir: &Path) -> EngineConfig {
    EngineConfig {
        prefix_cache_dir: Some(dir.to_path_buf()),
        ..cfg(blocks)
    }
}

/// A core over a fresh mock whose steps cost 1 ms a token on the engine's clock
/// (a real model's order; the mock's own microseconds would make recomputing
/// always the cheaper choice once learned).
fn core_on(c: EngineConfig) -> EngineCore {
    let n = c.num_kv_blocks.unwrap();
    let mut core = EngineCore::new(Box::new(MockRunner::new(n, 16, VOCAB, 4096)), c).unwrap();
    core.set_synthetic_cost(|s: &StepShape| 1e-3 * s.tokens() as f64);
    core
}

/// Steps until idle, handing each step's cached blocks to the disk tier as the
/// engine thread does.
fn run_spilling(core: &mut EngineCore) {
    let (mut ch, mut toks) = (Vec::<CacheChange>::new(), Vec::new());
    let mut steps = 0;
    while core.has_work() {
        core.step();
        core.take_cache_changes(&mut ch, &mut toks);
        ch.clear();
        toks.clear();
        steps += 1;
        assert!(steps < 5000, "not idle");
    }
}

/// Runs `prompt` under `salt` to the end; its tokens and cached prompt tokens.
fn serve(core: &mut EngineCore, id: u64, prompt: &[u32], salt: u64) -> (Vec<u32>, usize) {
    let mut req = Request::greedy(prompt.to_vec(), 8);
    req.cache_salt = salt;
    let mut cl = submit(core, id, req);
    run_spilling(core);
    cl.poll();
    let f = cl.finish.expect("finished");
    (cl.tokens, f.cached_prompt_tokens)
}

/// The block files under `dir` (one identity subdirectory), sorted.
fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

/// The file of the `i`-th full block of `prompt` under `salt`.
fn file_of(dir: &Path, prompt: &[u32], salt: u64, i: usize) -> std::path::PathBuf {
    let mut h = root_hash(salt);
    for c in prompt.chunks_exact(16).take(i + 1) {
        h = chain_hash(h, c);
    }
    let sub = std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    file::path_of(&sub, h)
}

#[test]
fn a_restarted_engine_loads_the_prefix_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(1, 100);
    let expect = MockRunner::reference(&p, 8, VOCAB);
    let mut core = core_on(disk_cfg(64, dir.path()));
    assert_eq!(serve(&mut core, 0, &p, 0), (expect.clone(), 0));
    drop(core); // the writer drains its queue and syncs
                // 6 prompt blocks, and the block the output completed.
    assert_eq!(block_files(dir.path()).len(), 6);

    // A fresh process: empty RAM cache, a runner whose KV was never written.
    let mut core = core_on(disk_cfg(64, dir.path()));
    // What `submit` counts (and reads ahead): the prefix on disk past the RAM hit.
    let view = core.disk_view().unwrap();
    assert_eq!(view.prefetch(0, &p, 0), 96);
    assert_eq!(view.prefetch(0, &p, 32), 64);
    assert_eq!(view.prefetch(5, &p, 0), 0, "another salt");
    assert_eq!(view.prefetch(0, &p[..40], 0), 32, "all but the last token");
    assert_eq!(serve(&mut core, 0, &p, 0), (expect, 96));
    let d = core.snapshot().counters.disk;
    assert_eq!(
        (d.loads, d.loaded_tokens, d.hit_tokens, d.recomputes),
        (1, 96, 96, 0)
    );
    assert_eq!(d.blocks, 6);
    assert!(d.bytes_read > 0 && d.bad_files == 0);
    assert_all_blocks_return(&mut core);
}

#[test]
fn another_salt_never_reads_the_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(2, 70);
    let mut core = core_on(disk_cfg(64, dir.path()));
    serve(&mut core, 0, &p, 11);
    // In RAM (and on disk): salt 12 and the shared trie find nothing.
    assert_eq!(serve(&mut core, 1, &p, 12).1, 0);
    assert_eq!(serve(&mut core, 2, &p, 0).1, 0);
    drop(core);
    // After a restart, from disk: a salt that never ran this prompt neither.
    let mut core = core_on(disk_cfg(64, dir.path()));
    assert_eq!(serve(&mut core, 0, &p, 13).1, 0);
    assert_eq!(core.snapshot().counters.disk.hit_tokens, 0);
    assert_eq!(serve(&mut core, 1, &p, 11).1, 64, "the owner's salt does");
}

#[test]
fn damaged_and_truncated_files_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(3, 100);
    let expect = MockRunner::reference(&p, 8, VOCAB);
    let mut core = core_on(disk_cfg(64, dir.path()));
    serve(&mut core, 0, &p, 0);
    drop(core);
    // Block 2: one bit flipped in its payload; block 4: cut short.
    let f2 = file_of(dir.path(), &p, 0, 2);
    let mut b = std::fs::read(&f2).unwrap();
    let at = b.len() - 10;
    b[at] ^= 0x10;
    std::fs::write(&f2, b).unwrap();
    let f4 = file_of(dir.path(), &p, 0, 4);
    let b = std::fs::read(&f4).unwrap();
    std::fs::write(&f4, &b[..b.len() / 2]).unwrap();

    let mut core = core_on(disk_cfg(64, dir.path()));
    // The truncated file is not indexed; the flipped one fails its checksum.
    assert_eq!(core.snapshot().counters.disk.blocks, 5);
    assert_eq!(serve(&mut core, 0, &p, 0), (expect, 32));
    let d = core.snapshot().counters.disk;
    assert_eq!((d.bad_files, d.loaded_tokens), (1, 32));
    drop(core);
    // The recomputed blocks were written again.
    let mut core = core_on(disk_cfg(64, dir.path()));
    assert_eq!(serve(&mut core, 0, &p, 0).1, 96);
}

#[test]
fn a_cheap_prefill_is_recomputed_instead() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(4, 100);
    let mut core = core_on(disk_cfg(64, dir.path()));
    serve(&mut core, 0, &p, 0);
    drop(core);
    let mut core = core_on(disk_cfg(64, dir.path()));
    // A step-time model that predicts prefill free.
    *core.sched_mut().cost_model_mut() = StepCostModel::with_prior([0.0; crate::step_cost::TERMS]);
    let (tokens, cached) = serve(&mut core, 0, &p, 0);
    assert_eq!((tokens, cached), (MockRunner::reference(&p, 8, VOCAB), 0));
    let d = core.snapshot().counters.disk;
    assert_eq!((d.recomputes, d.loads, d.hit_tokens), (1, 0, 96));
}

#[test]
fn the_size_limit_evicts_the_least_recently_used_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = disk_cfg(64, dir.path());
    let one = file::BlockHeader::header_len(16) + 13 * 16 + 4;
    c.prefix_cache_disk_size = (10 * one) as u64;
    let mut core = core_on(c.clone());
    for i in 0..4 {
        serve(&mut core, i, &prompt(10 + i, 70), 0);
    }
    drop(core);
    assert_eq!(block_files(dir.path()).len(), 10);
    let mut core = core_on(c);
    let d = core.snapshot().counters.disk;
    assert_eq!((d.blocks, d.bytes), (10, 10 * one as u64));
    // The newest prompt is whole on disk, the oldest gone.
    assert_eq!(serve(&mut core, 0, &prompt(13, 70), 0).1, 64);
    assert_eq!(serve(&mut core, 1, &prompt(10, 70), 0).1, 0);
}

/// Seeded: prompts sharing prefixes under a few salts, a pool small enough that
/// RAM evicts, restarts in between: every output is the reference, the pool's
/// and cache's invariants hold, and the disk tier serves some prefixes.
#[test]
fn seeded_workload_with_evictions_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(54);
    let bases: Vec<Vec<u32>> = (0..4).map(|i| prompt(100 + i, 80)).collect();
    let mut id = 0;
    for round in 0..3 {
        let mut core = core_on(disk_cfg(12, dir.path()));
        for _ in 0..12 {
            let mut p = bases[rng.below(4)].clone();
            p.truncate(20 + rng.below(60));
            p.extend(prompt(rng.next_u64(), rng.below(40)));
            let salt = rng.below(3) as u64;
            let (tokens, _) = serve(&mut core, id, &p, salt);
            // The writer runs on its own: wait for it, so the run is the seed's.
            core.sched_mut().disk_mut().unwrap().flush();
            assert_eq!(tokens, MockRunner::reference(&p, 8, VOCAB), "request {id}");
            id += 1;
            core.sched().pool().check_invariants().unwrap();
            core.sched().cache().unwrap().check_invariants().unwrap();
        }
        let d = core.snapshot().counters.disk;
        // After a restart the shared prefixes come from disk.
        assert!((round == 0 || d.loads > 0) && d.bad_files == 0, "{d:?}");
        assert_all_blocks_return(&mut core);
    }
}

/// A preempted batch sequence whose blocks RAM evicted for the interactive one
/// resumes from disk: only its last partial block is computed again.
#[test]
fn a_preempted_sequence_resumes_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut core = core_on(disk_cfg(10, dir.path()));
    let pa = prompt(20, 100);
    let mut a = submit(&mut core, 0, greedy(pa.clone(), 40, SloClass::Batch));
    let (mut ch, mut toks) = (Vec::new(), Vec::new());
    let mut step = |core: &mut EngineCore| {
        core.step();
        core.take_cache_changes(&mut ch, &mut toks);
        ch.clear();
        toks.clear();
        core.sched_mut().disk_mut().unwrap().flush();
    };
    for _ in 0..12 {
        step(&mut core);
    }
    let pb = prompt(21, 100);
    let mut b = submit(&mut core, 1, greedy(pb.clone(), 4, SloClass::Interactive));
    let mut n = 0;
    while core.has_work() {
        step(&mut core);
        n += 1;
        assert!(n < 500);
    }
    a.poll();
    b.poll();
    assert_eq!(a.tokens, MockRunner::reference(&pa, 40, VOCAB));
    assert_eq!(b.tokens, MockRunner::reference(&pb, 4, VOCAB));
    let c = core.snapshot().counters;
    assert_eq!(c.preemptions, 1);
    assert!(c.disk.loads >= 1, "{:?}", c.disk);
    assert_eq!(c.preemptions_spilled, 1, "every full block found again");
    // At most its last (partial or just-filled) block.
    assert!(
        c.recomputed_tokens <= 16,
        "recomputed {}",
        c.recomputed_tokens
    );
    assert_all_blocks_return(&mut core);
}

/// The disk tier's own changes follow the RAM cache's, for the KV events: each
/// block as its file is written (with its tokens), each file the size limit
/// deletes, and after a restart every block found on disk.
#[test]
fn the_disk_tier_logs_blocks_written_deleted_and_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = disk_cfg(64, dir.path());
    let one = file::BlockHeader::header_len(16) + 13 * 16 + 4;
    c.prefix_cache_disk_size = (4 * one) as u64;
    let p = prompt(30, 100);
    let drain = |core: &mut EngineCore| {
        let (mut ch, mut toks) = (Vec::new(), Vec::new());
        core.take_cache_changes(&mut ch, &mut toks);
        (ch, toks)
    };
    let mut core = core_on(c.clone());
    let mut cl = submit(&mut core, 0, Request::greedy(p.clone(), 8));
    let (mut changes, mut tokens) = (Vec::new(), Vec::new());
    while core.has_work() {
        core.step();
        let (ch, toks) = drain(&mut core);
        changes.extend(ch);
        tokens.extend(toks);
    }
    core.sched_mut().disk_mut().unwrap().flush();
    let (ch, toks) = drain(&mut core);
    changes.extend(ch);
    tokens.extend(toks);
    cl.poll();
    let mut all = p.clone();
    all.extend(&cl.tokens);
    // The RAM tier's six stores come first, then the disk's, in order, with
    // the same hashes and tokens.
    let mut want = Vec::new();
    let mut h = root_hash(0);
    for b in all.chunks_exact(16).take(6) {
        let parent = h;
        h = chain_hash(h, b);
        want.push((h, parent));
    }
    let ram: Vec<u64> = changes
        .iter()
        .filter_map(|c| match c {
            CacheChange::Stored { hash, .. } => Some(*hash),
            _ => None,
        })
        .collect();
    let disk: Vec<(u64, u64)> = changes
        .iter()
        .filter_map(|c| match *c {
            CacheChange::DiskStored { hash, parent, salt } => {
                assert_eq!(salt, 0);
                Some((hash, parent))
            }
            _ => None,
        })
        .collect();
    assert_eq!(ram, want.iter().map(|w| w.0).collect::<Vec<_>>());
    assert_eq!(disk, want);
    assert_eq!(tokens[..96], all[..96], "the RAM stores' tokens");
    assert_eq!(tokens[96..], all[..96], "the disk stores' tokens");
    // Four files fit: the two oldest were deleted.
    let removed: Vec<u64> = changes
        .iter()
        .filter_map(|c| match c {
            CacheChange::DiskRemoved { hash } => Some(*hash),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![want[0].0, want[1].0]);
    drop(core);

    // A restart: a new (empty) cache, then the four blocks found on disk.
    let mut core = core_on(c);
    let (ch, toks) = drain(&mut core);
    assert_eq!(ch[0], CacheChange::Cleared);
    let mut found: Vec<u64> = ch[1..]
        .iter()
        .map(|c| match c {
            CacheChange::DiskStored { hash, .. } => *hash,
            other => panic!("{other:?}"),
        })
        .collect();
    found.sort();
    let mut kept: Vec<u64> = want[2..].iter().map(|w| w.0).collect();
    kept.sort();
    assert_eq!((found, toks.len()), (kept.clone(), 4 * 16));
    assert!(drain(&mut core).0.is_empty(), "logged once");

    // An engine restart (after a panic): a new cache, and the same four again.
    let mut core = core.restart().unwrap();
    let (ch, toks) = drain(&mut core);
    assert_eq!(ch[0], CacheChange::Cleared);
    let mut again: Vec<u64> = ch[1..]
        .iter()
        .map(|c| match c {
            CacheChange::DiskStored { hash, .. } => *hash,
            other => panic!("{other:?}"),
        })
        .collect();
    again.sort();
    assert_eq!((again, toks.len()), (kept, 4 * 16));
}
