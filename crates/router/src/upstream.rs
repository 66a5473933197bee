//! The HTTP client to replicas: building the upstream request (hop-by-hop headers
//! dropped, the decided class set), one attempt up to the first byte of the answer
//! (bounded by the upstream timeout, its failure classified), and copying the
//! answer's head back.

use std::future::Future;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sloserve_slo::headers::CLASS as CLASS_HEADER;
use sloserve_slo::SloClass;

use crate::backend::Backend;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The header naming the replica that answered.
pub const BACKEND_HEADER: &str = "x-sloserve-backend";

/// Pooled keep-alive HTTP/1.1 connections with `TCP_NODELAY`.
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

/// What a client request becomes upstream.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// The class the router decided (sent as `X-SLO-Class`), if a generation request.
    pub class: Option<SloClass>,
}

/// How an attempt ended before anything reached the client.
pub enum Attempt {
    /// The replica answered and its first body frame (if any) arrived.
    Started {
        head: axum::http::response::Parts,
        first: Option<Bytes>,
        body: Incoming,
    },
    /// The replica answered 5xx or 429 (body read); may be retried elsewhere.
    Refused {
        head: axum::http::response::Parts,
        body: Bytes,
    },
    /// No answer: connection refused or reset, or the body failed before its first byte.
    Failed(String),
    /// Nothing (head, or first byte) within the upstream timeout.
    TimedOut { secs: f64 },
    /// The replica closed the connection while the request body was still being
    /// sent: it refused the body (a smaller body limit than the router's), which
    /// says nothing about its health and would happen on a retry too.
    BodyRefused(String),
}

impl Attempt {
    /// Whether this counts against the replica's health (not a 429, not a refused body).
    pub fn is_server_failure(&self) -> bool {
        match self {
            Attempt::Started { .. } | Attempt::BodyRefused(_) => false,
            Attempt::Refused { head, .. } => head.status.is_server_error(),
            Attempt::Failed(_) | Attempt::TimedOut { .. } => true,
        }
    }

    /// Whether another replica may be tried with the same request.
    pub fn may_retry(&self) -> bool {
        !matches!(self, Attempt::Started { .. } | Attempt::BodyRefused(_))
    }
}

/// `f`, or `None` once `limit` passes (no limit: `f`).
pub async fn within<F: Future>(limit: Option<Duration>, f: F) -> Option<F::Output> {
    match limit {
        Some(d) => tokio::time::timeout(d, f).await.ok(),
        None => Some(f.await),
    }
}

/// Whether a request failed because the replica closed while its body was being
/// written (a broken pipe or reset on a request with a body), as a replica does on
/// a body over its limit.
fn closed_on_body(e: &hyper_util::client::legacy::Error, body_len: usize) -> bool {
    if body_len == 0 || e.is_connect() {
        return false;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                return true;
            }
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.to_string().contains("writing a body") {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// Sends `out` to `backend` and waits for the answer's head and first body frame,
/// each within `limit`.
pub async fn attempt(
    client: &HttpClient,
    backend: &Backend,
    out: &Outgoing<'_>,
    limit: Option<Duration>,
) -> Attempt {
    let timed_out = || Attempt::TimedOut {
        secs: limit.map_or(0.0, |d| d.as_secs_f64()),
    };
    let uri: Uri = match format!("{}{}", backend.url, out.path_and_query).parse() {
        Ok(u) => u,
        Err(e) => return Attempt::Failed(format!("bad upstream URI: {e}")),
    };
    let mut req = hyper::Request::new(Full::new(out.body.clone()));
    *req.method_mut() = out.method.clone();
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    for (k, v) in out.headers {
        if !is_hop_by_hop(k) && k.as_str() != CLASS_HEADER {
            h.append(k, v.clone());
        }
    }
    if let Some(c) = out.class {
        h.insert(CLASS_HEADER, HeaderValue::from_static(c.as_str()));
    }
    let resp = match within(limit, client.request(req)).await {
        None => return timed_out(),
        Some(Ok(r)) => r,
        Some(Err(e)) if closed_on_body(&e, out.body.len()) => {
            return Attempt::BodyRefused(error_chain(&e))
        }
        Some(Err(e)) => return Attempt::Failed(error_chain(&e)),
    };
    let (head, mut body) = resp.into_parts();
    if head.status.is_server_error() || head.status == 429 {
        let bytes = within(limit, Limited::new(body, 1 << 20).collect())
            .await
            .and_then(Result::ok)
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Attempt::Refused { head, body: bytes };
    }
    let first = loop {
        let Some(frame) = within(limit, body.frame()).await else {
            return timed_out();
        };
        match frame {
            None => break None,
            Some(Ok(f)) => match f.into_data() {
                Ok(d) if d.is_empty() => continue,
                Ok(d) => break Some(d),
                Err(_) => continue, // trailers
            },
            Some(Err(e)) => {
                return Attempt::Failed(format!(
                    "answer failed before its first byte: {}",
                    error_chain(&e)
                ))
            }
        }
    };
    Attempt::Started { head, first, body }
}

/// The rest of an answer after `first`, at most `max` bytes, each frame within `limit`.
pub async fn read_rest(
    first: Option<Bytes>,
    mut body: Incoming,
    max: usize,
    limit: Option<Duration>,
) -> Result<Bytes, String> {
    let mut buf = bytes::BytesMut::from(first.unwrap_or_default().as_ref());
    loop {
        let frame = within(limit, body.frame())
            .await
            .ok_or_else(|| format!("the answer stalled for {limit:?}"))?;
        match frame {
            None => return Ok(buf.freeze()),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                    if buf.len() > max {
                        return Err(format!("the answer is over {max} bytes"));
                    }
                }
            }
            Some(Err(e)) => return Err(format!("reading the answer: {}", error_chain(&e))),
        }
    }
}

/// The client's response head from the replica's (hop-by-hop headers dropped, the
/// replica named).
pub fn response_head(
    head: &axum::http::response::Parts,
    backend: &Backend,
) -> axum::http::response::Builder {
    let mut b = axum::http::Response::builder().status(head.status);
    for (k, v) in &head.headers {
        if !is_hop_by_hop(k) || k == header::CONTENT_LENGTH {
            b = b.header(k, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&backend.url) {
        b = b.header(BACKEND_HEADER, v);
    }
    b
}

/// `e` and its sources, joined.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Whether the answer is a Server-Sent Event stream.
pub fn is_sse(head: &axum::http::response::Parts) -> bool {
    head.headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}
