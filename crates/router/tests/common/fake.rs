//! A fake OpenAI-compatible backend (a tiny axum app) for fault cases: it can fail
//! with 500, fail its health checks, stream fixed chunks slowly, break a stream
//! after N chunks, count streams dropped by the client, keep Batch API ids (files
//! and batches) that only it knows, hang without answering (a stopped process),
//! trickle an answer a byte at a time, say whose fault a 500 is, echo the path,
//! class and fairness id it got, and require an API key (401 without it, like a
//! replica).

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// The stream the fake sends, chunk by chunk (a multi-byte character split across
/// two chunks on purpose).
pub const CHUNKS: [&[u8]; 5] = [
    b"data: {\"choices\":[{\"text\":\"Hel\"}]}\n\n",
    b"data: {\"choices\":[{\"text\":\"lo \xc3",
    b"\xa9t\xc3\xa9\"}]}\n\ndata: {\"choices\":[{\"te",
    b"xt\":\"!\"}]}\n\n",
    b"data: [DONE]\n\n",
];

#[derive(Default)]
pub struct Fake {
    pub name: String,
    /// `/health` and `/ready` answer 503.
    pub down: AtomicBool,
    /// Completions answer 500.
    pub fail: AtomicBool,
    /// The `x-sloserve-error-origin` of that 500 (none: not said).
    pub fail_origin: Mutex<Option<&'static str>>,
    /// Completions never answer (as a SIGSTOPped replica).
    pub hang: AtomicBool,
    /// Every route but the probes needs `Authorization: Bearer KEY`.
    pub key: Mutex<Option<String>>,
    /// The `Authorization` header of the last completion.
    pub last_auth: Mutex<Option<String>>,
    pub completions: AtomicUsize,
    /// `/health` and `/ready` requests answered.
    pub health_checks: AtomicUsize,
    /// Streams dropped before their end (the client went away).
    pub dropped_streams: AtomicUsize,
    files: Mutex<HashSet<String>>,
    batches: Mutex<Vec<String>>,
    next: AtomicUsize,
}

pub struct FakeServer {
    pub addr: SocketAddr,
    pub fake: Arc<Fake>,
    _rt: tokio::runtime::Runtime,
}

