//! KV-cache events through the real server and default model: a ZMQ SUB socket
//! (zeromq-rs) connected to `--kv-events-endpoint` decodes vLLM's multipart
//! messages: `BlockStored` with the prompt's full blocks' token ids (as the
//! render endpoint gives them, with `--kv-events-token-ids`; none without it)
//! chained by parent hashes, `BlockRemoved` for
//! blocks evicted when the cache fills, `AllBlocksCleared` when the engine
//! restarts with a fresh cache; topic `kv@…@smol`, sequence numbers 0, 1, 2, …;
//! the medium "cpu" for the RAM cache's blocks and "disk" for the disk tier's.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sloserve_engine::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};
use sloserve_model::LoadedModel;
use sloserve_server::{AppState, ServeArgs};
use zeromq::{Socket, SocketRecv};

/// A token id that makes the runner panic (the engine restarts, cache cleared).
const MARK: u32 = 4242;

struct PanicOnMark(Box<dyn ModelRunner>);

impl ModelRunner for PanicOnMark {
    fn info(&self) -> &RunnerInfo {
        self.0.info()
    }
    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> Result<(), RunnerError> {
        assert!(!batch.tokens.contains(&MARK), "test runner: marked token");
        self.0.execute(batch, out)
    }
    fn reset(&mut self) -> Result<(), RunnerError> {
        self.0.reset()
    }
}

/// One decoded message: topic, sequence number, payload.
type Msg = (String, u64, Value);

/// A SUB socket on its own thread, connected (it retries until the PUB binds) or
/// bound; messages arrive decoded on the channel. The second receiver says when the
/// socket is bound or its connection is up (for a bind, already waited for here).
fn subscribe(endpoint: String, bind: bool) -> (mpsc::Receiver<Msg>, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    let (bound_tx, bound_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut sub = zeromq::SubSocket::new();
            sub.subscribe("kv@").await.unwrap();
            if bind {
                sub.bind(&endpoint).await.unwrap();
                bound_tx.send(()).unwrap();
            } else {
                sub.connect(&endpoint).await.unwrap();
                let _ = bound_tx.send(());
            }
            while let Ok(m) = sub.recv().await {
                let frames = m.into_vec();
                assert_eq!(frames.len(), 3, "[topic, seq, payload]");
                let topic = String::from_utf8(frames[0].to_vec()).unwrap();
                let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8 bytes"));
                let payload: Value = rmp_serde::from_slice(&frames[2]).expect("msgpack");
                if tx.send((topic, seq, payload)).is_err() {
                    break;
                }
            }
        });
    });
    if bind {
        bound_rx.recv().unwrap();
    }
    (rx, bound_rx)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Events (each `[tag, ...]`) until `done` says so, or panics after 20 s.
fn events_until(
    rx: &mpsc::Receiver<Msg>,
    seqs: &mut Vec<u64>,
    mut done: impl FnMut(&Value) -> bool,
) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let (topic, seq, batch) = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no awaited event; saw {out:?}"));
        assert!(
            topic.starts_with("kv@") && topic.ends_with("@smol"),
            "{topic}"
        );
        seqs.push(seq);
        let arr = batch.as_array().expect("[ts, events, rank]");
        assert_eq!(arr.len(), 3, "vLLM's three fields: {batch}");
        assert!(arr[0].as_f64().unwrap() > 1.6e9, "ts in unix seconds");
        assert_eq!(arr[2], 0, "data-parallel rank 0");
        for e in arr[1].as_array().unwrap() {
            out.push(e.clone());
            if done(e) {
                return out;
            }
        }
    }
}

