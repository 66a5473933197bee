//! What other threads see of the disk tier: at `submit`, how much of a prompt's
//! prefix continues on disk past its RAM hit (admission predicts the TTFT from
//! the rest, loading being cheap), and a prefetch of those blocks' files while
//! the request waits in the queue: the kernel is asked to read them ahead
//! (`posix_fadvise(WILLNEED)` on a thread of its own), so the engine thread's
//! read at admission finds them in the page cache.

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::{file, Shared};
use crate::prefix_cache::{chain_hash, root_hash};

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct DiskView {
    shared: Arc<Shared>,
    block_size: usize,
    prefetch: Arc<Mutex<Sender<Vec<PathBuf>>>>,
}

impl DiskView {
    pub(super) fn new(shared: Arc<Shared>, block_size: usize) -> Result<DiskView, String> {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<PathBuf>>();
        std::thread::Builder::new()
            .name("sloserve-kv-prefetch".into())
            .spawn(move || {
                while let Ok(paths) = rx.recv() {
                    for p in paths {
                        read_ahead(&p);
                    }
                }
            })
            .map_err(|e| format!("cannot spawn the disk tier's prefetch thread: {e}"))?;
        Ok(DiskView {
            shared,
            block_size,
            prefetch: Arc::new(Mutex::new(tx)),
        })
    }

    /// Tokens of `prompt` (all but its last) on disk under `salt` past its first
    /// `cached` tokens (a whole number of blocks), their files read ahead.
    pub fn prefetch(&self, salt: u64, prompt: &[u32], cached: usize) -> usize {
        let bs = self.block_size;
        let usable = prompt.len().saturating_sub(1);
        if bs == 0 || !cached.is_multiple_of(bs) || usable < cached + bs {
            return 0;
        }
        let mut parent = root_hash(salt);
        let mut chunks = prompt[..usable].chunks_exact(bs);
        for c in chunks.by_ref().take(cached / bs) {
            parent = chain_hash(parent, c);
        }
        let mut paths = Vec::new();
        {
            let index = self.shared.lock_index();
            for c in chunks {
                let hash = chain_hash(parent, c);
                if !index.is_written(hash, salt, parent) {
                    break;
                }
                paths.push(file::path_of(&self.shared.dir, hash));
                parent = hash;
            }
        }
        let n = paths.len() * bs;
        if !paths.is_empty() {
            let tx = self.prefetch.lock().unwrap_or_else(|e| e.into_inner());
            let _ = tx.send(paths);
        }
        n
    }
}

/// Asks the kernel to read `path` into the page cache, without waiting.
fn read_ahead(path: &std::path::Path) {
    let Ok(f) = std::fs::File::open(path) else {
        return;
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `f` is an open file for the whole call; posix_fadvise only
        // advises the kernel about its pages (offset 0, length 0: the whole file)
        // and touches no memory of ours.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        use std::io::Read;
        let mut sink = Vec::new();
        let _ = (&f).read_to_end(&mut sink);
    }
}
