//! Forwarding a request: pick a replica, one attempt, a retry on another replica
//! when the first fails (or times out) before any byte reached the client, then the
//! answer relayed chunk by chunk, each within the upstream timeout. A failure or
//! stall mid-stream ends an SSE answer with an error event; a client that goes away
//! drops the relay and with it the upstream request.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::backend::{Backend, Fleet, Lease};
use crate::error::RouterError;
use crate::picker::Demand;
use crate::state::RouterState;
use crate::upstream::{self, Attempt, Outgoing};

/// Routes a generation request (class and prefix already read) with one retry.
pub async fn forward(
    state: &RouterState,
    demand: Demand,
    out: Outgoing<'_>,
    t0: Instant,
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
        let a = upstream::attempt(&state.client, &backend, &out, limit(state)).await;
        if let Attempt::Started { head, first, body } = a {
            backend.report_success();
            fleet.observe_ttft(t0.elapsed().as_secs_f64());
            return relay(head, first, body, lease, state);
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
    let a = upstream::attempt(&state.client, backend, out, limit(state)).await;
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
    pub fn relay(self, state: &RouterState) -> Response {
        relay(self.head, self.first, self.body, self.lease, state)
    }
}

/// The upstream timeout.
pub fn limit(state: &RouterState) -> Option<Duration> {
    state.cfg.guard.upstream_timeout
}

/// Logs a failed attempt and counts it against the replica if it is the replica's fault.
fn note_failure(state: &RouterState, backend: &Backend, a: &Attempt) {
    let why = match a {
        Attempt::Failed(m) => m.clone(),
        Attempt::TimedOut { secs } => format!("no answer within the upstream timeout ({secs} s)"),
        Attempt::BodyRefused(m) => {
            tracing::warn!(backend = %backend.url, why = %m,
                "replica closed on the request body (is --max-body-bytes above a replica's?); not counted against it");
            return;
        }
        Attempt::Refused { head, .. } => format!("answered {}", head.status),
        Attempt::Started { .. } => return,
    };
    tracing::warn!(backend = %backend.url, why, "attempt failed");
    if a.is_server_failure() {
        backend.report_failure(state.cfg.eject_after, &why);
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
        Attempt::TimedOut { secs } => RouterError::UpstreamTimeout {
            backend: backend.url.clone(),
            secs,
        }
        .into_response(),
        Attempt::Started { .. } => unreachable!("a started answer is relayed"),
    }
}

/// The rest of the answer, frame by frame, holding the lease until the end (or
/// until the client goes away, which drops `body` and so the upstream request).
/// A gap between frames longer than the upstream timeout ends it as a failure.
fn relay(
    head: axum::http::response::Parts,
    first: Option<Bytes>,
    body: Incoming,
    lease: Lease,
    state: &RouterState,
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
    }
    let gap = limit(state).map(|d| (d, Box::pin(tokio::time::sleep(d))));
    let st = Relay {
        first,
        body,
        lease: Some(lease),
        sse,
        eject_after: state.cfg.eject_after,
        gap,
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
            let frame = match st.gap.as_mut() {
                Some((d, t)) => tokio::select! {
                    biased;
                    f = st.body.frame() => Ok(f),
                    _ = t.as_mut() => Err(*d),
                },
                None => Ok(st.body.frame().await),
            };
            let message = match frame {
                Ok(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => return Some((Ok(d), st)),
                    Err(_) => continue,
                },
                Ok(None) => return None,
                Ok(Some(Err(e))) => format!("stream broke: {}", upstream::error_chain(&e)),
                Err(d) => format!(
                    "stream stalled: no byte for {} s (the upstream timeout)",
                    d.as_secs_f64()
                ),
            };
            let backend = lease.backend().clone();
            backend.report_failure(st.eject_after, &message);
            st.lease = None;
            if !st.sse {
                return Some((Err(std::io::Error::other(message)), st));
            }
            let ev = RouterError::Upstream {
                backend: backend.url.clone(),
                message,
            }
            .sse_event();
            return Some((Ok(Bytes::from(ev)), st));
        }
    });
    builder
        .body(Body::from_stream(s))
        .unwrap_or_else(|_| Response::default())
}