fn hashes(e: &Value) -> Vec<u64> {
    e[1].as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

#[test]
fn a_subscriber_sees_stores_evictions_and_clears() {
    let port = free_port();
    let (rx, connected) = subscribe(format!("tcp://127.0.0.1:{port}"), false);
    let mut args = test_args();
    // No host: the server binds loopback (and the SUB, already dialing, connects);
    // token ids asked for.
    args.kv_events.kv_events_endpoint = Some(format!("tcp://:{port}"));
    args.kv_events.kv_events_token_ids = true;
    // A small cache (kv blocks of 16 tokens) so that a few prompts fill it.
    args.engine.set("kv-cache-memory", "8MiB").unwrap();
    let s = TestServer::start_with(args, |args: &ServeArgs| {
        let cfg = args.engine_config().unwrap();
        let m = LoadedModel::load(&args.model, &args.runner_options(&cfg)).unwrap();
        let runner = PanicOnMark(Box::new(m.runner));
        AppState::from_parts(args, m.tokenizer, m.chat_template, Box::new(runner), cfg).unwrap()
    });
    let bs = s.state.engine.info().block_size;
    let blocks = s.state.engine.info().num_kv_blocks;
    // The SUB retries its connect with a backoff (seconds on a loaded machine):
    // wait for it, then for its subscription to reach the PUB.
    connected
        .recv_timeout(Duration::from_secs(60))
        .expect("the SUB connects to the server's PUB");
    std::thread::sleep(Duration::from_millis(500));
    let mut seqs = Vec::new();

    // A real prefill: its full blocks are stored, chained, with their token ids.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let rendered: Vec<u64> = post(s.addr, "/v1/completions/render", &json!({"prompt": prompt}))
        .json()[0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let full = rendered.len() / bs * bs;
    assert!(full >= 3 * bs, "{} tokens", rendered.len());
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut stored_tokens: Vec<u64> = Vec::new();
    let mut stored: Vec<u64> = Vec::new();
    let evs = events_until(&rx, &mut seqs, |e| {
        // (The engine's start, AllBlocksCleared, may arrive first or be missed.)
        if e[0] == "BlockStored" {
            assert_eq!(e.as_array().unwrap().len(), 7, "{e}");
            assert_eq!(e[4].as_u64(), Some(bs as u64), "block_size");
            assert!(e[5].is_null() && e[6] == "cpu", "lora_id, medium: {e}");
            let parent = e[2].as_u64();
            match stored.last() {
                None => assert!(e[2].is_null(), "the first block is the root's: {e}"),
                Some(&last) => assert_eq!(parent, Some(last), "chained: {e}"),
            }
            let hs = hashes(e);
            let toks = e[3].as_array().unwrap();
            assert_eq!(toks.len(), hs.len() * bs);
            stored.extend(hs);
            stored_tokens.extend(toks.iter().map(|t| t.as_u64().unwrap()));
        }
        stored_tokens.len() >= full
    });
    assert!(
        evs.iter()
            .all(|e| e[0] == "BlockStored" || e[0] == "AllBlocksCleared"),
        "{evs:?}"
    );
    assert_eq!(
        stored_tokens[..full],
        rendered[..full],
        "the prompt's full blocks"
    );

    // Fill the cache with other prompts: the least recently used blocks go.
    let mut removed = HashSet::new();
    let mut all_stored: HashSet<u64> = stored.iter().copied().collect();
    let mut i = 0;
    while removed.is_empty() {
        assert!(i < 4 * blocks, "no eviction after {i} prompts");
        let p = format!(
            "{i} {}",
            "Lorem ipsum dolor sit amet, consectetur. ".repeat(10)
        );
        let r = post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 1}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        i += 1;
        while let Ok((_, seq, batch)) = rx.recv_timeout(Duration::from_millis(200)) {
            seqs.push(seq);
            for e in batch[1].as_array().unwrap() {
                match e[0].as_str().unwrap() {
                    "BlockStored" => all_stored.extend(hashes(e)),
                    "BlockRemoved" => {
                        assert_eq!(e.as_array().unwrap().len(), 3, "{e}");
                        assert_eq!(e[2], "cpu");
                        for h in hashes(e) {
                            assert!(all_stored.contains(&h), "removed {h}, never stored");
                            removed.insert(h);
                        }
                    }
                    other => panic!("unexpected {other}: {e}"),
                }
            }
        }
    }

    // The engine restarts after a panic: its new cache is empty.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": [1, 2, MARK, 4], "max_tokens": 2}),
    );
    assert_eq!(r.status, 500, "{}", r.text());
    events_until(&rx, &mut seqs, |e| e[0] == "AllBlocksCleared");

    // One message per sequence number, in order, none missed.
    let want: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
    assert_eq!(seqs, want);
}

