//! KV-cache events over ZMQ, as vLLM publishes them (`--kv-events-endpoint`), for
//! the llm-d endpoint picker's precise prefix-cache scorer: a PUB socket sends
//! multipart messages `[topic, sequence (8 bytes, big-endian), payload]`, the
//! payload vLLM's `KVEventBatch` in msgpack as msgspec writes it
//! (`array_like`, tagged): `[ts, [event, ...]]` with events
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//! lora_id, medium]`, `["BlockRemoved", block_hashes, medium]` and
//! `["AllBlocksCleared"]`.
//!
//! The engine hands the prefix cache's changes to a sink on its thread
//! ([`Engine::start_with_cache_sink`]); the sink only copies them into a channel,
//! and a thread of its own encodes and sends. Hashes are the cache's own chain
//! hashes, always written as 64-bit unsigned ints: the picker computes its own
//! keys from each event's token ids and its parent's key, so ours need only be
//! stable names (a block's parent is the hash of a block stored before it, `nil`
//! at the root). Blocks cached under a salt (`cache_salt`, per-key scope) are
//! not published: no other request can reuse them, and the picker could not key
//! them.

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use sloserve_engine::engine::CacheSink;
use sloserve_engine::prefix_cache::{root_hash, CacheChange};
use sloserve_engine::{Engine, EngineConfig, EngineHandle, ModelRunner};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

use crate::args::ServeArgs;

#[derive(Args, Debug, Clone, Default)]
pub struct KvEventsArgs {
    /// Publish KV-cache events (vLLM's, for the llm-d EPP's precise prefix
    /// scorer) on a ZMQ PUB socket: bound for a wildcard host (tcp://*:5557, the
    /// EPP dials each replica), else connected to (a subscriber that binds). Off
    /// unless given.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// The topic of every message [default: kv@<host>:<port>@<served model name>].
    #[arg(long)]
    pub kv_events_topic: Option<String>,
}

/// One turn's changes and the token ids of the blocks they store.
type Changes = (Vec<CacheChange>, Vec<u32>);

/// Starts the engine, with the publisher when `--kv-events-endpoint` is given
/// (bound before this returns: a bad endpoint is a startup error).
pub fn start_engine(
    args: &ServeArgs,
    runner: Box<dyn ModelRunner>,
    cfg: EngineConfig,
) -> anyhow::Result<EngineHandle> {
    let Some(endpoint) = args.kv_events.kv_events_endpoint.clone() else {
        return Ok(Engine::start(runner, cfg)?);
    };
    let topic = args
        .kv_events
        .kv_events_topic
        .clone()
        .unwrap_or_else(|| format!("kv@{}:{}@{}", args.host, args.port, args.model_name()));
    let (tx, rx) = mpsc::unbounded_channel::<Changes>();
    let bound = spawn_publisher(&endpoint, topic.clone(), rx)?;
    tracing::info!(endpoint = %bound, %topic, "publishing KV-cache events (ZMQ PUB)");
    let sink: CacheSink = Box::new(move |changes: &[CacheChange], tokens: &[u32]| {
        let _ = tx.send((changes.to_vec(), tokens.to_vec()));
    });
    Ok(Engine::start_with_cache_sink(runner, cfg, Some(sink))?)
}

/// Binds the PUB socket on a thread of its own (a one-thread runtime) that
/// encodes and sends what arrives on `rx`; returns the bound endpoint.
fn spawn_publisher(
    endpoint: &str,
    topic: String,
    mut rx: mpsc::UnboundedReceiver<Changes>,
) -> anyhow::Result<String> {
    let bind = binds(endpoint);
    // zeromq-rs binds host names literally; `*` (libzmq's "every interface") is 0.0.0.0.
    let endpoint = endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<String>>();
    std::thread::Builder::new()
        .name("sloserve-kv-events".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let mut socket = zeromq::PubSocket::new();
                if bind {
                    match socket.bind(&endpoint).await {
                        Ok(at) => {
                            let _ = ready_tx.send(Ok(at.to_string()));
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(anyhow::anyhow!("{e}")));
                            return;
                        }
                    }
                } else {
                    // Connecting waits for the subscriber's side; batches queue meanwhile.
                    let _ = ready_tx.send(Ok(format!("{endpoint} (connecting)")));
                    if let Err(e) = socket.connect(&endpoint).await {
                        tracing::error!("cannot connect the KV-events socket to {endpoint}: {e}");
                        return;
                    }
                    // Batches published before this went nowhere (a PUB keeps none).
                    tracing::info!("KV-events socket connected to {endpoint}");
                }
                let mut enc = Encoder::default();
                let mut seq: u64 = 0;
                while let Some((changes, tokens)) = rx.recv().await {
                    let Some(payload) = enc.batch(&changes, &tokens, unix_secs()) else {
                        continue;
                    };
                    let frames = vec![
                        Bytes::from(topic.clone().into_bytes()),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        Bytes::from(payload),
                    ];
                    seq += 1;
                    let msg = ZmqMessage::try_from(frames).expect("three frames");
                    if let Err(e) = socket.send(msg).await {
                        tracing::warn!("cannot publish KV-cache events: {e}");
                    }
                }
            });
        })
        .context("cannot start the KV-events thread")?;
    ready_rx
        .recv()
        .context("the KV-events thread stopped")?
        .with_context(|| "cannot bind the KV-events socket (--kv-events-endpoint)")
}

