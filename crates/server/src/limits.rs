//! Request limits: the in-flight request limit (503 + Retry-After at once past
//! it, probes exempt; a request of `n` choices counts `n`) and counters held
//! until a response body ends.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ServerError;

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

    /// Counts `more` requests in flight (a request's further choices: each is a
    /// sequence the engine runs), all or none: past the limit, a 429 with
    /// `Retry-After` (a batch line retries it later).
    pub fn try_more(&self, more: usize) -> Result<Vec<CountGuard>, ServerError> {
        let guards: Vec<CountGuard> = (0..more).map(|_| CountGuard::new(&self.count)).collect();
        match guards.last() {
            Some(g) if g.count() > self.max => Err(ServerError::ChoicesInflight {
                n: more + 1,
                max: self.max,
            }),
            _ => Ok(guards),
        }
    }
}

/// The middleware: past the limit, 503 with `Retry-After: 1` before any work.
pub async fn limit_inflight(
    State(lim): State<Arc<InflightLimit>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if is_probe(path) || path == "/metrics" {
        return next.run(req).await;
    }
    let guard = CountGuard::new(&lim.count);
    if guard.count() > lim.max {
        tracing::debug!(limit = lim.max, "request refused: in-flight limit");
        return ServerError::InflightLimit { max: lim.max }.into_response();
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

    #[test]
    fn a_request_s_choices_count_all_or_none() {
        let lim = InflightLimit::new(4);
        let first = CountGuard::new(&lim.count);
        // n = 4 beside the first's own count: 3 more fit, exactly.
        let more = lim.try_more(3).unwrap();
        assert_eq!(lim.current(), 4);
        drop(more);
        // n = 5 does not: refused, and nothing stays counted.
        assert!(matches!(
            lim.try_more(4),
            Err(ServerError::ChoicesInflight { n: 5, max: 4 })
        ));
        assert_eq!(lim.current(), 1);
        drop(first);
        assert_eq!(lim.current(), 0);
    }
}
