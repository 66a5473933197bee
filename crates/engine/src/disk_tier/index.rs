//! The disk tier's index: which blocks are on disk (by chain hash, with their
//! scope's salt and parent), their bytes, and their order of last use for LRU
//! eviction. Shared by the engine thread (lookups, spills queued) and the writer
//! thread (files written and evicted) under one mutex, taken once per lookup or
//! per step that stores blocks, never per token. Rebuilt at start by reading the
//! headers of the directory's files. It also logs the blocks stored and deleted
//! (`CacheChange::DiskStored` / `DiskRemoved`, for the KV events) until the
//! engine thread takes them.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use super::file::{self, BlockHeader};
use crate::prefix_cache::CacheChange;

/// Where a block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Queued for the writer: not readable yet.
    Queued,
    /// On disk.
    Written,
}

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub salt: u64,
    pub parent: u64,
    pub state: State,
    stamp: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Index {
    entries: HashMap<u64, Entry>,
    /// Written blocks by last use: (stamp, hash).
    lru: BTreeSet<(u64, u64)>,
    tick: u64,
    /// Bytes of one block's file.
    pub file_bytes: u64,
    /// Blocks stored on and deleted from disk since the engine thread last took
    /// them, and the token ids of each `DiskStored` among them.
    changes: Vec<CacheChange>,
    change_tokens: Vec<u32>,
}

impl Index {
    pub fn new(file_bytes: u64) -> Self {
        Index {
            file_bytes,
            ..Index::default()
        }
    }

    /// Blocks on disk.
    pub fn num_written(&self) -> usize {
        self.lru.len()
    }

    /// Bytes of the blocks on disk.
    pub fn bytes(&self) -> u64 {
        self.lru.len() as u64 * self.file_bytes
    }

    /// Whether `hash` is on disk or queued for it.
    pub fn contains(&self, hash: u64) -> bool {
        self.entries.contains_key(&hash)
    }

    /// Whether block `hash` of `salt` under `parent` is on disk (not marked used).
    pub fn is_written(&self, hash: u64, salt: u64, parent: u64) -> bool {
        self.entries
            .get(&hash)
            .is_some_and(|e| e.state == State::Written && e.salt == salt && e.parent == parent)
    }

    /// The written block `hash` of `salt` under `parent`, marked recently used.
    pub fn touch(&mut self, hash: u64, salt: u64, parent: u64) -> bool {
        let Some(e) = self.entries.get_mut(&hash) else {
            return false;
        };
        if e.state != State::Written || e.salt != salt || e.parent != parent {
            return false;
        }
        self.tick += 1;
        self.lru.remove(&(e.stamp, hash));
        e.stamp = self.tick;
        self.lru.insert((e.stamp, hash));
        true
    }

    /// Records `hash` as queued for the writer (false if it is known already).
    pub fn queue(&mut self, hash: u64, salt: u64, parent: u64) -> bool {
        if self.entries.contains_key(&hash) {
            return false;
        }
        let e = Entry {
            salt,
            parent,
            state: State::Queued,
            stamp: 0,
        };
        self.entries.insert(hash, e);
        true
    }

    /// Records `hash` as written now (or found at start), most recently used.
    pub fn written(&mut self, hash: u64, salt: u64, parent: u64) {
        self.tick += 1;
        if let Some(old) = self.entries.get(&hash) {
            self.lru.remove(&(old.stamp, hash));
        }
        let e = Entry {
            salt,
            parent,
            state: State::Written,
            stamp: self.tick,
        };
        self.entries.insert(hash, e);
        self.lru.insert((e.stamp, hash));
    }

    /// Forgets `hash` (a failed write, a damaged file, an eviction).
    pub fn remove(&mut self, hash: u64) {
        if let Some(e) = self.entries.remove(&hash) {
            self.lru.remove(&(e.stamp, hash));
        }
    }

    /// The least recently used written block, forgotten (its file is the
    /// caller's to delete).
    pub fn pop_oldest(&mut self) -> Option<u64> {
        let (_, hash) = self.lru.pop_first()?;
        self.entries.remove(&hash);
        Some(hash)
    }

    /// The entry of `hash`.
    pub fn get(&self, hash: u64) -> Option<&Entry> {
        self.entries.get(&hash)
    }

    /// Logs block `hash` (of `salt`, under `parent`, holding `tokens`) as stored.
    pub fn note_stored(&mut self, hash: u64, parent: u64, salt: u64, tokens: &[u32]) {
        self.changes
            .push(CacheChange::DiskStored { hash, parent, salt });
        self.change_tokens.extend_from_slice(tokens);
    }

    /// Logs block `hash`'s file as deleted.
    pub fn note_removed(&mut self, hash: u64) {
        self.changes.push(CacheChange::DiskRemoved { hash });
    }

    /// Forgets the logged changes.
    pub fn clear_changes(&mut self) {
        self.changes.clear();
        self.change_tokens.clear();
    }

    /// The blocks on disk, least recently used first.
    pub fn written_hashes(&self) -> Vec<u64> {
        self.lru.iter().map(|&(_, h)| h).collect()
    }

    /// Moves the logged changes into `out`, their tokens into `tokens`.
    pub fn take_changes(&mut self, out: &mut Vec<CacheChange>, tokens: &mut Vec<u32>) {
        out.append(&mut self.changes);
        tokens.append(&mut self.change_tokens);
    }
}

/// What a start-up scan found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanReport {
    pub blocks: usize,
    pub skipped: usize,
}

/// Reads the headers of `dir`'s block files into `index`, oldest modified first
/// (so the LRU order survives a restart roughly); a file that is not a valid
/// block of `identity` is skipped with a warning, a leftover temporary file of
/// an interrupted write removed.
pub fn scan(
    dir: &Path,
    identity: u64,
    block_size: usize,
    payload_len: usize,
    index: &mut Index,
) -> std::io::Result<ScanReport> {
    let mut found = Vec::new();
    let mut report = ScanReport::default();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let path = ent.path();
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(stem) = name.strip_suffix(".kvb") else {
            continue;
        };
        let named = u64::from_str_radix(stem, 16).ok();
        let header = file::read_header(&path, identity, block_size, payload_len);
        match (named, header) {
            (Some(n), Ok(h)) if n == h.hash => {
                let mtime = ent.metadata().and_then(|m| m.modified()).ok();
                found.push((mtime, h));
            }
            (_, Err(why)) => {
                tracing::warn!(file = %path.display(), %why, "prefix-cache disk tier: skipping a block file");
                report.skipped += 1;
            }
            _ => {
                tracing::warn!(file = %path.display(), "prefix-cache disk tier: skipping a block file named after another block");
                report.skipped += 1;
            }
        }
    }
    found.sort_by_key(|(t, h)| (*t, h.hash));
    for (
        _,
        BlockHeader {
            salt,
            parent,
            hash,
            tokens,
            ..
        },
    ) in found
    {
        index.written(hash, salt, parent);
        index.note_stored(hash, parent, salt, &tokens);
        report.blocks += 1;
    }
    Ok(report)
}
