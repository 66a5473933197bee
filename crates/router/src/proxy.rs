//! Forwarding a request: pick a replica, one attempt, a retry on another replica
//! when the first fails (or times out) before any byte reached the client and the
//! failure is not the request's own, then the answer: a stream relayed chunk by
//! chunk, each within the upstream timeout and all within the request's deadline
//! (a failure, stall or deadline mid-stream ends it with an error event); any other
//! answer read whole first, so a failure on the way is a JSON error with its own
//! status, never a 200. A client that goes away drops the relay and with it the
//! upstream request.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::backend::{Backend, Fleet, Lease};
use crate::error::RouterError;
use crate::picker::Demand;
use crate::state::RouterState;
use crate::upstream::{self, Attempt, Expired, Limits, Outgoing};

/// Largest answer to a request that did not ask for a stream, read whole before
/// its head is sent (a replica's own JSON answer, logprobs and all).
const WHOLE_ANSWER_LIMIT: usize = 64 << 20;

/// Routes a generation request (class and prefix already read) with one retry;
/// `stream`: the client asked for a stream (else the answer is read whole).
pub async fn forward(
    state: &RouterState,
    demand: Demand,
    out: Outgoing<'_>,
    t0: Instant,
    stream: bool,
) -> Response {
    let mut tried: Option<Arc<Backend>> = None;
    let mut last: Option<(Arc<Backend>, Attempt)> = None;
    for n in 0..2 {
        let Some((fleet, backend)) = state.picker.pick(&demand, tried.as_ref()) else {
            break;
        };
        if n == 1 {
            state.picker.fleet_for(demand.class).count_retry();
        }
        if fleet.name != state.picker.fleet_for(demand.class).name {
            state.count_spill();
        }
        let lease = backend.lease(demand.work, demand.class);
        let out = Outgoing {
            class: Some(demand.class),
            body: out.body.clone(),
            ..out
        };
        let a = upstream::attempt(&state.client, &backend, &out).await;
        if let Attempt::Started { head, first, body } = a {
            backend.report_success();
            fleet.observe_ttft(t0.elapsed().as_secs_f64());
            if !stream {
                return whole(head, first, body, lease, state, out.limits).await;
            }
            return relay(head, first, body, lease, state, out.limits);
        }
        note_failure(state, &backend, &a);
        let retry = a.may_retry();
        tried = Some(backend.clone());
        last = Some((backend, a));
        if !retry {
            break;
        }
    }
    match last {
        Some((backend, a)) => give_up(&backend, a),
        None => RouterError::NoReplica {
            fleet: state.picker.fleet_for(demand.class).name.clone(),
        }
        .into_response(),
    }
}

/// Sends `out` to this one replica (no retry): the batch API's owned ids.
pub async fn forward_to(
    state: &RouterState,
    fleet: &Fleet,
    backend: &Arc<Backend>,
    out: &Outgoing<'_>,
    t0: Instant,
) -> Result<Started, Response> {
    let lease = backend.lease(out.body.len() as u64 / 4, sloserve_slo::SloClass::Batch);
    let a = upstream::attempt(&state.client, backend, out).await;
    match a {
        Attempt::Started { head, first, body } => {
            backend.report_success();
            fleet.observe_ttft(t0.elapsed().as_secs_f64());
            Ok(Started {
                head,
                first,
                body,
                lease,
            })
        }
        a => {
            note_failure(state, backend, &a);
            Err(give_up(backend, a))
        }
    }
}

/// An answer whose head and first frame arrived.
pub struct Started {
    pub head: axum::http::response::Parts,
    pub first: Option<Bytes>,
    pub body: Incoming,
    pub lease: Lease,
}

impl Started {
    pub fn relay(self, state: &RouterState, limits: Limits) -> Response {
        relay(self.head, self.first, self.body, self.lease, state, limits)
    }
}

