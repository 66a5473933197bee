//! The wire format of KV-cache events: the cache's changes grouped into vLLM's
//! events (`BlockStored` chains, `BlockRemoved` runs, `AllBlocksCleared`; salted
//! blocks left out, token ids only when asked), each store and removal with the
//! medium that holds the block, and encoded as msgspec writes a `KVEventBatch`
//! (`array_like`, tagged).

use std::collections::HashSet;

use sloserve_engine::prefix_cache::{root_hash, CacheChange};

/// The medium of the RAM tier's blocks (the KV pool). vLLM writes "GPU" for its
/// device's blocks and "CPU" for those offloaded to host memory; llm-d's
/// indexer lowercases the medium into its device tier and weighs tiers by name
/// (its defaults: "gpu" 1.0, "cpu" 0.8; an unnamed tier 1.0). Ours live in host
/// RAM: "cpu", the tier llm-d's P2P source producer reads as pull-servable.
pub const MEDIUM_RAM: &str = "cpu";
/// The medium of the disk tier's blocks (`--prefix-cache-dir`): "disk", the name
/// llm-d's backend configuration gives a disk tier ("gpu", "cpu", "disk").
pub const MEDIUM_DISK: &str = "disk";

/// One event of a batch, before encoding.
#[derive(Debug, PartialEq)]
enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        medium: &'static str,
    },
    Removed(Vec<u64>, &'static str),
    Cleared,
}

/// Turns the cache's changes into vLLM's events: consecutive blocks of one chain
/// and medium in one `BlockStored`, consecutive removals of one medium in one
/// `BlockRemoved`; salted blocks left out (it remembers which hashes it
/// published, per medium); token ids only when asked.
#[derive(Default)]
pub struct Encoder {
    published: HashSet<u64>,
    /// The disk tier's blocks published (`MEDIUM_DISK`).
    published_disk: HashSet<u64>,
    token_ids: bool,
    /// Tokens per block (0: from the batch's tokens per stored block).
    block_size: usize,
}

impl Encoder {
    /// `token_ids`: each `BlockStored` carries its blocks' token ids (else none).
    pub fn new(token_ids: bool, block_size: usize) -> Self {
        Encoder {
            published: HashSet::new(),
            published_disk: HashSet::new(),
            token_ids,
            block_size,
        }
    }

    /// The msgpack `KVEventBatch` of `changes` (`None` when nothing is published).
    pub fn batch(&mut self, changes: &[CacheChange], tokens: &[u32], ts: f64) -> Option<Vec<u8>> {
        let stored = changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    CacheChange::Stored { .. } | CacheChange::DiskStored { .. }
                )
            })
            .count();
        let block_size = match self.block_size {
            0 => tokens.len().checked_div(stored).unwrap_or(0),
            bs => bs,
        };
        let events = self.events(changes, tokens, block_size);
        if events.is_empty() {
            return None;
        }
        Some(encode(&events, block_size, ts))
    }

    fn events(&mut self, changes: &[CacheChange], tokens: &[u32], bs: usize) -> Vec<Event> {
        let root = root_hash(0);
        let mut out: Vec<Event> = Vec::new();
        let mut chunks = tokens.chunks_exact(bs.max(1));
        for c in changes {
            match *c {
                CacheChange::Cleared => {
                    // A new engine cache (llm-d clears the pod's every tier): the
                    // disk tier logs its blocks again after it.
                    self.published.clear();
                    self.published_disk.clear();
                    out.push(Event::Cleared);
                }
                CacheChange::Stored { hash, parent, .. } => {
                    let chunk = chunks.next().unwrap_or(&[]);
                    if parent != root && !self.published.contains(&parent) {
                        continue; // under a salt
                    }
                    self.published.insert(hash);
                    let chunk = if self.token_ids { chunk } else { &[] };
                    stored(&mut out, hash, parent != root, parent, chunk, MEDIUM_RAM);
                }
                CacheChange::DiskStored { hash, parent, salt } => {
                    let chunk = chunks.next().unwrap_or(&[]);
                    if salt != 0 {
                        continue; // under a salt
                    }
                    self.published_disk.insert(hash);
                    let chunk = if self.token_ids { chunk } else { &[] };
                    stored(&mut out, hash, parent != root, parent, chunk, MEDIUM_DISK);
                }
                CacheChange::Removed { hash } => {
                    if self.published.remove(&hash) {
                        removed(&mut out, hash, MEDIUM_RAM);
                    }
                }
                CacheChange::DiskRemoved { hash } => {
                    if self.published_disk.remove(&hash) {
                        removed(&mut out, hash, MEDIUM_DISK);
                    }
                }
            }
        }
        out
    }
}

