//! The accept loop (in place of `axum::serve`): HTTP/1.1 connections with a
//! header-read timeout (slowloris), an idle keep-alive timeout, a connection limit
//! whose reserve answers only `/health`, `/ready` and `/metrics` (a full reserve
//! evicts its oldest connection that sent no request), a stall timeout (the peer
//! accepted no byte), and graceful shutdown.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
use tokio::sync::{watch, Notify};
use tower::Service;

use crate::error::api_response;
use crate::limits::{is_probe, CountGuard};
use crate::tcp_progress::SendProgress;

/// Socket send buffer of each connection (bytes; Linux doubles it).
pub const SEND_BUFFER: usize = 64 << 10;

/// Connections past `max_connections` still accepted (answering only probes).
pub const PROBE_RESERVE: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_read_timeout: Option<Duration>,
    pub keep_alive_timeout: Option<Duration>,
    /// Headers in to body in (`--body-read-timeout`; see [`crate::body`]).
    pub body_read_timeout: Option<Duration>,
    /// A response waiting this long with the peer accepting no byte closes the
    /// connection (`--stream-write-timeout`).
    pub stall_timeout: Option<Duration>,
}

/// A reserve connection, as the accept loop sees it.
#[derive(Default)]
struct ReserveSlot {
    /// It sent a request (a probe answering, not an idle socket).
    busy: AtomicBool,
    done: AtomicBool,
    evict: Notify,
}

/// A TCP stream that records when it last read or wrote, and how much it wrote.
struct TrackedIo {
    inner: TcpStream,
    epoch: Instant,
    last_ms: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
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
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.written.fetch_add(n as u64, Ordering::Relaxed);
                self.touch();
            }
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

/// Answers only probes (and `/metrics`); everything else gets 503 and the
/// connection closes.
async fn overflow(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if is_probe(path) || path == "/metrics" {
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
    let mut reserve: VecDeque<Arc<ReserveSlot>> = VecDeque::new();
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
        let over = n > limits.max_connections;
        reserve.retain(|s| !s.done.load(Ordering::Acquire));
        if n > limits.max_connections + PROBE_RESERVE && !evict_idle(&mut reserve) {
            tracing::debug!(%peer, "connection refused: over the limit and its reserve");
            continue;
        }
        let slot = over.then(|| {
            tracing::debug!(%peer, open = n, "connection over the limit: probes only");
            let s = Arc::new(ReserveSlot::default());
            reserve.push_back(s.clone());
            s
        });
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
        let close = close_rx.clone();
        tokio::spawn(async move {
            connection(tcp, app, limits, slot.clone(), close, guard).await;
            if let Some(s) = slot {
                s.done.store(true, Ordering::Release);
            }
        });
    }
    drop(listener);
    let _ = close_tx.send(true);
    // Every connection task holds a receiver; once all closed, so is the channel.
    drop(close_rx);
    close_tx.closed().await;
}

/// Closes the oldest reserve connection that has sent no request (a probe sends
/// its request at once; an idle socket there only keeps probes out).
fn evict_idle(reserve: &mut VecDeque<Arc<ReserveSlot>>) -> bool {
    let Some(i) = reserve.iter().position(|s| !s.busy.load(Ordering::Acquire)) else {
        return false;
    };
    if let Some(s) = reserve.remove(i) {
        s.evict.notify_one();
    }
    tracing::debug!("reserve full: evicted an idle connection for a new one");
    true
}

/// One connection until it closes: idle past the keep-alive timeout (no request
/// running, nothing read or written) closes it; shutdown closes it gracefully; a
/// response the peer accepts no byte of for the stall timeout closes it at once
/// (the dropped response cancels its request); a reserve connection (`slot`)
/// answers one request and may be evicted before it sends one.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: ConnLimits,
    slot: Option<Arc<ReserveSlot>>,
    mut close: watch::Receiver<bool>,
    _open: CountGuard,
) {
    let last_ms = Arc::new(AtomicU64::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let mut progress = SendProgress::new(&tcp);
    let io = TrackedIo {
        inner: tcp,
        epoch,
        last_ms: last_ms.clone(),
        written: written.clone(),
    };
    let active = Arc::new(AtomicUsize::new(0));
    let act = active.clone();
    let svc_slot = slot.clone();
    let svc = hyper::service::service_fn(move |req: axum::http::Request<Incoming>| {
        if let Some(s) = &svc_slot {
            s.busy.store(true, Ordering::Release);
        }
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
        .keep_alive(slot.is_none())
        .header_read_timeout(limits.header_read_timeout);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), svc));
    let idle_limit = limits.keep_alive_timeout;
    let mut closing = *close.borrow();
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    let evicted = async {
        match &slot {
            Some(s) => s.evict.notified().await,
            None => std::future::pending().await,
        }
    };
    let mut evicted = pin!(evicted);
    let mut stall_tick = limits.stall_timeout.map(|t| {
        let mut i = tokio::time::interval(
            t.div_f64(4.0)
                .clamp(Duration::from_millis(50), Duration::from_secs(1)),
        );
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    loop {
        let stall_check = async {
            match stall_tick.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending().await,
            }
        };
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
            _ = &mut evicted, if slot.as_ref().is_some_and(|s| !s.busy.load(Ordering::Acquire)) => {
                tracing::debug!("closing an idle reserve connection (evicted)");
                break;
            }
            _ = stall_check => {
                let stalled = progress.stalled_for(written.load(Ordering::Relaxed));
                if active.load(Ordering::Acquire) > 0
                    && stalled >= limits.stall_timeout.unwrap_or(Duration::MAX)
                {
                    tracing::warn!(
                        stalled_s = stalled.as_secs_f64(),
                        "the client accepted no byte of a response for the stall timeout; closing the connection (its request is cancelled)"
                    );
                    break;
                }
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