/// The limits of a request that arrived now: the upstream timeout between bytes,
/// and a deadline for the whole exchange, `--upstream-deadline` or, shorter, the
/// client's own `x-request-timeout-ms` plus [`DEADLINE_GRACE`] (the replica cuts
/// the request at its deadline itself; the grace lets its answer say so).
pub fn limits(state: &RouterState, headers: &HeaderMap) -> Limits {
    let flag = state.cfg.guard.upstream_deadline;
    let asked = headers
        .get(TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(|ms| Duration::from_millis(ms) + DEADLINE_GRACE);
    let total = match (flag, asked) {
        (Some(f), Some(a)) => Some(f.min(a)),
        (f, a) => f.or(a),
    };
    Limits {
        gap: state.cfg.guard.upstream_timeout,
        deadline: total.map(|d| tokio::time::Instant::now() + d),
        total_s: total.map_or(0.0, |d| d.as_secs_f64()),
    }
}

/// Time past a client's `x-request-timeout-ms` the router waits for the replica's
/// own timeout answer.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// The client's deadline header (the replica's name for it).
const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// Logs a failed attempt and counts it against the replica if it is the replica's fault.
fn note_failure(state: &RouterState, backend: &Backend, a: &Attempt) {
    let why = match a {
        Attempt::Failed(m) => m.clone(),
        Attempt::TimedOut(e) => format!("no answer: {e}"),
        Attempt::BodyRefused(m) => {
            tracing::warn!(backend = %backend.url, why = %m,
                "replica closed on the request body (is --max-body-bytes above a replica's?); not counted against it");
            return;
        }
        Attempt::Refused { head, .. } => {
            let origin = a.origin().map_or("", |o| o.as_str());
            format!("answered {} (origin: {origin})", head.status)
        }
        Attempt::Started { .. } => return,
    };
    if a.is_server_failure() {
        tracing::warn!(backend = %backend.url, why, "attempt failed");
        backend.report_failure(state.cfg.eject_after, &why);
    } else {
        tracing::debug!(backend = %backend.url, why, "attempt refused; not the replica's fault");
    }
}

/// The last failure as the client's answer: the replica's own error response, or
/// a 502 naming the replica.
fn give_up(backend: &Backend, a: Attempt) -> Response {
    match a {
        Attempt::Refused { head, body } => upstream::response_head(&head, backend)
            .body(Body::from(body))
            .unwrap_or_else(|_| Response::default()),
        Attempt::Failed(message) => RouterError::Upstream {
            backend: backend.url.clone(),
            message,
        }
        .into_response(),
        Attempt::BodyRefused(m) => RouterError::Upstream {
            backend: backend.url.clone(),
            message: format!("it closed the connection on the request body ({m})"),
        }
        .into_response(),
        Attempt::TimedOut(e) => RouterError::expired(&backend.url, e).into_response(),
        Attempt::Started { .. } => unreachable!("a started answer is relayed"),
    }
}

/// An answer the client did not ask to stream, read whole within `limits` before
/// anything is sent: a failure on the way is a JSON error (502, or 504 past a
/// limit), counted against the replica, never a 200 cut short.
async fn whole(
    head: axum::http::response::Parts,
    first: Option<Bytes>,
    body: Incoming,
    lease: Lease,
    state: &RouterState,
    limits: Limits,
) -> Response {
    let backend = lease.backend().clone();
    match upstream::read_rest(first, body, WHOLE_ANSWER_LIMIT, limits).await {
        Ok(bytes) => upstream::response_head(&head, &backend)
            .body(Body::from(bytes))
            .unwrap_or_else(|_| Response::default()),
        Err(e) => {
            let message = e.to_string();
            tracing::warn!(backend = %backend.url, why = %message, "answer failed mid-way");
            if !matches!(e, upstream::RestError::TooLarge(_)) {
                backend.report_failure(state.cfg.eject_after, &message);
            }
            match e {
                upstream::RestError::Expired(x) => RouterError::expired(&backend.url, x),
                _ => RouterError::Upstream {
                    backend: backend.url.clone(),
                    message,
                },
            }
            .into_response()
        }
    }
}

/// The rest of the answer, frame by frame, holding the lease until the end (or
/// until the client goes away, which drops `body` and so the upstream request).
/// A gap between frames longer than the upstream timeout, or the request's
/// deadline, ends it as a failure.
fn relay(
    head: axum::http::response::Parts,
    first: Option<Bytes>,
    body: Incoming,
    lease: Lease,
    state: &RouterState,
    limits: Limits,
) -> Response {
    let sse = upstream::is_sse(&head);
    let builder = upstream::response_head(&head, lease.backend());
    struct Relay {
        first: Option<Bytes>,
        body: Incoming,
        lease: Option<Lease>,
        sse: bool,
        eject_after: u32,
        /// The upstream timeout and its timer, allocated once per answer and reset
        /// after each frame (a later deadline does not touch the timer wheel).
        gap: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
        /// The request's deadline, one timer for the whole answer.
        deadline: Option<(f64, Pin<Box<tokio::time::Sleep>>)>,
    }
    let gap = limits.gap.map(|d| (d, Box::pin(tokio::time::sleep(d))));
    let deadline = limits
        .deadline
        .map(|at| (limits.total_s, Box::pin(tokio::time::sleep_until(at))));
    let st = Relay {
        first,
        body,
        lease: Some(lease),
        sse,
        eject_after: state.cfg.eject_after,
        gap,
        deadline,
    };
    let s = stream::unfold(st, |mut st| async move {
        if let Some(b) = st.first.take() {
            return Some((Ok(b), st));
        }
        let lease = st.lease.as_ref()?;
        if let Some((d, t)) = st.gap.as_mut() {
            t.as_mut().reset(tokio::time::Instant::now() + *d);
        }
        loop {
            let gap = async {
                match st.gap.as_mut() {
                    Some((d, t)) => {
                        t.as_mut().await;
                        Expired::Gap(d.as_secs_f64())
                    }
                    None => std::future::pending().await,
                }
            };
            let deadline = async {
                match st.deadline.as_mut() {
                    Some((s, t)) => {
                        t.as_mut().await;
                        Expired::Deadline(*s)
                    }
                    None => std::future::pending().await,
                }
            };
            let frame = tokio::select! {
                biased;
                f = st.body.frame() => Ok(f),
                e = deadline => Err(e),
                e = gap => Err(e),
            };
            let backend = lease.backend().clone();
            let err = match frame {
                Ok(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => return Some((Ok(d), st)),
                    Err(_) => continue,
                },
                Ok(None) => return None,
                Ok(Some(Err(e))) => RouterError::Upstream {
                    backend: backend.url.clone(),
                    message: format!("stream broke: {}", upstream::error_chain(&e)),
                },
                Err(e) => RouterError::expired(&backend.url, e),
            };
            let message = err.to_string();
            tracing::warn!(backend = %backend.url, why = %message, "answer cut");
            backend.report_failure(st.eject_after, &message);
            st.lease = None;
            if !st.sse {
                return Some((Err(std::io::Error::other(message)), st));
            }
            return Some((Ok(Bytes::from(err.sse_event())), st));
        }
    });
    builder
        .body(Body::from_stream(s))
        .unwrap_or_else(|_| Response::default())
}
