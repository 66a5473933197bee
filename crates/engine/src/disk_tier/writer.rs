//! The disk tier's writer thread: takes spilled blocks from a bounded queue,
//! writes each to a temporary file and renames it into place (a reader never sees
//! half a file under a block's name), records it in the index and evicts the
//! least recently used files past the size limit. Block files are not fsynced one
//! by one: a killed process loses only what was still queued (the page cache holds
//! what was written); a power loss may tear the newest files, which their checksum
//! catches. When the queue closes (clean shutdown) it drains it, then fsyncs every
//! file it wrote and the directory.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use super::file::{self, BlockHeader};
use super::Shared;

/// One block to write: its header and the runner's bytes of it.
pub struct Job {
    pub header: BlockHeader,
    pub payload: Vec<u8>,
}

fn write_file(dir: &Path, hash: u64, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{hash:016x}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, file::path_of(dir, hash))
}

/// The thread's loop (see the module docs); spent payload buffers go back on
/// `recycle` for the next spills.
pub fn run(shared: Arc<Shared>, rx: Receiver<Job>, recycle: Sender<Vec<u8>>) {
    let mut buf = Vec::new();
    let mut written = Vec::new();
    let mut evict = Vec::new();
    while let Ok(job) = rx.recv() {
        let h = job.header.hash;
        file::encode(&job.header, &job.payload, &mut buf);
        let _ = recycle.send(job.payload);
        match write_file(&shared.dir, h, &buf) {
            Ok(()) => {
                let c = &shared.counters;
                c.bytes_written
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                c.blocks_written.fetch_add(1, Ordering::Relaxed);
                written.push(h);
                let mut index = shared.lock_index();
                let (salt, parent) = (job.header.salt, job.header.parent);
                index.written(h, salt, parent);
                index.note_stored(h, parent, salt, &job.header.tokens);
                while index.bytes() > shared.max_bytes {
                    match index.pop_oldest() {
                        Some(old) => {
                            index.note_removed(old);
                            evict.push(old);
                        }
                        None => break,
                    }
                }
                shared.publish_gauges(&index);
                shared.changes_pending.store(true, Ordering::Release);
            }
            Err(e) => {
                shared.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(dir = %shared.dir.display(), error = %e, "prefix-cache disk tier: a block write failed");
                shared.lock_index().remove(h);
            }
        }
        for old in evict.drain(..) {
            let _ = std::fs::remove_file(file::path_of(&shared.dir, old));
            shared
                .counters
                .blocks_evicted
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    // Clean shutdown: make what this run wrote durable.
    for h in written {
        if let Ok(f) = std::fs::File::open(file::path_of(&shared.dir, h)) {
            let _ = f.sync_all();
        }
    }
    if let Ok(d) = std::fs::File::open(&shared.dir) {
        let _ = d.sync_all();
    }
}
