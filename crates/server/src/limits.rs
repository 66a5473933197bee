//! Request limits: the in-flight request limit (503 + Retry-After at once past
//! it, probes exempt), counters held until a response body ends, and a request's
//! deadline (`--request-timeout`, shortened by `x-request-timeout-ms`).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use sloserve_api::ApiError;

use crate::error::ServerError;
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

/// The header naming a request's own deadline in milliseconds.
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// The request's deadline: `x-request-timeout-ms` if given (a positive number of
/// milliseconds, at most the server's limit), else the server's `--request-timeout`.
pub fn request_timeout(
    headers: &HeaderMap,
    server: Option<Duration>,
) -> Result<Option<Duration>, ServerError> {
    let Some(v) = headers.get(TIMEOUT_HEADER) else {
        return Ok(server);
    };
    let ms = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms > 0.0)
        .ok_or_else(|| {
            ApiError::invalid(
                TIMEOUT_HEADER,
                format!("{TIMEOUT_HEADER} header: expected a positive number of milliseconds, got {v:?}"),
            )
        })?;
    let own = Duration::from_secs_f64(ms / 1e3);
    Ok(Some(server.map_or(own, |s| s.min(own))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_and_counters() {
        let mut h = HeaderMap::new();
        let s = Some(Duration::from_secs(10));
        assert_eq!(request_timeout(&h, s).unwrap(), s);
        h.insert(TIMEOUT_HEADER, "250".parse().unwrap());
        assert_eq!(
            request_timeout(&h, s).unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            request_timeout(&h, None).unwrap(),
            Some(Duration::from_millis(250))
        );
        h.insert(TIMEOUT_HEADER, "99999".parse().unwrap());
        assert_eq!(request_timeout(&h, s).unwrap(), s);
        for bad in ["0", "-1", "x", "NaN"] {
            h.insert(TIMEOUT_HEADER, bad.parse().unwrap());
            assert!(request_timeout(&h, s).is_err(), "{bad}");
        }
        let c = Arc::new(AtomicUsize::new(0));
        let a = CountGuard::new(&c);
        let b = CountGuard::new(&c);
        assert_eq!((a.count(), b.count()), (1, 2));
        drop(a);
        assert_eq!(c.load(Ordering::Acquire), 1);
    }
}
