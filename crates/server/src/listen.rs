//! The accept loop (in place of `axum::serve`): HTTP/1.1 connections with a
//! header-read timeout (slowloris), an idle keep-alive timeout, a connection limit
//! whose overflow still answers `/health` and `/ready`, and graceful shutdown.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use sloserve_api::ApiError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

use crate::error::api_response;
use crate::limits::{is_probe, CountGuard};

/// Socket send buffer of each connection (bytes; Linux doubles it).
pub const SEND_BUFFER: usize = 64 << 10;

/// Connections past `max_connections` still accepted (answering only probes).
pub const PROBE_RESERVE: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_read_timeout: Option<Duration>,
    pub keep_alive_timeout: Option<Duration>,
}

/// A TCP stream that records when it last read or wrote.
struct TrackedIo {
    inner: TcpStream,
    epoch: Instant,
    last_ms: Arc<AtomicU64>,
}

impl TrackedIo {
    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Answers only probes; everything else gets 503 and the connection closes.
async fn overflow(req: Request, next: Next) -> Response {
    if is_probe(req.uri().path()) {
        let mut r = next.run(req).await;
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    let e = ApiError::unavailable("too many open connections; retry later");
    let mut r = api_response(&e, Some(1));
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Serves `app` on `listener` until `stop` resolves, then closes the listener,
/// lets every connection finish its response and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    stop: impl Future<Output = ()>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let overflow_app = app.clone().layer(middleware::from_fn(overflow));
    let (close_tx, close_rx) = watch::channel(false);
    let mut stop = pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let guard = CountGuard::new(&open);
        let n = guard.count();
        if n > limits.max_connections + PROBE_RESERVE {
            tracing::debug!(%peer, "connection refused: over the limit and its reserve");
            continue;
        }
        let over = n > limits.max_connections;
        if over {
            tracing::debug!(%peer, open = n, "connection over the limit: probes only");
        }
        // No Nagle delay: SSE chunks are small and must leave at once.
        let _ = tcp.set_nodelay(true);
        // A fixed send buffer: a client that stops reading holds at most this much
        // kernel memory, and a stalled stream is noticed (the write timeout).
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(SEND_BUFFER);
        let app = if over {
            overflow_app.clone()
        } else {
            app.clone()
        };
        tokio::spawn(connection(tcp, app, limits, !over, close_rx.clone(), guard));
    }
    drop(listener);
    let _ = close_tx.send(true);
    // Every connection task holds a receiver; they are gone once all closed.
    close_tx.closed().await;
}

/// One connection until it closes: idle past the keep-alive timeout (no request
/// running, nothing read or written) closes it; shutdown closes it gracefully.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: ConnLimits,
    keep_alive: bool,
    mut close: watch::Receiver<bool>,
    _open: CountGuard,
) {
    let last_ms = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let io = TrackedIo {
        inner: tcp,
        epoch,
        last_ms: last_ms.clone(),
    };
    let active = Arc::new(AtomicUsize::new(0));
    let act = active.clone();
    let svc = hyper::service::service_fn(move |req: axum::http::Request<Incoming>| {
        let guard = CountGuard::new(&act);
        let mut app = app.clone();
        async move {
            let resp = app.call(req.map(Body::new)).await?;
            Ok::<_, std::convert::Infallible>(crate::limits::attach_guard(resp, guard))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(keep_alive)
        .header_read_timeout(limits.header_read_timeout);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), svc));
    let idle_limit = limits.keep_alive_timeout;
    let mut closing = *close.borrow();
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let idle_check = async {
            match idle_limit {
                Some(d) => {
                    let last = Duration::from_millis(last_ms.load(Ordering::Relaxed));
                    let due = epoch + last + d;
                    tokio::time::sleep_until(due.into()).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            _ = close.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = idle_check, if !closing => {
                let last = Duration::from_millis(last_ms.load(Ordering::Relaxed));
                let idle = epoch.elapsed().saturating_sub(last);
                if active.load(Ordering::Acquire) == 0 && idle >= idle_limit.unwrap_or(Duration::MAX) {
                    tracing::debug!("closing an idle keep-alive connection");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                } else {
                    // Busy: look again one timeout from now.
                    last_ms.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            }
        }
    }
}
