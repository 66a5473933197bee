//! Test support: start the real server in-process (its own thread and runtime) on a
//! free loopback port with the default model, and a tiny blocking HTTP/1.1 client
//! over `TcpStream` that also reads Server-Sent Events chunk by chunk.
#![allow(dead_code)]

pub mod batch;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sloserve_server::{App, AppState, ServeArgs};

pub fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(sloserve_model::DEFAULT_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model` first",
        p.display()
    );
    p
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    done: Mutex<mpsc::Receiver<Result<(), String>>>,
}

/// Small, fast settings: fast precision, 1024-token context, 64 MiB of KV cache.
pub fn test_args() -> ServeArgs {
    let mut a = ServeArgs::defaults();
    a.model = model_path();
    a.engine.set("max-model-len", "1024").unwrap();
    a.engine.set("kv-cache-memory", "64MiB").unwrap();
    a.served_model_name = Some("smol".into());
    a.batch.data_dir = temp_data_dir();
    a
}

/// A fresh directory for the Batch API's store (under the system's temp dir).
pub fn temp_data_dir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "sloserve-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

impl TestServer {
    pub fn start(args: ServeArgs) -> TestServer {
        Self::start_with(args, |a| App::load(a).expect("load the model"))
    }

    /// A server over the state `make` builds (e.g. with a wrapped runner).
    pub fn start_with<A: Into<App>>(
        args: ServeArgs,
        make: impl FnOnce(&ServeArgs) -> A + Send + 'static,
    ) -> TestServer {
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app: App = make(&args).into();
                let state = app.state.clone();
                let mut h = sloserve_server::spawn(app, "127.0.0.1", 0).await.unwrap();
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
                tx.send((h.addr, state, stop_tx)).unwrap();
                // Until told to stop, or the server stopped by itself.
                let mut stop_rx = stop_rx;
                while !h.is_finished() {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
                h.shutdown();
                let r = h.wait().await.map_err(|e| format!("{e:#}"));
                let _ = done_tx.send(r);
            });
        });
        let (addr, state, stop) = rx.recv().expect("server thread failed to start");
        TestServer {
            addr,
            state,
            stop: Mutex::new(Some(stop)),
            done: Mutex::new(done_rx),
        }
    }

    /// Sends the shutdown signal (as SIGTERM would).
    pub fn shutdown(&self) {
        if let Some(s) = self.stop.lock().unwrap().take() {
            let _ = s.send(());
        }
    }

    /// Waits for the server to exit after `shutdown`.
    pub fn wait(&self, timeout: Duration) -> Result<(), String> {
        self.done
            .lock()
            .unwrap()
            .recv_timeout(timeout)
            .map_err(|e| format!("server did not stop: {e}"))?
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("body is UTF-8")
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    /// Asserts an OpenAI error body with this status; returns the `error` object.
    pub fn openai_error(&self, status: u16) -> Value {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

/// A response whose head has been read; the body is read as it arrives.
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    left: Option<usize>,
    buf: Vec<u8>,
    eof: bool,
}

impl Streaming {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Next piece of the decoded body, `None` at the end.
    fn read_piece(&mut self) -> Option<Vec<u8>> {
        if self.eof {
            return None;
        }
        if self.chunked {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                self.eof = true;
                return None;
            }
            let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
            if size == 0 {
                self.eof = true;
                return None;
            }
            let mut data = vec![0; size + 2];
            self.reader.read_exact(&mut data).ok()?;
            data.truncate(size);
            Some(data)
        } else {
            let mut data = vec![0; 8192];
            let want = self.left.map_or(8192, |l| l.min(8192));
            if want == 0 {
                self.eof = true;
                return None;
            }
            let n = self.reader.read(&mut data[..want]).ok()?;
            if n == 0 {
                self.eof = true;
                return None;
            }
            if let Some(l) = &mut self.left {
                *l -= n;
            }
            data.truncate(n);
            Some(data)
        }
    }

    /// The rest of the body.
    pub fn read_all(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.buf);
        while let Some(p) = self.read_piece() {
            out.extend(p);
        }
        out
    }

    /// Next Server-Sent Event (the text before a blank line, without it), `None`
    /// at the end of the body.
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = self.buf.drain(..i + 2).collect();
                return Some(String::from_utf8(ev[..i].to_vec()).expect("SSE event is UTF-8"));
            }
            let p = self.read_piece()?;
            self.buf.extend(p);
        }
    }

    /// Next event's `data:` payload parsed as JSON; `None` for `[DONE]` or the end.
    pub fn next_json(&mut self) -> Option<Value> {
        let ev = self.next_event()?;
        let data = ev
            .strip_prefix("data: ")
            .expect("event starts with 'data: '");
        if data == "[DONE]" {
            return None;
        }
        Some(serde_json::from_str(data).expect("event data is JSON"))
    }
}

pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Streaming {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (e.g. 413) before reading a large body; ignore write errors.
    let _ = s.write_all(body);
    let mut reader = BufReader::new(s);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let left = find("content-length").and_then(|v| v.parse().ok());
    Streaming {
        status,
        headers,
        reader,
        chunked,
        left,
        buf: Vec::new(),
        eof: false,
    }
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = send(addr, method, path, headers, body);
    let body = s.read_all();
    Resp {
        status: s.status,
        headers: s.headers,
        body,
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

/// Reads one metric value (the first sample whose name and labels start with `prefix`).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Sum of every sample whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `cond` every 20 ms until it holds; panics after `secs` naming `what`.
/// For what the engine publishes after its step (its `/metrics` snapshot), which a
/// client can outrun: the last token reaches the client before the step ends.
pub fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
