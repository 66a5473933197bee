//! The router's accept loop (in place of `axum::serve`): HTTP/1.1 client
//! connections with a header-read timeout (slowloris), an idle keep-alive timeout,
//! a connection cap whose overflow still answers `/health` and `/ready`, and a
//! graceful shutdown that ends as soon as the last connection closes.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use sloserve_api::ApiError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

use crate::error::RouterError;
use crate::guard::GuardConfig;

/// Connections past `max_connections` still accepted (answering only probes).
pub const PROBE_RESERVE: usize = 64;

/// Counts one thing (a connection, a request) while alive.
struct CountGuard(Arc<AtomicUsize>, usize);

impl CountGuard {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        let n = counter.fetch_add(1, Ordering::AcqRel) + 1;
        CountGuard(counter.clone(), n)
    }
}

impl Drop for CountGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds a guard until it ends or is dropped.
struct GuardedBody {
    inner: Body,
    _guard: CountGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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
    let mut r = if matches!(req.uri().path(), "/health" | "/ready") {
        next.run(req).await
    } else {
        RouterError::Api(ApiError::unavailable(
            "too many open connections; retry later",
        ))
        .into_response()
    };
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Serves `app` on `listener` until `stop` resolves, then closes the listener,
/// lets every connection finish its response and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &GuardConfig,
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
        if guard.1 > limits.max_connections + PROBE_RESERVE {
            tracing::debug!(%peer, "connection refused: over the limit and its reserve");
            continue;
        }
        let over = guard.1 > limits.max_connections;
        // No Nagle delay: SSE chunks are small and must leave at once.
        let _ = tcp.set_nodelay(true);
        let app = if over {
            overflow_app.clone()
        } else {
            app.clone()
        };
        let conn = connection(tcp, app, limits.clone(), !over, close_rx.clone(), guard);
        tokio::spawn(conn);
    }
    drop(listener);
    // Only the connections' receivers remain: `closed` resolves with the last one.
    drop(close_rx);
    let _ = close_tx.send(true);
    close_tx.closed().await;
}

/// One connection until it closes: idle past the keep-alive timeout (no request
/// running, nothing read or written) closes it; shutdown closes it gracefully.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: GuardConfig,
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
            let resp = resp.map(|inner| {
                Body::new(GuardedBody {
                    inner,
                    _guard: guard,
                })
            });
            Ok::<_, std::convert::Infallible>(resp)
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
                    tokio::time::sleep_until((epoch + last + d).into()).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("client connection ended: {e}");
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
