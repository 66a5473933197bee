//! The router's HTTP front (axum): generation endpoints to the class's fleet, the
//! Batch API to the batch fleet, `/v1/models` as the union of the replicas',
//! `/health`, `/ready` and `/metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sloserve_api::ApiError;

use crate::error::RouterError;
use crate::picker::Demand;
use crate::state::RouterState;
use crate::upstream::{self, Attempt, Outgoing};
use crate::{batch_api, metrics, proxy, request};

type St = State<Arc<RouterState>>;

pub fn router(state: Arc<RouterState>) -> Router {
    Router::new()
        .route("/v1/completions", post(generate))
        .route("/v1/chat/completions", post(generate))
        .route("/tokenize", post(plain))
        .route("/detokenize", post(plain))
        .route("/v1/models", get(models))
        .route("/v1/files", any(batch))
        .route("/v1/files/{*rest}", any(batch))
        .route("/v1/batches", any(batch))
        .route("/v1/batches/{*rest}", any(batch))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state)
}

/// The body, bounded by the configured limit.
async fn read_body(state: &RouterState, body: Body) -> Result<Bytes, RouterError> {
    let limit = state.cfg.max_body_bytes;
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(RouterError::BodyTooLarge { limit })
        }
        Err(e) => Err(RouterError::Body(e.to_string())),
    }
}

fn path_and_query(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned()
}

async fn generate(State(state): St, req: Request) -> Result<Response, RouterError> {
    let t0 = Instant::now();
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, body).await?;
    let routed = request::classify(&state.cfg, &parts.headers, &body)?;
    let out = Outgoing {
        method: &parts.method,
        path_and_query: &pq,
        headers: &parts.headers,
        body,
        class: None,
    };
    Ok(proxy::forward(&state, routed.demand, out, t0).await)
}

/// Requests without a class or prompt (tokenize): the default class's fleet.
async fn plain(State(state): St, req: Request) -> Result<Response, RouterError> {
    let t0 = Instant::now();
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, body).await?;
    let demand = Demand {
        class: state.cfg.default_class,
        key: None,
        work: 0,
    };
    let out = Outgoing {
        method: &parts.method,
        path_and_query: &pq,
        headers: &parts.headers,
        body,
        class: None,
    };
    Ok(proxy::forward(&state, demand, out, t0).await)
}

async fn batch(State(state): St, req: Request) -> Result<Response, RouterError> {
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, body).await?;
    Ok(batch_api::handle(&state, &parts.method, &pq, &parts.headers, body).await)
}

/// The union of the healthy replicas' models (by id).
async fn models(State(state): St, req: Request) -> Response {
    let mut seen = BTreeMap::new();
    let headers = req.headers().clone();
    for b in state.picker.all_backends().filter(|b| b.is_healthy()) {
        let out = Outgoing {
            method: req.method(),
            path_and_query: "/v1/models",
            headers: &headers,
            body: Bytes::new(),
            class: None,
        };
        let Attempt::Started { head, first, body } =
            upstream::attempt(&state.client, b, &out).await
        else {
            continue;
        };
        let Ok(rest) = body.collect().await else {
            continue;
        };
        let mut bytes = first.unwrap_or_default().to_vec();
        bytes.extend_from_slice(&rest.to_bytes());
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if !head.status.is_success() {
            continue;
        }
        for m in v
            .get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = m.get("id").and_then(Value::as_str) {
                seen.entry(id.to_owned()).or_insert_with(|| m.clone());
            }
        }
    }
    let data: Vec<Value> = seen.into_values().collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// Ready while any replica is.
async fn ready(State(state): St) -> Response {
    if state.picker.all_backends().any(|b| b.is_healthy()) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no healthy replica").into_response()
    }
}

async fn metrics_text(State(state): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&state.picker, state.spilled()),
    )
        .into_response()
}

async fn not_found(req: Request) -> RouterError {
    RouterError::Api(ApiError::route_not_found(
        req.method().as_str(),
        req.uri().path(),
    ))
}
