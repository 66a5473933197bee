//! The HTTP client to replicas: building the upstream request (hop-by-hop headers
//! dropped, the decided class and the caller's fairness flow set), one attempt up to
//! the first byte of the answer (bounded by the upstream timeout and the request's
//! deadline, its failure classified by whose fault it is), and copying the answer's
//! head back.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sloserve_slo::headers::{ErrorOrigin, CLASS as CLASS_HEADER, ERROR_ORIGIN, FAIRNESS_ID};
use sloserve_slo::SloClass;
use tokio::time::Instant;

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
    /// The caller's fairness flow (its key's digest), sent as the fairness id in
    /// place of any the client sent; `None`: no fairness id is passed on.
    pub flow: Option<&'a str>,
    /// How long each wait and the whole exchange may take.
    pub limits: Limits,
}

/// How long an exchange with a replica may take: `gap` for the answer's head, its
/// first byte and between two of its bytes (the upstream timeout), `deadline` for
/// all of it (the request's deadline).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub gap: Option<Duration>,
    pub deadline: Option<Instant>,
    /// The deadline's length in seconds (for messages).
    pub total_s: f64,
}

/// Which limit a wait ran into, with its length in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expired {
    /// Nothing for the upstream timeout.
    Gap(f64),
    /// The request's deadline passed.
    Deadline(f64),
}

impl fmt::Display for Expired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expired::Gap(s) => write!(f, "nothing arrived for {s} s (the upstream timeout)"),
            Expired::Deadline(s) => {
                write!(
                    f,
                    "the answer did not finish within the request's deadline ({s} s)"
                )
            }
        }
    }
}

impl Limits {
    /// `f`, or which limit passed first.
    pub async fn wait<F: Future>(&self, f: F) -> Result<F::Output, Expired> {
        let gap = self
            .gap
            .map(|d| (Instant::now() + d, Expired::Gap(d.as_secs_f64())));
        let deadline = self
            .deadline
            .map(|at| (at, Expired::Deadline(self.total_s)));
        let first = match (gap, deadline) {
            (Some(g), Some(d)) => Some(if d.0 <= g.0 { d } else { g }),
            (g, d) => g.or(d),
        };
        match first {
            None => Ok(f.await),
            Some((at, why)) => tokio::time::timeout_at(at, f).await.map_err(|_| why),
        }
    }
}

/// How an attempt ended before anything reached the client.
pub enum Attempt {
    /// The replica answered and its first body frame (if any) arrived.
    Started {
        head: axum::http::response::Parts,
        first: Option<Bytes>,
        body: Incoming,
    },
    /// The replica answered 5xx or 429 (body read); retried elsewhere unless it is
    /// the request's own failure ([`Attempt::origin`]).
    Refused {
        head: axum::http::response::Parts,
        body: Bytes,
    },
    /// No answer: connection refused or reset, or the body failed before its first byte.
    Failed(String),
    /// Nothing (head, or first byte) within the upstream timeout, or the request's
    /// deadline passed.
    TimedOut(Expired),
    /// The replica closed the connection while the request body was still being
    /// sent: it refused the body (a smaller body limit than the router's), which
    /// says nothing about its health and would happen on a retry too.
    BodyRefused(String),
}

impl Attempt {
    /// Whose failure a refusal is: the replica's `x-sloserve-error-origin`, else
    /// what its status says (a 429 or 503 load, any other 5xx the replica's: a
    /// replica that does not say, as any OpenAI-compatible server, is held to it).
    pub fn origin(&self) -> Option<ErrorOrigin> {
        let Attempt::Refused { head, .. } = self else {
            return None;
        };
        let said = head.headers.get(ERROR_ORIGIN).map(|v| v.as_bytes());
        Some(
            said.and_then(ErrorOrigin::parse)
                .unwrap_or(match head.status.as_u16() {
                    429 | 503 => ErrorOrigin::Load,
                    _ => ErrorOrigin::Replica,
                }),
        )
    }