/// Appends block `hash` (under `parent` when `has_parent`) to the last event when
/// it continues that event's chain on the same medium, else as a new `BlockStored`.
fn stored(
    out: &mut Vec<Event>,
    hash: u64,
    has_parent: bool,
    parent: u64,
    chunk: &[u32],
    medium: &'static str,
) {
    if let Some(Event::Stored {
        hashes,
        tokens,
        medium: m,
        ..
    }) = out.last_mut()
    {
        if *m == medium && has_parent && hashes.last() == Some(&parent) {
            hashes.push(hash);
            tokens.extend_from_slice(chunk);
            return;
        }
    }
    out.push(Event::Stored {
        hashes: vec![hash],
        parent: has_parent.then_some(parent),
        tokens: chunk.to_vec(),
        medium,
    });
}

/// Appends `hash` to the last event when it is a removal on the same medium.
fn removed(out: &mut Vec<Event>, hash: u64, medium: &'static str) {
    match out.last_mut() {
        Some(Event::Removed(hashes, m)) if *m == medium => hashes.push(hash),
        _ => out.push(Event::Removed(vec![hash], medium)),
    }
}

/// msgspec's `array_like=True, tag=True` layout; writes to a `Vec` cannot fail.
fn encode(events: &[Event], block_size: usize, ts: f64) -> Vec<u8> {
    use rmp::encode as w;
    let mut b = Vec::with_capacity(64 + events.len() * 32);
    let hashes = |b: &mut Vec<u8>, hs: &[u64]| {
        w::write_array_len(b, hs.len() as u32).unwrap();
        for &h in hs {
            w::write_u64(b, h).unwrap(); // always the 9-byte form: a uint64 to any reader
        }
    };
    // vLLM's KVEventBatch: [ts, events, data_parallel_rank]. The rank is not optional
    // on the wire: llm-d-router decodes the batch as a 3-field array struct and refuses
    // any other length ("number of fields in array-encoded struct has changed"). One
    // replica is data-parallel rank 0, as vLLM sends it.
    w::write_array_len(&mut b, 3).unwrap();
    w::write_f64(&mut b, ts).unwrap();
    w::write_array_len(&mut b, events.len() as u32).unwrap();
    for e in events {
        match e {
            Event::Stored {
                hashes: hs,
                parent,
                tokens,
                medium,
            } => {
                w::write_array_len(&mut b, 7).unwrap();
                w::write_str(&mut b, "BlockStored").unwrap();
                hashes(&mut b, hs);
                match parent {
                    Some(p) => w::write_u64(&mut b, *p).unwrap(),
                    None => w::write_nil(&mut b).unwrap(),
                }
                w::write_array_len(&mut b, tokens.len() as u32).unwrap();
                for &t in tokens {
                    w::write_uint(&mut b, t as u64).unwrap();
                }
                w::write_uint(&mut b, block_size as u64).unwrap();
                w::write_nil(&mut b).unwrap(); // lora_id
                w::write_str(&mut b, medium).unwrap();
            }
            Event::Removed(hs, medium) => {
                w::write_array_len(&mut b, 3).unwrap();
                w::write_str(&mut b, "BlockRemoved").unwrap();
                hashes(&mut b, hs);
                w::write_str(&mut b, medium).unwrap();
            }
            Event::Cleared => {
                w::write_array_len(&mut b, 1).unwrap();
                w::write_str(&mut b, "AllBlocksCleared").unwrap();
            }
        }
    }
    w::write_uint(&mut b, 0).unwrap(); // data_parallel_rank
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use sloserve_engine::prefix_cache::chain_hash;

    #[test]
    fn chains_group_salted_blocks_stay_private() {
        let r = root_hash(0);
        let h1 = chain_hash(r, &[1, 2]);
        let h2 = chain_hash(h1, &[3, 4]);
        let s1 = chain_hash(root_hash(7), &[1, 2]);
        let s2 = chain_hash(s1, &[5, 6]);
        let changes = [
            CacheChange::Cleared,
            CacheChange::Stored {
                hash: h1,
                parent: r,
                block: 0,
                salt: 0,
            },
            CacheChange::Stored {
                hash: h2,
                parent: h1,
                block: 0,
                salt: 0,
            },
            CacheChange::Stored {
                hash: s1,
                parent: root_hash(7),
                block: 0,
                salt: 0,
            },
            CacheChange::Stored {
                hash: s2,
                parent: s1,
                block: 0,
                salt: 0,
            },
            CacheChange::Removed { hash: s2 },
            CacheChange::Removed { hash: h2 },
            CacheChange::Removed { hash: h1 },
        ];
        let mut enc = Encoder::new(true, 2);
        let ev = enc.events(&changes, &[1, 2, 3, 4, 1, 2, 5, 6], 2);
        assert_eq!(
            ev,
            vec![
                Event::Cleared,
                Event::Stored {
                    hashes: vec![h1, h2],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                    medium: MEDIUM_RAM,
                },
                Event::Removed(vec![h2, h1], MEDIUM_RAM),
            ]
        );
        // A child of a published block stored later names its parent.
        let h3 = chain_hash(h1, &[9, 9]);
        enc.published.insert(h1);
        let ev = enc.events(
            &[CacheChange::Stored {
                hash: h3,
                parent: h1,
                block: 0,
                salt: 0,
            }],
            &[9, 9],
            2,
        );
        assert_eq!(
            ev,
            vec![Event::Stored {
                hashes: vec![h3],
                parent: Some(h1),
                tokens: vec![9, 9],
                medium: MEDIUM_RAM,
            }]
        );
        // The disk tier's blocks: their own medium, chained apart from RAM's
        // stores even when they continue them, salted ones left out; a removal
        // is published once per medium that published the block.
        let disk = |hash, parent, salt| CacheChange::DiskStored { hash, parent, salt };
        let ev = enc.events(
            &[
                disk(h1, r, 0),
                disk(h3, h1, 0),
                disk(s1, root_hash(7), 7),
                CacheChange::DiskRemoved { hash: s1 },
                CacheChange::DiskRemoved { hash: h3 },
                CacheChange::Removed { hash: h3 },
                CacheChange::Removed { hash: h3 },
                CacheChange::DiskRemoved { hash: h3 },
            ],
            &[1, 2, 9, 9, 1, 2],
            2,
        );
        assert_eq!(
            ev,
            vec![
                Event::Stored {
                    hashes: vec![h1, h3],
                    parent: None,
                    tokens: vec![1, 2, 9, 9],
                    medium: MEDIUM_DISK,
                },
                Event::Removed(vec![h3], MEDIUM_DISK),
                Event::Removed(vec![h3], MEDIUM_RAM),
            ]
        );
        // Nothing published: no message.
        assert!(Encoder::default()
            .batch(&[CacheChange::Removed { hash: 5 }], &[], 0.0)
            .is_none());
    }

    #[test]
    fn batches_are_msgspec_arrays() {
        let b = encode(
            &[
                Event::Stored {
                    hashes: vec![7],
                    parent: None,
                    tokens: vec![1, 300],
                    medium: MEDIUM_RAM,
                },
                Event::Removed(vec![7], MEDIUM_RAM),
                Event::Stored {
                    hashes: vec![8],
                    parent: Some(7),
                    tokens: vec![],
                    medium: MEDIUM_DISK,
                },
                Event::Cleared,
            ],
            2,
            1.5,
        );
        let v: serde_json::Value = rmp_serde::from_slice(&b).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                1.5,
                [
                    ["BlockStored", [7], null, [1, 300], 2, null, "cpu"],
                    ["BlockRemoved", [7], "cpu"],
                    ["BlockStored", [8], 7, [], 2, null, "disk"],
                    ["AllBlocksCleared"]
                ],
                0
            ])
        );
        // Hashes are uint64 on the wire whatever their size (0xcf, 8 bytes).
        let at = b
            .windows(9)
            .position(|w| w == [0xcf, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert!(at.is_some());
    }
}
