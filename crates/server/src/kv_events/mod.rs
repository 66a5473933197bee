//! KV-cache events over ZMQ, as vLLM publishes them (`--kv-events-endpoint`), for
//! the llm-d endpoint picker's precise prefix-cache scorer: a PUB socket sends
//! multipart messages `[topic, sequence (8 bytes, big-endian), payload]`, the
//! payload vLLM's `KVEventBatch` in msgpack as msgspec writes it
//! (`array_like`, tagged): `[ts, [event, ...]]` with events
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//! lora_id, medium]`, `["BlockRemoved", block_hashes, medium]` and
//! `["AllBlocksCleared"]`. The medium says which tier holds the block: "cpu" for
//! the RAM prefix cache, "disk" for the disk tier (`--prefix-cache-dir`: blocks
//! as the writer finishes their files, those found at start, and files deleted;
//! `wire.rs` says why these names).
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
//!
//! What leaves the process (docs/security.md, "KV events threat model"): a
//! block's token ids decode to the prompt, so they are published only with
//! `--kv-events-token-ids` (otherwise each `BlockStored` carries its hashes and an
//! empty token list); the socket is bound only where it is told, loopback when
//! the host is left out (`tcp://:5557`), every interface (`tcp://*:5557`) only
//! with `--kv-events-allow-wildcard`. The queue to the publishing thread is
//! bounded: a batch that finds it full is dropped and counted
//! (`sloserve:kv_events_dropped_total`), never held on the engine's thread.

mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use sloserve_engine::engine::CacheSink;
use sloserve_engine::prefix_cache::CacheChange;
use sloserve_engine::{Engine, EngineConfig, EngineHandle, ModelRunner};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

pub use wire::Encoder;

#[derive(Args, Debug, Clone, Default)]
pub struct KvEventsArgs {
    /// Publish KV-cache events (vLLM's, for the llm-d EPP's precise prefix
    /// scorer) on a ZMQ PUB socket. Bound on loopback when the host is left out
    /// (tcp://:5557), on every interface for tcp://*:5557 (only with
    /// --kv-events-allow-wildcard), on an ipc:// path as given; any other host
    /// is a subscriber that binds, connected to. Off unless given.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// The topic of every message [default: kv@<host>:<port>@<served model name>].
    #[arg(long)]
    pub kv_events_topic: Option<String>,
    /// Let --kv-events-endpoint bind every interface (tcp://*:PORT, 0.0.0.0,
    /// [::]): the socket has no authentication, so anyone who reaches the port
    /// reads the events.
    #[arg(long)]
    pub kv_events_allow_wildcard: bool,
    /// Publish each stored block's token ids (they decode to the prompt; the
    /// llm-d precise prefix scorer needs them). Without it a `BlockStored` carries
    /// the block hashes and an empty token list.
    #[arg(long)]
    pub kv_events_token_ids: bool,
}

/// One turn's changes and the token ids of the blocks they store.
type Changes = (Vec<CacheChange>, Vec<u32>);

/// Batches waiting for the publishing thread at most; past it a batch is dropped.
const QUEUE: usize = 1024;

/// Batches dropped because the queue was full (`sloserve:kv_events_dropped_total`).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Batches dropped since start because the publisher's queue was full.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Where the socket goes.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// Bound here (a zeromq endpoint).
    Bind(String),
    /// Connected to a subscriber that binds.
    Connect(String),
}

