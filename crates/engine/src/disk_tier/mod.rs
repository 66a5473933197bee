//! The prefix cache's disk tier (`--prefix-cache-dir`): full blocks cached in RAM
//! are also written to disk (write-through, off the engine thread: a writer
//! thread behind a bounded queue; a block the full queue cannot take is not
//! spilled, and counted), so a block evicted from RAM, or lost with the process,
//! is found again by the same chain hashes the radix trie uses, and loaded
//! instead of recomputed when the step-time model says loading is cheaper.
//!
//! Everything lives under `DIR/<identity>/`, the identity a hash of what a
//! block's bytes mean (the model file, its tokenizer, the KV element type and
//! precision, the block size: [`crate::ModelRunner::kv_identity`]); each file also
//! names its identity, its scope's salt, its parent's chain hash and its tokens,
//! and a block is used only when all of them match the request's and its
//! checksum holds (`file.rs`). The index of what is on disk (`index.rs`) is read
//! back from the files' headers at start; the size limit evicts least recently
//! used files (`writer.rs`, which also states the fsync policy).

pub mod file;
pub mod index;
mod prefetch;
mod writer;

pub use prefetch::DiskView;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use file::BlockHeader;
use index::Index;

use crate::prefix_cache::{chain_hash, root_hash};

/// Bytes of spilled blocks waiting for the writer, at most (and at least 16
/// blocks, at most 4,096).
pub const QUEUE_BYTES: usize = 256 << 20;

/// The writer queue's length in blocks of `block_bytes`.
fn queue_blocks(block_bytes: usize) -> usize {
    (QUEUE_BYTES / block_bytes.max(1)).clamp(16, 4096)
}

/// Bytes per second assumed for reading blocks until loads are measured (a
/// slow disk's; the measured rate replaces it).
const PRIOR_READ_RATE: f64 = 200e6;
/// Seconds one block file costs beyond its bytes (open, syscalls, checks).
const PER_FILE_S: f64 = 50e-6;

/// Counters the writer thread keeps (read by the engine's snapshot).
#[derive(Debug, Default)]
pub struct WriterCounters {
    pub bytes_written: AtomicU64,
    pub blocks_written: AtomicU64,
    pub blocks_evicted: AtomicU64,
    pub write_errors: AtomicU64,
    /// Blocks and bytes on disk now.
    pub blocks: AtomicU64,
    pub bytes: AtomicU64,
}

/// What the engine thread and the writer share.
pub struct Shared {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    pub counters: WriterCounters,
    /// The index logged changes since the engine thread last took them (so it
    /// locks the index for them only then).
    changes_pending: AtomicBool,
}

impl Shared {
    fn lock_index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_gauges(&self, index: &Index) {
        let c = &self.counters;
        c.blocks
            .store(index.num_written() as u64, Ordering::Relaxed);
        c.bytes.store(index.bytes(), Ordering::Relaxed);
    }
}

/// A block read back from disk, waiting to be written into the runner's KV block.
pub struct Loaded {
    pub block: u32,
    buf: Vec<u8>,
    range: std::ops::Range<usize>,
}

impl Loaded {
    /// The runner's bytes of the block.
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

/// A block newly cached in RAM, to spill: its chain hash, its trie's salt, its
/// parent's hash, the KV block holding it and its index among the step's
/// stored blocks (for its tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spill {
    pub hash: u64,
    pub salt: u64,
    pub parent: u64,
    pub block: u32,
    pub nth: usize,
}

/// A block on disk continuing a prompt's prefix: its chain hash and its parent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnDisk {
    pub hash: u64,
    pub parent: u64,
}

/// The engine thread's side of the disk tier (see the module docs).
pub struct DiskTier {
    shared: Arc<Shared>,
    tx: Option<SyncSender<writer::Job>>,
    recycle: Receiver<Vec<u8>>,
    writer: Option<JoinHandle<()>>,
    identity: u64,
    block_size: usize,
    block_bytes: usize,
    /// Measured read rate, bytes per second.
    read_rate: f64,
    /// Read-back blocks for the runner, in order (applied before the next step).
    loads: Vec<Loaded>,
    spare: Vec<Vec<u8>>,
}