/// vLLM's rule: an endpoint with a wildcard host (`*`, `::`) or an `ipc://` path
/// is bound (the EPP dials each replica); any other is connected to (a
/// subscriber that binds, e.g. one central indexer).
fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::") || endpoint.starts_with("ipc://")
}

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One event of a batch, before encoding.
#[derive(Debug, PartialEq)]
enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
    },
    Removed(Vec<u64>),
    Cleared,
}

/// Turns the cache's changes into vLLM's events: consecutive blocks of one chain
/// in one `BlockStored`, consecutive removals in one `BlockRemoved`; salted blocks
/// left out (it remembers which hashes it published).
#[derive(Default)]
pub struct Encoder {
    published: HashSet<u64>,
}

impl Encoder {
    /// The msgpack `KVEventBatch` of `changes` (`None` when nothing is published).
    pub fn batch(&mut self, changes: &[CacheChange], tokens: &[u32], ts: f64) -> Option<Vec<u8>> {
        let stored = changes
            .iter()
            .filter(|c| matches!(c, CacheChange::Stored { .. }))
            .count();
        let block_size = tokens.len().checked_div(stored).unwrap_or(0);
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
                    self.published.clear();
                    out.push(Event::Cleared);
                }
                CacheChange::Stored { hash, parent } => {
                    let chunk = chunks.next().unwrap_or(&[]);
                    if parent != root && !self.published.contains(&parent) {
                        continue; // under a salt
                    }
                    self.published.insert(hash);
                    if let Some(Event::Stored { hashes, tokens, .. }) = out.last_mut() {
                        if hashes.last() == Some(&parent) {
                            hashes.push(hash);
                            tokens.extend_from_slice(chunk);
                            continue;
                        }
                    }
                    out.push(Event::Stored {
                        hashes: vec![hash],
                        parent: (parent != root).then_some(parent),
                        tokens: chunk.to_vec(),
                    });
                }
                CacheChange::Removed { hash } => {
                    if !self.published.remove(&hash) {
                        continue;
                    }
                    match out.last_mut() {
                        Some(Event::Removed(hashes)) => hashes.push(hash),
                        _ => out.push(Event::Removed(vec![hash])),
                    }
                }
            }
        }
        out
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
                w::write_str(&mut b, "GPU").unwrap(); // medium
            }
            Event::Removed(hs) => {
                w::write_array_len(&mut b, 3).unwrap();
                w::write_str(&mut b, "BlockRemoved").unwrap();
                hashes(&mut b, hs);
                w::write_str(&mut b, "GPU").unwrap();
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
    fn wildcards_bind_others_connect() {
        assert!(binds("tcp://*:5557") && binds("tcp://[::]:5557") && binds("ipc:///tmp/kv"));
        assert!(!binds("tcp://127.0.0.1:5557") && !binds("tcp://indexer:5557"));
    }

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
            },
            CacheChange::Stored {
                hash: h2,
                parent: h1,
            },
            CacheChange::Stored {
                hash: s1,
                parent: root_hash(7),
            },
            CacheChange::Stored {
                hash: s2,
                parent: s1,
            },
            CacheChange::Removed { hash: s2 },
            CacheChange::Removed { hash: h2 },
            CacheChange::Removed { hash: h1 },
        ];
        let mut enc = Encoder::default();
        let ev = enc.events(&changes, &[1, 2, 3, 4, 1, 2, 5, 6], 2);
        assert_eq!(
            ev,
            vec![
                Event::Cleared,
                Event::Stored {
                    hashes: vec![h1, h2],
                    parent: None,
                    tokens: vec![1, 2, 3, 4]
                },
                Event::Removed(vec![h2, h1]),
            ]
        );
        // A child of a published block stored later names its parent.
        let h3 = chain_hash(h1, &[9, 9]);
        enc.published.insert(h1);
        let ev = enc.events(
            &[CacheChange::Stored {
                hash: h3,
                parent: h1,
            }],
            &[9, 9],
            2,
        );
        assert_eq!(
            ev,
            vec![Event::Stored {
                hashes: vec![h3],
                parent: Some(h1),
                tokens: vec![9, 9]
            }]
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
                },
                Event::Removed(vec![7]),
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
                    ["BlockStored", [7], null, [1, 300], 2, null, "GPU"],
                    ["BlockRemoved", [7], "GPU"],
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
