//! `/v1/files*` and `/v1/batches*` (OpenAI's Batch API) to the batch fleet: an id
//! stays with the replica that created it (learned from 2xx answers only; an
//! unknown id is looked for on each replica in turn until one answers other than
//! 404, a 2xx pinning it), uploads go to the least busy replica, and lists are the
//! union of every replica's (a replica's 4xx passed through when none answered 2xx).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use sloserve_slo::SloClass;

use crate::backend::{Backend, Fleet};
use crate::error::RouterError;
use crate::picker::Demand;
use crate::proxy::{self, Started};
use crate::state::RouterState;
use crate::upstream::{self, Limits, Outgoing};

/// Largest JSON answer read whole (to learn its ids).
const JSON_LIMIT: usize = 16 << 20;

pub async fn handle(
    state: &RouterState,
    method: &Method,
    pq: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let t0 = Instant::now();
    let path = pq.split('?').next().unwrap_or(pq);
    let segs: Vec<&str> = path
        .trim_start_matches("/v1/")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let fleet = state.picker.fleet_for(SloClass::Batch);
    let out = Outgoing {
        method,
        path_and_query: pq,
        headers,
        body: body.clone(),
        class: None,
        flow: None,
        limits: proxy::limits(state, headers),
    };
    let is_content = segs.last() == Some(&"content");
    // The id the request is about: in the path, or a new batch's input file.
    let id = match (segs.get(1), segs.first()) {
        (Some(id), _) => Some(id.to_string()),
        (None, Some(&"batches")) if method == Method::POST => {
            serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
                v.get("input_file_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
        }
        _ => None,
    };
    if id.is_none() && method == Method::GET {
        return union(state, fleet, &out, t0).await;
    }
    let started = match &id {
        Some(id) => match state.owners.get(id) {
            Some(owner) => match proxy::forward_to(state, fleet, &owner, &out, t0).await {
                // A stale entry (the replica lost it, or pinned before an owner
                // answered): look on the others.
                Ok(s) if s.head.status == StatusCode::NOT_FOUND => {
                    find_owner(state, fleet, id, &out, t0, Some(s)).await
                }
                r => r,
            },
            None => find_owner(state, fleet, id, &out, t0, None).await,
        },
        None => {
            let d = Demand {
                class: SloClass::Batch,
                key: None,
                work: body.len() as u64 / 4,
            };
            match state.picker.pick_in(fleet, &d, None) {
                Some(b) => proxy::forward_to(state, fleet, &b, &out, t0).await,
                None => {
                    return RouterError::NoReplica {
                        fleet: fleet.name.clone(),
                    }
                    .into_response()
                }
            }
        }
    };
    let started = match started {
        Ok(s) => s,
        Err(r) => return r,
    };
    if is_content || !is_json(&started.head.headers) {
        return started.relay(state, out.limits);
    }
    let backend = started.lease.backend().clone();
    match read_json(started, out.limits).await {
        Ok((head, bytes)) => {
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                if head.status.is_success() {
                    state.owners.learn(&v, &backend);
                }
            }
            upstream::response_head(&head, &backend)
                .body(Body::from(bytes))
                .unwrap_or_else(|_| Response::default())
        }
        Err(message) => RouterError::Upstream {
            backend: backend.url.clone(),
            message,
        }
        .into_response(),
    }
}

/// Asks each replica in turn (healthy ones first; not one that already answered
/// `seen`'s 404) until one answers other than 404; only a 2xx pins the id to it (a
/// 401 or 400 says nothing about where the object lives).
async fn find_owner(
    state: &RouterState,
    fleet: &Fleet,
    id: &str,
    out: &Outgoing<'_>,
    t0: Instant,
    seen: Option<Started>,
) -> Result<Started, Response> {
    let skip = seen.as_ref().map(|s| s.lease.backend().clone());
    let mut order: Vec<&Arc<Backend>> = fleet
        .backends
        .iter()
        .filter(|b| skip.as_ref().is_none_or(|s| !Arc::ptr_eq(s, b)))
        .collect();
    order.sort_by_key(|b| !b.is_healthy());
    let mut last = seen.map(Ok);
    for b in order {
        match proxy::forward_to(state, fleet, b, out, t0).await {
            Ok(s) if s.head.status == StatusCode::NOT_FOUND => last = Some(Ok(s)),
            Ok(s) => {
                if s.head.status.is_success() {
                    state.owners.insert(id, b);
                }
                return Ok(s);
            }
            Err(r) => last = last.or(Some(Err(r))),
        }
    }
    match last {
        Some(Ok(s)) => Ok(s),
        Some(Err(r)) => Err(r),
        None => Err(RouterError::UnknownId {
            fleet: fleet.name.clone(),
            id: id.to_owned(),
        }
        .into_response()),
    }
}

/// A list request sent to every replica; the `data` arrays merged, newest first.
async fn union(state: &RouterState, fleet: &Fleet, out: &Outgoing<'_>, t0: Instant) -> Response {
    let mut data = Vec::new();
    let mut has_more = false;
    let mut answered = 0;
    let mut refused: Option<Response> = None;
    for b in fleet.backends.iter().filter(|b| b.is_healthy()) {
        let Ok(s) = proxy::forward_to(state, fleet, b, out, t0).await else {
            continue;
        };
        let Ok((head, bytes)) = read_json(s, out.limits).await else {
            continue;
        };
        if head.status.is_client_error() {
            // The caller's mistake (a missing key, a bad query): theirs to see.
            refused = refused.or_else(|| {
                upstream::response_head(&head, b)
                    .body(Body::from(bytes))
                    .ok()
            });
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if !head.status.is_success() {
            continue;
        }
        answered += 1;
        state.owners.learn(&v, b);
        has_more |= v.get("has_more").and_then(Value::as_bool).unwrap_or(false);
        data.extend(
            v.get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        );
    }
    if answered == 0 {
        if let Some(r) = refused {
            return r;
        }
        return RouterError::NoReplica {
            fleet: fleet.name.clone(),
        }
        .into_response();
    }
    data.sort_by_key(|o| {
        std::cmp::Reverse(o.get("created_at").and_then(Value::as_i64).unwrap_or(0))
    });
    let limit = out
        .path_and_query
        .split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("limit=")))
        .and_then(|l| l.parse::<usize>().ok());
    if let Some(l) = limit.filter(|&l| l < data.len()) {
        data.truncate(l);
        has_more = true;
    }
    let id = |o: Option<&Value>| o.and_then(|o| o.get("id")).cloned().unwrap_or(Value::Null);
    let body = json!({"object": "list", "first_id": id(data.first()), "last_id": id(data.last()), "has_more": has_more, "data": data});
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// The whole answer (bounded in size and by the upstream limits).
async fn read_json(
    s: Started,
    limits: Limits,
) -> Result<(axum::http::response::Parts, Bytes), String> {
    let Started {
        head,
        first,
        body,
        lease,
    } = s;
    let bytes = upstream::read_rest(first, body, JSON_LIMIT, limits)
        .await
        .map_err(|e| e.to_string())?;
    drop(lease);
    Ok((head, bytes))
}