/// With the disk tier (`--prefix-cache-dir`): each block the RAM cache stores
/// ("cpu") is stored again with the medium "disk" once its file is written, and
/// the files the size limit deletes are removed with "disk".
#[test]
fn the_disk_tier_publishes_its_blocks_with_the_medium_disk() {
    let port = free_port();
    let (rx, connected) = subscribe(format!("tcp://127.0.0.1:{port}"), false);
    let dir = temp_data_dir();
    let mut args = test_args();
    args.kv_events.kv_events_endpoint = Some(format!("tcp://:{port}"));
    args.engine
        .set("prefix-cache-dir", dir.to_str().unwrap())
        .unwrap();
    // A few blocks' files: the oldest are deleted as prompts keep coming.
    args.engine.set("prefix-cache-disk-size", "2MiB").unwrap();
    let s = TestServer::start(args);
    connected
        .recv_timeout(Duration::from_secs(60))
        .expect("the SUB connects to the server's PUB");
    std::thread::sleep(Duration::from_millis(500));
    let (mut cpu, mut disk) = (HashSet::new(), HashSet::new());
    let mut disk_removed = 0;
    let mut i = 0;
    while disk_removed == 0 {
        assert!(
            i < 40,
            "no disk removal after {i} prompts; on disk: {disk:?}"
        );
        let p = format!(
            "{i} {}",
            "Pack my box with five dozen liquor jugs. ".repeat(8)
        );
        let r = post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 1}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        i += 1;
        while let Ok((_, _, batch)) = rx.recv_timeout(Duration::from_millis(300)) {
            for e in batch[1].as_array().unwrap() {
                match (
                    e[0].as_str().unwrap(),
                    e.as_array().unwrap().last().unwrap(),
                ) {
                    ("BlockStored", m) if m == "cpu" => cpu.extend(hashes(e)),
                    ("BlockStored", m) if m == "disk" => {
                        for h in hashes(e) {
                            assert!(cpu.contains(&h), "on disk before RAM: {e}");
                            disk.insert(h);
                        }
                    }
                    ("BlockRemoved", m) if m == "disk" => {
                        for h in hashes(e) {
                            assert!(disk.remove(&h), "removed {h} from disk, never stored");
                            disk_removed += 1;
                        }
                    }
                    ("BlockRemoved", m) if m == "cpu" => {}
                    ("AllBlocksCleared", _) => {}
                    _ => panic!("unexpected {e}"),
                }
            }
        }
    }
    assert!(!disk.is_empty(), "the newest blocks stay on disk");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_plain_host_is_connected_to_where_the_subscriber_binds() {
    let port = free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let (rx, _) = subscribe(endpoint.clone(), true);
    let mut args = test_args();
    args.kv_events.kv_events_endpoint = Some(endpoint);
    args.kv_events.kv_events_topic = Some("kv@replica-a@smol".into());
    let s = TestServer::start(args);
    std::thread::sleep(Duration::from_millis(500));
    let prompt = "One two three four five six seven eight nine ten. ".repeat(4);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (topic, _, batch) = loop {
        let m = rx.recv_timeout(Duration::from_secs(20)).expect("a batch");
        if m.2[1]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e[0] == "BlockStored")
        {
            break m;
        }
    };
    assert_eq!(topic, "kv@replica-a@smol");
    let stored: Vec<&Value> = batch[1]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e[0] == "BlockStored")
        .collect();
    assert!(!stored.is_empty());
    for e in stored {
        assert_eq!(e[3], json!([]), "no token ids unless asked: {e}");
        assert!(e[4].as_u64().unwrap() > 0, "the block size: {e}");
    }
}

#[test]
fn every_interface_only_when_asked() {
    let mut args = test_args();
    args.kv_events.kv_events_endpoint = Some(format!("tcp://*:{}", free_port()));
    let e = AppState::load(&args)
        .err()
        .expect("a wildcard host is refused");
    assert!(
        format!("{e:#}").contains("--kv-events-allow-wildcard"),
        "{e:#}"
    );
}