impl DiskTier {
    /// Opens (creating it if needed) `dir`'s subdirectory for `identity` and reads
    /// its index back; starts the writer. `block_bytes`: the runner's bytes of one
    /// KV block.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        identity: u64,
        block_size: usize,
        block_bytes: usize,
    ) -> Result<DiskTier, String> {
        let dir = dir.join(format!("{identity:016x}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("--prefix-cache-dir {}: {e}", dir.display()))?;
        let file_bytes = BlockHeader::header_len(block_size) + block_bytes + 4;
        let mut index = Index::new(file_bytes as u64);
        let t0 = Instant::now();
        let report = index::scan(&dir, identity, block_size, block_bytes, &mut index)
            .map_err(|e| format!("--prefix-cache-dir {}: {e}", dir.display()))?;
        tracing::info!(
            dir = %dir.display(),
            blocks = report.blocks,
            skipped = report.skipped,
            mb = format_args!("{:.1}", index.bytes() as f64 / 1e6),
            ms = format_args!("{:.1}", t0.elapsed().as_secs_f64() * 1e3),
            "prefix-cache disk tier: index read back"
        );
        let shared = Arc::new(Shared {
            dir,
            max_bytes,
            index: Mutex::new(index),
            counters: WriterCounters::default(),
            // The blocks found at start are logged as stored.
            changes_pending: AtomicBool::new(true),
        });
        shared.publish_gauges(&shared.lock_index());
        let (tx, rx) = mpsc::sync_channel(queue_blocks(block_bytes));
        let (recycle_tx, recycle) = mpsc::channel();
        let sh = shared.clone();
        let writer = std::thread::Builder::new()
            .name("sloserve-kv-disk".into())
            .spawn(move || writer::run(sh, rx, recycle_tx))
            .map_err(|e| format!("cannot spawn the disk tier's writer: {e}"))?;
        Ok(DiskTier {
            shared,
            tx: Some(tx),
            recycle,
            writer: Some(writer),
            identity,
            block_size,
            block_bytes,
            read_rate: PRIOR_READ_RATE,
            loads: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// The view other threads get (admission's estimate, prefetch).
    pub fn view(&self) -> Result<DiskView, String> {
        DiskView::new(self.shared.clone(), self.block_size)
    }

    /// The writer's counters.
    pub fn counters(&self) -> &WriterCounters {
        &self.shared.counters
    }

    /// The runner's bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The blocks on disk continuing `tokens` (full blocks only) of `salt` past its
    /// first `from` blocks, at most `max` of them; marks them recently used.
    pub fn lookup(&self, salt: u64, tokens: &[u32], from: usize, max: usize) -> Vec<OnDisk> {
        let mut parent = root_hash(salt);
        let mut chunks = tokens.chunks_exact(self.block_size);
        for c in chunks.by_ref().take(from) {
            parent = chain_hash(parent, c);
        }
        let mut out = Vec::new();
        let mut index = self.shared.lock_index();
        for c in chunks.take(max) {
            let hash = chain_hash(parent, c);
            if !index.touch(hash, salt, parent) {
                break;
            }
            out.push(OnDisk { hash, parent });
            parent = hash;
        }
        out
    }

    /// Predicted seconds to load `n` blocks.
    pub fn predict_load_s(&self, n: usize) -> f64 {
        n as f64 * (self.block_bytes as f64 / self.read_rate + PER_FILE_S)
    }

    /// Reads block `b` (of `salt`, holding `tokens`) back for KV block `block`:
    /// the payload is queued for the runner ([`Self::take_loads`]). A damaged or
    /// foreign file is forgotten and deleted, with a warning; `Err` then.
    pub fn load(
        &mut self,
        salt: u64,
        b: OnDisk,
        tokens: &[u32],
        block: u32,
    ) -> Result<usize, String> {
        let expect = BlockHeader {
            identity: self.identity,
            salt,
            parent: b.parent,
            hash: b.hash,
            tokens: tokens.to_vec(),
            payload_len: self.block_bytes,
        };
        let path = file::path_of(&self.shared.dir, b.hash);
        let mut buf = self.spare.pop().unwrap_or_default();
        let t0 = Instant::now();
        match file::read_block(&path, &expect, self.block_size, &mut buf) {
            Ok(range) => {
                let secs = t0.elapsed().as_secs_f64().max(1e-6);
                let rate = buf.len() as f64 / secs;
                // A moving average of the measured rate, weighted by bytes.
                self.read_rate = 0.9 * self.read_rate + 0.1 * rate;
                let n = buf.len();
                self.loads.push(Loaded { block, buf, range });
                Ok(n)
            }
            Err(why) => {
                tracing::warn!(file = %path.display(), %why, "prefix-cache disk tier: skipping a block file");
                let mut index = self.shared.lock_index();
                index.remove(b.hash);
                index.note_removed(b.hash);
                drop(index);
                self.shared.changes_pending.store(true, Ordering::Release);
                let _ = std::fs::remove_file(&path);
                self.spare.push(buf);
                Err(why)
            }
        }
    }

    /// Moves the blocks stored on and deleted from disk since the last call into
    /// `out` (`DiskStored` / `DiskRemoved`), the stored ones' token ids into
    /// `tokens`; locks the index only when there are some.
    pub fn take_changes(
        &self,
        out: &mut Vec<crate::prefix_cache::CacheChange>,
        tokens: &mut Vec<u32>,
    ) {
        if self.shared.changes_pending.swap(false, Ordering::AcqRel) {
            self.shared.lock_index().take_changes(out, tokens);
        }
    }

    /// Logs every block on disk as stored again, its tokens read back from its
    /// file's header, in place of what was logged and not yet taken: after an
    /// engine restart, whose new cache's `Cleared` makes a KV-events subscriber
    /// forget every tier of the replica.
    pub fn relist(&self) {
        let written = {
            let mut index = self.shared.lock_index();
            index.clear_changes();
            index.written_hashes()
        };
        let headers: Vec<BlockHeader> = written
            .into_iter()
            .filter_map(|h| {
                let path = file::path_of(&self.shared.dir, h);
                file::read_header(&path, self.identity, self.block_size, self.block_bytes).ok()
            })
            .collect();
        let mut index = self.shared.lock_index();
        for h in headers {
            if index.is_written(h.hash, h.salt, h.parent) {
                index.note_stored(h.hash, h.parent, h.salt, &h.tokens);
            }
        }
        drop(index);
        self.shared.changes_pending.store(true, Ordering::Release);
    }

    /// Whether block `hash` is on disk or queued for it.
    pub fn knows(&self, hash: u64) -> bool {
        self.shared.lock_index().contains(hash)
    }

    /// Marks blocks as queued for writing: the ones not on disk or queued yet are
    /// kept in `blocks` (one lock for all).
    pub fn claim(&self, blocks: &mut Vec<Spill>) {
        let mut index = self.shared.lock_index();
        blocks.retain(|b| index.queue(b.hash, b.salt, b.parent));
    }

    /// Writes the blocks read back since the last call into the runner's KV
    /// (`write(block, bytes)`), in order, before the step that may read them.
    pub fn apply_loads(
        &mut self,
        mut write: impl FnMut(u32, &[u8]) -> Result<(), crate::RunnerError>,
    ) -> Result<(), crate::RunnerError> {
        let mut loads = std::mem::take(&mut self.loads);
        let mut res = Ok(());
        for l in loads.drain(..) {
            if res.is_ok() {
                res = write(l.block, l.payload());
            }
            if self.spare.len() < 64 {
                self.spare.push(l.buf);
            }
        }
        self.loads = loads;
        res
    }

    /// Drops reads not applied (the runner was reset).
    pub fn clear_loads(&mut self) {
        self.loads.clear();
    }

    /// Adds the writer's counters and the tier's size to `c`.
    pub fn fill(&self, c: &mut crate::stats::DiskCounters) {
        let w = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        c.bytes_written = get(&w.bytes_written);
        c.blocks_written = get(&w.blocks_written);
        c.blocks_evicted = get(&w.blocks_evicted);
        c.write_errors = get(&w.write_errors);
        c.blocks = get(&w.blocks);
        c.bytes = get(&w.bytes);
    }

    /// A payload buffer of the block's size (a recycled one when there is one).
    pub fn buffer(&mut self) -> Vec<u8> {
        let mut b = self.recycle.try_recv().unwrap_or_default();
        b.resize(self.block_bytes, 0);
        b
    }

    /// Hands a claimed block to the writer; false if the queue is full (the
    /// block is then forgotten: not spilled).
    pub fn spill(
        &mut self,
        hash: u64,
        salt: u64,
        parent: u64,
        tokens: &[u32],
        payload: Vec<u8>,
    ) -> bool {
        let job = writer::Job {
            header: BlockHeader {
                identity: self.identity,
                salt,
                parent,
                hash,
                tokens: tokens.to_vec(),
                payload_len: payload.len(),
            },
            payload,
        };
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.shared.lock_index().remove(hash);
                false
            }
        }
    }

    /// Forgets a claimed block that will not be written after all.
    pub fn unclaim(&self, hash: u64) {
        self.shared.lock_index().remove(hash);
    }

    /// Waits until the writer has written everything queued so far (tests).
    #[cfg(test)]
    pub fn flush(&mut self) {
        if let Some(tx) = self.tx.take() {
            drop(tx);
            if let Some(w) = self.writer.take() {
                let _ = w.join();
            }
            let (tx, rx) = mpsc::sync_channel(queue_blocks(self.block_bytes));
            let (recycle_tx, recycle) = mpsc::channel();
            let sh = self.shared.clone();
            self.writer = Some(std::thread::spawn(move || writer::run(sh, rx, recycle_tx)));
            self.tx = Some(tx);
            self.recycle = recycle;
        }
    }
}

impl Drop for DiskTier {
    /// Closes the queue and waits for the writer to drain it and fsync.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