impl FakeServer {
    pub fn start(name: &str) -> FakeServer {
        let fake = Arc::new(Fake {
            name: name.into(),
            ..Default::default()
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let app = Router::new()
            .route("/health", get(health))
            .route("/ready", get(health))
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(completions))
            .route("/v1/responses", post(completions))
            .route("/v1/completions/render", post(completions))
            .route("/v1/chat/completions/render", post(completions))
            .route("/v1/embeddings", post(completions))
            .route("/v1/rerank", post(completions))
            .route("/score", post(completions))
            .route("/v1/models", get(models))
            .route("/v1/files", post(new_file).get(list_batches))
            .route("/v1/files/{id}", get(file).delete(file))
            .route("/v1/files/{id}/content", get(file_content))
            .route("/v1/batches", post(new_batch).get(list_batches))
            .route("/v1/batches/{id}", get(batch))
            .route("/v1/batches/{id}/cancel", post(batch))
            .layer(axum::middleware::from_fn_with_state(
                fake.clone(),
                require_key,
            ))
            .with_state(fake.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move { axum::serve(listener, app).await });
        FakeServer {
            addr,
            fake,
            _rt: rt,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes a file only this fake knows (as if uploaded to it directly).
    pub fn add_file(&self, id: &str) {
        self.fake.files.lock().unwrap().insert(id.into());
    }
}

type St = State<Arc<Fake>>;

async fn require_key(
    State(f): St,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let want = f.key.lock().unwrap().clone();
    let path = req.uri().path();
    let given = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match want {
        Some(k)
            if path != "/health" && path != "/ready" && given != Some(format!("Bearer {k}")) =>
        {
            let e = json!({"error": {"message": "Missing API key", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
            (StatusCode::UNAUTHORIZED, Json(e)).into_response()
        }
        _ => next.run(req).await,
    }
}

async fn health(State(f): St) -> StatusCode {
    f.health_checks.fetch_add(1, Ordering::AcqRel);
    if f.down.load(Ordering::Acquire) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

struct DropCount(Arc<Fake>, bool);
impl DropCount {
    fn finish(&mut self) {
        self.1 = true;
    }
}
impl Drop for DropCount {
    fn drop(&mut self) {
        if !self.1 {
            self.0.dropped_streams.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A 200 whose body is `head` and then one space every `every` forever.
fn trickle(content_type: &'static str, head: &'static [u8], every: Duration) -> Response {
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        let b = if i == 0 { head } else { b" " };
        Some((Ok::<_, std::io::Error>(Bytes::from_static(b)), i + 1))
    });
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from_stream(s))
        .unwrap()
}

/// `stream: true` sends [`CHUNKS`] `fake_delay_ms` apart (`fake_repeat` times the
/// middle ones), breaking the connection after `fake_die_after` chunks; otherwise
/// a JSON body naming the fake, the path, the `X-SLO-Class` and the fairness id it
/// got (or, with `fake_die_after`, half of one and a broken connection).
/// `fake_trickle_ms`: one byte that often, never ending.
async fn completions(
    State(f): St,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Json(b): Json<Value>,
) -> Response {
    f.completions.fetch_add(1, Ordering::AcqRel);
    *f.last_auth.lock().unwrap() = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if f.hang.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if f.fail.load(Ordering::Acquire) {
        let e = json!({"error": {"message": "fake failure", "type": "server_error", "param": null, "code": null}});
        let mut r = (StatusCode::INTERNAL_SERVER_ERROR, Json(e)).into_response();
        if let Some(o) = *f.fail_origin.lock().unwrap() {
            r.headers_mut()
                .insert("x-sloserve-error-origin", o.parse().unwrap());
        }
        return r;
    }
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let class = header("x-slo-class");
    let stream = b["stream"].as_bool().unwrap_or(false);
    if let Some(ms) = b["fake_trickle_ms"].as_u64() {
        let every = Duration::from_millis(ms);
        return match stream {
            true => trickle("text/event-stream", CHUNKS[0], every),
            false => trickle("application/json", b"{\"backend\": ", every),
        };
    }
    if !stream {
        if b["fake_die_after"].as_u64().is_some() {
            // The head and a first piece go out; the connection breaks after.
            let s = futures_util::stream::unfold(0, |i| async move {
                match i {
                    0 => Some((Ok(Bytes::from_static(b"{\"backend\": ")), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Some((Err(std::io::Error::other("fake crash")), 2))
                    }
                    _ => None,
                }
            });
            return Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(s))
                .unwrap();
        }
        return Json(json!({
            "backend": f.name,
            "class": class,
            "path": uri.path(),
            "fairness": header("x-llm-d-inference-fairness-id") + &header("x-gateway-inference-fairness-id"),
        }))
        .into_response();
    }
    // A stream that stalls after its first chunk for this long.
    let stall = Duration::from_millis(b["fake_stall_ms"].as_u64().unwrap_or(0));
    let delay = Duration::from_millis(b["fake_delay_ms"].as_u64().unwrap_or(0));
    let die_after = b["fake_die_after"].as_u64().map(|n| n as usize);
    let repeat = b["fake_repeat"].as_u64().unwrap_or(1) as usize;
    let mut chunks: Vec<&'static [u8]> = vec![CHUNKS[0]];
    for _ in 0..repeat {
        chunks.extend(&CHUNKS[1..4]);
    }
    chunks.push(CHUNKS[4]);
    let guard = DropCount(f.clone(), false);
    let s = futures_util::stream::unfold(
        (0usize, chunks, guard),
        move |(i, chunks, mut guard)| async move {
            if i == chunks.len() {
                guard.finish();
                return None;
            }
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            if i == 1 {
                tokio::time::sleep(stall).await;
            }
            if die_after == Some(i) {
                guard.finish();
                return Some((
                    Err(std::io::Error::other("fake crash")),
                    (i + 1, chunks, guard),
                ));
            }
            Some((
                Ok::<_, std::io::Error>(Bytes::from_static(chunks[i])),
                (i + 1, chunks, guard),
            ))
        },
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

async fn models(State(f): St) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": format!("model-{}", f.name), "object": "model"}, {"id": "shared"}]}),
    )
}

fn not_found() -> Response {
    let e = json!({"error": {"message": "no such object", "type": "invalid_request_error", "param": null, "code": "not_found"}});
    (StatusCode::NOT_FOUND, Json(e)).into_response()
}

async fn new_file(State(f): St, _body: Bytes) -> Json<Value> {
    let n = f.next.fetch_add(1, Ordering::AcqRel);
    let id = format!("file-{}-{n}", f.name);
    f.files.lock().unwrap().insert(id.clone());
    Json(json!({"id": id, "object": "file", "created_at": n, "purpose": "batch"}))
}

async fn file(State(f): St, Path(id): Path<String>) -> Response {
    if f.files.lock().unwrap().contains(&id) {
        Json(json!({"id": id, "object": "file"})).into_response()
    } else {
        not_found()
    }
}

async fn file_content(State(f): St, Path(id): Path<String>) -> Result<String, Response> {
    if f.files.lock().unwrap().contains(&id) {
        Ok(format!("{{\"content of\": \"{id}\"}}\n"))
    } else {
        Err(not_found())
    }
}

async fn new_batch(State(f): St, Json(b): Json<Value>) -> Response {
    let input = b["input_file_id"].as_str().unwrap_or("").to_owned();
    if !f.files.lock().unwrap().contains(&input) {
        return not_found();
    }
    let n = f.next.fetch_add(1, Ordering::AcqRel);
    let id = format!("batch-{}-{n}", f.name);
    let out = format!("file-out-{}-{n}", f.name);
    f.files.lock().unwrap().insert(out.clone());
    f.batches.lock().unwrap().push(id.clone());
    Json(json!({"id": id, "object": "batch", "input_file_id": input, "output_file_id": out, "created_at": n}))
        .into_response()
}

async fn batch(State(f): St, Path(id): Path<String>) -> Response {
    if f.batches.lock().unwrap().contains(&id) {
        Json(json!({"id": id, "object": "batch", "status": "completed"})).into_response()
    } else {
        not_found()
    }
}

async fn list_batches(State(f): St) -> Result<Json<Value>, Infallible> {
    let data: Vec<Value> = f
        .batches
        .lock()
        .unwrap()
        .iter()
        .map(|id| json!({"id": id, "object": "batch", "created_at": 0}))
        .collect();
    Ok(Json(
        json!({"object": "list", "data": data, "has_more": false}),
    ))
}
