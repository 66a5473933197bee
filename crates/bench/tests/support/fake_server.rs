//! A small fake OpenAI-compatible streaming server for the end-to-end tests.
//!
//! HTTP/1.1 with keep-alive on a loopback port. `GET /v1/models` lists
//! `fake-model`; `POST /v1/completions` and `/v1/chat/completions` stream one
//! token per SSE event with `Transfer-Encoding: chunked`, each event split
//! across two chunks (and so two TCP writes) to exercise the client's parser,
//! then a usage-only chunk when `stream_options.include_usage` is set, then
//! `data: [DONE]`. Token counts: prompt = words (+1 BOS for completions, +4
//! per chat message), completion = `max_tokens` with `ignore_eos`, else
//! `min(max_tokens, 5)`. Prompts containing `FAIL` get a 503 with an error
//! body, `MIDERR` an error event after two tokens, `NOUSAGE` no usage chunk.
//! Every request served is logged, with the usage the server reported.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};

pub const MODEL: &str = "fake-model";

/// One request the server answered.
#[derive(Clone, Debug)]
pub struct Served {
    pub path: String,
    pub body: Value,
    pub slo_class_header: Option<String>,
    pub authorization: Option<String>,
    pub status: u16,
    /// The usage it reported (None: it sent no usage chunk).
    pub usage: Option<(u64, u64)>,
}

pub struct FakeServer {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<Served>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    pub async fn start() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let task_log = log.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = task_log.clone();
                tokio::spawn(async move {
                    let _ = serve_connection(stream, log).await;
                });
            }
        });
        FakeServer { addr, log, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Completion requests served so far.
    pub fn served(&self) -> Vec<Served> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path != "/v1/models")
            .cloned()
            .collect()
    }
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

async fn serve_connection(stream: TcpStream, log: Arc<Mutex<Vec<Served>>>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = String::new();
        if rd.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            rd.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        rd.read_exact(&mut body).await?;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut served = Served {
            path: path.clone(),
            body: body.clone(),
            slo_class_header: header("x-slo-class"),
            authorization: header("authorization"),
            status: 200,
            usage: None,
        };
        match (method.as_str(), path.as_str()) {
            ("GET", "/v1/models") => {
                let j = json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                    .to_string();
                respond(&mut wr, 200, &j).await?;
            }
            ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {
                let chat = path.contains("chat");
                let prompt_text = if chat {
                    body["messages"]
                        .as_array()
                        .map(|m| {
                            m.iter()
                                .filter_map(|x| x["content"].as_str())
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default()
                } else {
                    body["prompt"].as_str().unwrap_or("").to_string()
                };
                if prompt_text.contains("FAIL") {
                    served.status = 503;
                    log.lock().unwrap().push(served);
                    respond(&mut wr, 503, r#"{"error":{"message":"server overloaded","type":"overloaded","code":503}}"#).await?;
                    continue;
                }
                let prompt_tokens = if chat {
                    body["messages"]
                        .as_array()
                        .map(|m| {
                            m.iter()
                                .map(|x| words(x["content"].as_str().unwrap_or("")) + 4)
                                .sum()
                        })
                        .unwrap_or(0)
                } else {
                    words(&prompt_text) + 1
                };
                let max_tokens = body["max_tokens"].as_u64().unwrap_or(16);
                let n = if body["ignore_eos"].as_bool().unwrap_or(false) {
                    max_tokens
                } else {
                    max_tokens.min(5)
                };
                let include_usage = body["stream_options"]["include_usage"]
                    .as_bool()
                    .unwrap_or(false)
                    && !prompt_text.contains("NOUSAGE");
                if include_usage {
                    served.usage = Some((prompt_tokens, n));
                }
                log.lock().unwrap().push(served);
                stream_tokens(
                    &mut wr,
                    chat,
                    n,
                    prompt_tokens,
                    include_usage,
                    prompt_text.contains("MIDERR"),
                )
                .await?;
            }
            _ => respond(&mut wr, 404, r#"{"error":{"message":"not found"}}"#).await?,
        }
    }
}

async fn respond(wr: &mut OwnedWriteHalf, status: u16, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Service Unavailable",
    };
    let head = format!("HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    wr.write_all(head.as_bytes()).await?;
    wr.write_all(body.as_bytes()).await?;
    wr.flush().await
}

async fn chunk(wr: &mut OwnedWriteHalf, data: &[u8]) -> std::io::Result<()> {
    wr.write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    wr.write_all(data).await?;
    wr.write_all(b"\r\n").await?;
    wr.flush().await
}

/// One SSE event, split in two HTTP chunks mid-line.
async fn event(wr: &mut OwnedWriteHalf, data: &str) -> std::io::Result<()> {
    let ev = format!("data: {data}\n\n");
    let cut = ev.len() / 2;
    chunk(wr, &ev.as_bytes()[..cut]).await?;
    tokio::time::sleep(Duration::from_micros(200)).await;
    chunk(wr, &ev.as_bytes()[cut..]).await
}

async fn stream_tokens(
    wr: &mut OwnedWriteHalf,
    chat: bool,
    n: u64,
    prompt_tokens: u64,
    usage: bool,
    mid_error: bool,
) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    wr.write_all(head.as_bytes()).await?;
    // "Prefill".
    tokio::time::sleep(Duration::from_millis(3)).await;
    if chat {
        event(wr, &json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}).to_string()).await?;
    }
    for i in 0..n {
        if mid_error && i == 2 {
            event(
                wr,
                r#"{"error":{"message":"engine died","type":"server_error","code":500}}"#,
            )
            .await?;
            break;
        }
        let finish = if i + 1 == n {
            json!("length")
        } else {
            Value::Null
        };
        let text = format!(" w{i}");
        let c = if chat {
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
        } else {
            json!({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
        };
        event(wr, &c.to_string()).await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if usage {
        let u = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}});
        event(wr, &u.to_string()).await?;
    }
    event(wr, "[DONE]").await?;
    wr.write_all(b"0\r\n\r\n").await?;
    wr.flush().await
}