/// `--kv-events-endpoint` read: a left-out host binds loopback; a wildcard host
/// (`*`, `0.0.0.0`, `[::]`) binds every interface, only when `allow_wildcard`;
/// `ipc://` binds its path; any other host is connected to (vLLM's rule).
fn target(endpoint: &str, allow_wildcard: bool) -> anyhow::Result<Target> {
    if endpoint.starts_with("ipc://") {
        return Ok(Target::Bind(endpoint.to_owned()));
    }
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        anyhow::bail!("--kv-events-endpoint {endpoint:?}: expected tcp://HOST:PORT, tcp://:PORT or ipc://PATH");
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        anyhow::bail!("--kv-events-endpoint {endpoint:?}: no port (tcp://HOST:PORT)");
    };
    match host {
        "" => Ok(Target::Bind(format!("tcp://127.0.0.1:{port}"))),
        "*" | "0.0.0.0" | "[::]" | "::" if !allow_wildcard => anyhow::bail!(
            "--kv-events-endpoint {endpoint}: that binds every interface, and the socket has \
             no authentication; bind loopback (tcp://:{port}), connect to a subscriber \
             (tcp://HOST:{port}), or pass --kv-events-allow-wildcard"
        ),
        "*" | "0.0.0.0" => Ok(Target::Bind(format!("tcp://0.0.0.0:{port}"))),
        "[::]" | "::" => Ok(Target::Bind(format!("tcp://[::]:{port}"))),
        _ => Ok(Target::Connect(endpoint.to_owned())),
    }
}

/// Starts the engine, with the publisher when `--kv-events-endpoint` is given
/// (bound before this returns: a bad endpoint is a startup error).
/// `default_topic`: `kv@HOST:PORT@MODEL`; `keys_share_cache`: API keys are
/// configured and share the unsalted cache (`--prefix-cache-scope global`).
pub fn start_engine(
    kv: &KvEventsArgs,
    default_topic: String,
    keys_share_cache: bool,
    runner: Box<dyn ModelRunner>,
    cfg: EngineConfig,
) -> anyhow::Result<EngineHandle> {
    let Some(endpoint) = kv.kv_events_endpoint.clone() else {
        return Ok(Engine::start(runner, cfg)?);
    };
    let target = target(&endpoint, kv.kv_events_allow_wildcard)?;
    let topic = kv.kv_events_topic.clone().unwrap_or(default_topic);
    let (tx, rx) = mpsc::channel::<Changes>(QUEUE);
    let token_ids = kv.kv_events_token_ids;
    if token_ids && keys_share_cache {
        // Salted blocks are never published; under the global scope keys share the
        // unsalted cache, so their prompts' token ids go out too.
        tracing::warn!(
            "--kv-events-token-ids with API keys under --prefix-cache-scope global: every \
             key's prompt token ids are published on the KV-events socket"
        );
    }
    let enc = Encoder::new(token_ids, runner.info().block_size);
    let bound = spawn_publisher(target, topic.clone(), enc, rx)?;
    tracing::info!(endpoint = %bound, %topic, token_ids, "publishing KV-cache events (ZMQ PUB)");
    let sink: CacheSink = Box::new(move |changes: &[CacheChange], tokens: &[u32]| {
        let tokens = if token_ids {
            tokens.to_vec()
        } else {
            Vec::new()
        };
        if tx.capacity() == 0 || tx.try_send((changes.to_vec(), tokens)).is_err() {
            note_drop();
        }
    });
    Ok(Engine::start_with_cache_sink(runner, cfg, Some(sink))?)
}

/// A batch that found the queue full (or the publisher gone): counted, and
/// warned about once.
fn note_drop() {
    if DROPPED.fetch_add(1, Ordering::Relaxed) == 0 {
        tracing::warn!(
            "KV-events queue full (the publisher is not connected or not keeping up): \
             batches are dropped and counted in sloserve:kv_events_dropped_total"
        );
    }
}

/// How often a connecting publisher says it is still not connected.
const CONNECT_NAG: Duration = Duration::from_secs(10);

