//! Request limits: the in-flight request limit (503 + Retry-After at once past
//! it, probes exempt) and counters held until a response body ends.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use sloserve_api::ApiError;

use crate::state::AppState;

/// Liveness and readiness probes: always answered, never counted.
pub fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/ready")
}

/// Counts one thing (a connection, a request) while alive.
pub struct CountGuard(Arc<AtomicUsize>, usize);

impl CountGuard {
    pub fn new(counter: &Arc<AtomicUsize>) -> Self {
        let n = counter.fetch_add(1, Ordering::AcqRel) + 1;
        CountGuard(counter.clone(), n)
    }
    /// The count just after this one was added.
    pub fn count(&self) -> usize {
        self.1
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

/// `resp` with `guard` held until its body is done (streams count while they run).
pub fn attach_guard(resp: Response, guard: CountGuard) -> Response {
    resp.map(|inner| {
        Body::new(GuardedBody {
            inner,
            _guard: guard,
        })
    })
}

/// The in-flight request limit.
pub struct InflightLimit {
    count: Arc<AtomicUsize>,
    max: usize,
}

impl InflightLimit {
    pub fn new(max: usize) -> Self {
        InflightLimit {
            count: Arc::new(AtomicUsize::new(0)),
            max: max.max(1),
        }
    }
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// The middleware: past the limit, 503 with `Retry-After: 1` before any work.
pub async fn limit_inflight(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if is_probe(path) || path == "/metrics" {
        return next.run(req).await;
    }
    let lim = &state.inflight_limit;
    let guard = CountGuard::new(&lim.count);
    if guard.count() > lim.max {
        tracing::debug!(limit = lim.max, "request refused: in-flight limit");
        return crate::error::api_response(
            &ApiError::unavailable(format!(
                "too many requests in flight (limit {}); retry later",
                lim.max
            )),
            Some(1),
        );
    }
    attach_guard(next.run(req).await, guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters() {
        let c = Arc::new(AtomicUsize::new(0));
        let a = CountGuard::new(&c);
        let b = CountGuard::new(&c);
        assert_eq!((a.count(), b.count()), (1, 2));
        drop(a);
        assert_eq!(c.load(Ordering::Acquire), 1);
    }
}