    /// Whether this counts against the replica's health: no answer, no first byte
    /// in time, or a refusal the replica calls its own fault (never a 4xx, an
    /// overload, or a request's own failure).
    pub fn is_server_failure(&self) -> bool {
        match self {
            Attempt::Started { .. } | Attempt::BodyRefused(_) => false,
            Attempt::Refused { .. } => self.origin() == Some(ErrorOrigin::Replica),
            Attempt::Failed(_) | Attempt::TimedOut(_) => true,
        }
    }

    /// Whether another replica may be tried with the same request: not after an
    /// answer began, a refused body, a failure of the request's own, or its deadline.
    pub fn may_retry(&self) -> bool {
        match self {
            Attempt::Started { .. } | Attempt::BodyRefused(_) => false,
            Attempt::Refused { .. } => self.origin() != Some(ErrorOrigin::Request),
            Attempt::TimedOut(e) => matches!(e, Expired::Gap(_)),
            Attempt::Failed(_) => true,
        }
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
/// each within `out.limits`.
pub async fn attempt(client: &HttpClient, backend: &Backend, out: &Outgoing<'_>) -> Attempt {
    let limits = out.limits;
    let uri: Uri = match format!("{}{}", backend.url, out.path_and_query).parse() {
        Ok(u) => u,
        Err(e) => return Attempt::Failed(format!("bad upstream URI: {e}")),
    };
    let mut req = hyper::Request::new(Full::new(out.body.clone()));
    *req.method_mut() = out.method.clone();
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    for (k, v) in out.headers {
        let name = k.as_str();
        if !is_hop_by_hop(k) && name != CLASS_HEADER && !FAIRNESS_ID.contains(&name) {
            h.append(k, v.clone());
        }
    }
    if let Some(c) = out.class {
        h.insert(CLASS_HEADER, HeaderValue::from_static(c.as_str()));
    }
    if let Some(v) = out.flow.and_then(|f| HeaderValue::from_str(f).ok()) {
        h.insert(FAIRNESS_ID[0], v);
    }
    let resp = match limits.wait(client.request(req)).await {
        Err(e) => return Attempt::TimedOut(e),
        Ok(Ok(r)) => r,
        Ok(Err(e)) if closed_on_body(&e, out.body.len()) => {
            return Attempt::BodyRefused(error_chain(&e))
        }
        Ok(Err(e)) => return Attempt::Failed(error_chain(&e)),
    };
    let (head, mut body) = resp.into_parts();
    if head.status.is_server_error() || head.status == 429 {
        let bytes = limits
            .wait(Limited::new(body, 1 << 20).collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Attempt::Refused { head, body: bytes };
    }
    let first = loop {
        let frame = match limits.wait(body.frame()).await {
            Ok(f) => f,
            Err(e) => return Attempt::TimedOut(e),
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

/// Why the rest of an answer could not be read.
#[derive(Debug)]
pub enum RestError {
    /// A limit passed.
    Expired(Expired),
    /// The answer is over the bound.
    TooLarge(usize),
    /// The connection broke.
    Broke(String),
}

impl fmt::Display for RestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestError::Expired(e) => write!(f, "{e}"),
            RestError::TooLarge(max) => write!(f, "the answer is over {max} bytes"),
            RestError::Broke(m) => write!(f, "the answer broke off: {m}"),
        }
    }
}

/// The rest of an answer after `first`, at most `max` bytes, within `limits`.
pub async fn read_rest(
    first: Option<Bytes>,
    mut body: Incoming,
    max: usize,
    limits: Limits,
) -> Result<Bytes, RestError> {
    let mut buf = bytes::BytesMut::from(first.unwrap_or_default().as_ref());
    loop {
        let frame = limits
            .wait(body.frame())
            .await
            .map_err(RestError::Expired)?;
        match frame {
            None => return Ok(buf.freeze()),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                    if buf.len() > max {
                        return Err(RestError::TooLarge(max));
                    }
                }
            }
            Some(Err(e)) => return Err(RestError::Broke(error_chain(&e))),
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
