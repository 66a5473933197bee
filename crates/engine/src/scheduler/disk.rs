//! The scheduler's side of the prefix cache's disk tier (`crate::disk_tier`): at
//! admission, the blocks of a prompt's prefix found on disk past its RAM hit are
//! read back into fresh KV blocks and cached, when the step-time model predicts
//! loading them cheaper than recomputing them (else they are recomputed); after
//! each step, the blocks newly cached in RAM are copied out of the runner and
//! handed to the disk writer.

use super::Scheduler;
use crate::disk_tier::{DiskTier, Spill};
use crate::prefix_cache::CacheChange;
use crate::runner::ModelRunner;
use crate::sequence::Sequence;

impl Scheduler {
    /// The disk tier, if any.
    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    /// The disk tier, if any.
    pub fn disk_mut(&mut self) -> Option<&mut DiskTier> {
        self.disk.as_mut()
    }

    /// Takes the disk tier out (an engine restart hands it to the new core).
    pub fn take_disk(&mut self) -> Option<DiskTier> {
        self.disk.take()
    }

    /// After `s`'s RAM lookup (its first blocks locked): the continuation of its
    /// prefix on disk, loaded into fresh blocks and cached when cheaper than
    /// recomputing it. Returns the tokens loaded.
    pub(super) fn load_from_disk(&mut self, s: &mut Sequence) -> usize {
        if self.disk.is_none() || self.cache.is_none() || s.scores_prompt() {
            return 0;
        }
        let bs = self.pool.block_size();
        let from = s.blocks().len();
        let usable = s.tokens().len() - 1;
        // Blocks it could take without preempting anyone.
        let room = self.pool.num_free() + self.pool.num_cached_idle();
        let max = (usable / bs).saturating_sub(from).min(room);
        let disk = self.disk.as_ref().expect("checked");
        let found = disk.lookup(s.cache_salt(), &s.tokens()[..usable], from, max);
        if found.is_empty() {
            return 0;
        }
        let n = found.len();
        self.counters.disk.hit_tokens += (n * bs) as u64;
        let load_s = disk.predict_load_s(n);
        let recompute_s =
            self.cost
                .predict_prefill_s(from * bs, n * bs, self.cfg.max_prefill_chunk);
        if load_s >= recompute_s || !self.ensure_free(n) {
            tracing::debug!(
                seq = s.id(),
                blocks = n,
                load_s,
                recompute_s,
                "disk tier: recomputing"
            );
            self.counters.disk.recomputes += 1;
            return 0;
        }
        let disk = self.disk.as_mut().expect("checked");
        let mut loaded = 0;
        let mut chunk = vec![0u32; bs];
        for (j, b) in found.iter().enumerate() {
            chunk.copy_from_slice(&s.tokens()[(from + j) * bs..(from + j + 1) * bs]);
            if s.push_new_blocks(1).is_none() {
                break;
            }
            let block = *s.blocks().ids().last().expect("pushed");
            match disk.load(s.cache_salt(), *b, &chunk, block) {
                Ok(bytes) => {
                    self.counters.disk.bytes_read += bytes as u64;
                    loaded += 1;
                }
                Err(_) => {
                    self.counters.disk.bad_files += 1;
                    s.release_blocks_past(from + j);
                    break;
                }
            }
        }
        if loaded == 0 {
            return 0;
        }
        let cache = self.cache.as_mut().expect("checked");
        s.adopt_cached_blocks(cache, bs);
        self.counters.disk.loads += 1;
        self.counters.disk.loaded_tokens += (loaded * bs) as u64;
        tracing::debug!(
            seq = s.id(),
            blocks = loaded,
            load_s,
            recompute_s,
            "disk tier: loaded"
        );
        loaded * bs
    }

    /// Hands the blocks `changes` stored (not yet on disk) to the disk writer,
    /// copied out of `runner`; `tokens` are the stored blocks' token ids.
    pub fn spill_stored(
        &mut self,
        changes: &[CacheChange],
        tokens: &[u32],
        runner: &dyn ModelRunner,
    ) {
        let (Some(disk), Some(cache)) = (self.disk.as_mut(), self.cache.as_ref()) else {
            return;
        };
        let bs = self.pool.block_size();
        let spills = &mut self.spill_buf;
        spills.clear();
        let stored = changes.iter().filter_map(|c| match *c {
            CacheChange::Stored {
                hash,
                parent,
                block,
                salt,
            } => Some((hash, parent, block, salt)),
            _ => None,
        });
        for (nth, (hash, parent, block, salt)) in stored.enumerate() {
            // Still cached as that block (not evicted since).
            if cache.hash_of(block) == Some(hash) {
                spills.push(Spill {
                    hash,
                    salt,
                    parent,
                    block,
                    nth,
                });
            }
        }
        if spills.is_empty() {
            return;
        }
        disk.claim(spills);
        for sp in spills.iter() {
            let mut buf = disk.buffer();
            let Some(toks) = tokens.get(sp.nth * bs..(sp.nth + 1) * bs) else {
                disk.unclaim(sp.hash);
                continue;
            };
            if let Err(e) = runner.read_kv_block(sp.block, &mut buf) {
                tracing::warn!(error = %e, "disk tier: cannot copy a KV block out");
                disk.unclaim(sp.hash);
                continue;
            }
            if !disk.spill(sp.hash, sp.salt, sp.parent, toks, buf) {
                self.counters.disk.spill_drops += 1;
            }
        }
    }
}