/// Binds (or connects) the PUB socket on a thread of its own (a one-thread
/// runtime) that encodes and sends what arrives on `rx`; returns the bound
/// endpoint.
fn spawn_publisher(
    target: Target,
    topic: String,
    mut enc: Encoder,
    mut rx: mpsc::Receiver<Changes>,
) -> anyhow::Result<String> {
    let (bind, endpoint) = match target {
        Target::Bind(e) => (true, e),
        Target::Connect(e) => (false, e),
    };
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
                    // Connecting waits for the subscriber's side; batches queue
                    // meanwhile, then are dropped (counted) once the queue is full.
                    let _ = ready_tx.send(Ok(format!("{endpoint} (connecting)")));
                    let connected = {
                        let connect = socket.connect(&endpoint);
                        tokio::pin!(connect);
                        let t0 = std::time::Instant::now();
                        loop {
                            tokio::select! {
                                r = &mut connect => break r,
                                _ = tokio::time::sleep(CONNECT_NAG) => tracing::warn!(
                                    %endpoint, waited_s = t0.elapsed().as_secs(),
                                    "the KV-events socket is not connected yet (is the subscriber up?)"
                                ),
                            }
                        }
                    };
                    if let Err(e) = connected {
                        tracing::error!(%endpoint, "cannot connect the KV-events socket: {e}; no events will be published");
                        return;
                    }
                    // Batches published before this went nowhere (a PUB keeps none).
                    tracing::info!(%endpoint, "KV-events socket connected");
                }
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

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sloserve_engine::prefix_cache::{chain_hash, root_hash};

    #[test]
    fn loopback_by_default_wildcards_only_when_allowed_others_connect() {
        let bind = |e: &str| Target::Bind(e.to_owned());
        assert_eq!(
            target("tcp://:5557", false).unwrap(),
            bind("tcp://127.0.0.1:5557")
        );
        for wild in ["tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557"] {
            let e = target(wild, false).unwrap_err().to_string();
            assert!(e.contains("--kv-events-allow-wildcard"), "{e}");
        }
        assert_eq!(
            target("tcp://*:5557", true).unwrap(),
            bind("tcp://0.0.0.0:5557")
        );
        assert_eq!(
            target("tcp://[::]:5557", true).unwrap(),
            bind("tcp://[::]:5557")
        );
        assert_eq!(
            target("ipc:///tmp/kv", false).unwrap(),
            bind("ipc:///tmp/kv")
        );
        let to = |e: &str| Target::Connect(e.to_owned());
        assert_eq!(
            target("tcp://127.0.0.1:5557", false).unwrap(),
            to("tcp://127.0.0.1:5557")
        );
        assert_eq!(
            target("tcp://indexer:5557", false).unwrap(),
            to("tcp://indexer:5557")
        );
        assert!(target("udp://x:1", false).is_err() && target("tcp://x", false).is_err());
    }

    /// The publisher bound on loopback (`tcp://:PORT`), a SUB connected: by default
    /// a `BlockStored` carries hashes and no token ids.
    #[test]
    fn a_subscriber_gets_hashes_without_token_ids_by_default() {
        use zeromq::SocketRecv;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let Target::Bind(at) = target(&format!("tcp://:{port}"), false).unwrap() else {
            panic!("binds")
        };
        let (tx, rx) = mpsc::channel::<Changes>(QUEUE);
        let bound =
            spawn_publisher(Target::Bind(at), "kv@t".into(), Encoder::new(false, 2), rx).unwrap();
        assert_eq!(bound, format!("tcp://127.0.0.1:{port}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ev = rt.block_on(async {
            let mut sub = zeromq::SubSocket::new();
            sub.subscribe("kv@").await.unwrap();
            sub.connect(&bound).await.unwrap();
            let h = chain_hash(root_hash(0), &[11, 12]);
            let change = CacheChange::Stored {
                hash: h,
                parent: root_hash(0),
                block: 0,
                salt: 0,
            };
            // A subscription reaches the PUB a moment after the connect: publish
            // until one batch arrives.
            loop {
                let batch = (vec![CacheChange::Cleared, change], vec![11, 12]);
                tx.send(batch).await.unwrap();
                let recv = tokio::time::timeout(Duration::from_millis(200), sub.recv());
                if let Ok(m) = recv.await {
                    let frames = m.unwrap().into_vec();
                    let v: serde_json::Value = rmp_serde::from_slice(&frames[2]).unwrap();
                    break v[1].clone();
                }
            }
        });
        let stored = ev
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e[0] == "BlockStored")
            .cloned()
            .unwrap();
        assert_eq!(stored[3], serde_json::json!([]), "no token ids: {stored}");
        assert_eq!(stored[4], 2, "the block size is still said");
        assert!(stored[1][0].as_u64().is_some());
    }
}
