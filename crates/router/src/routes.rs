//! The router's HTTP front (axum), built from the endpoint table
//! (`sloserve_api::endpoints`): what generates or renders a prompt goes to the
//! request's class's fleet, tokenizer and description endpoints to the default
//! class's, the Batch API to the batch fleet, `/v1/models` as the union of the
//! replicas'; `/health`, `/ready` and `/metrics` are the router's own. API keys
//! are checked before any body is read, bodies bounded in size (the replicas'
//! limit) and in time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sloserve_api::endpoints::{self, Runs};
use sloserve_api::{ApiError, EndpointSpec};

use crate::auth;
use crate::error::RouterError;
use crate::keys::Caller;
use crate::picker::Demand;
use crate::state::RouterState;
use crate::upstream::{self, Attempt, Outgoing};
use crate::{batch_api, metrics, proxy, request};

type St = State<Arc<RouterState>>;

/// How the router answers an endpoint of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// To the request's class's fleet, by class and prompt prefix.
    Class,
    /// As `Class`, the batch fleet when the request names no class (a pooled
    /// request: embeddings, rerank, score — batch class on the replica too).
    Pooled,
    /// To any replica of the default class.
    Default,
    /// To the batch fleet (the Batch API's files and jobs).
    Batch,
    /// The union of the replicas' answers (`/v1/models`).
    Union,
    /// The router's own answer (its probes and metrics).
    Own,
}

/// Where each endpoint of the table goes.
pub fn forward_of(spec: &EndpointSpec) -> Forward {
    use sloserve_api::Endpoint as E;
    match spec.runs {
        Runs::Generation | Runs::Render => Forward::Class,
        Runs::Pooling => Forward::Pooled,
        Runs::Tokenizer => Forward::Default,
        Runs::Files => Forward::Batch,
        Runs::Models => Forward::Union,
        Runs::Page => Forward::Default,
        Runs::Process => match spec.endpoint {
            E::Health | E::Ready | E::Metrics => Forward::Own,
            // The replicas' API description.
            _ => Forward::Default,
        },
    }
}

pub fn router(state: Arc<RouterState>) -> Router {
    use sloserve_api::Endpoint as E;
    let mut r = Router::new();
    for spec in endpoints::TABLE {
        let m = method_filter(spec.methods);
        let methods = match (forward_of(spec), spec.endpoint) {
            (Forward::Class, _) => on(m, generate),
            (Forward::Pooled, _) => on(m, pooled),
            (Forward::Default, _) => on(m, plain),
            (Forward::Batch, _) => on(m, batch),
            (Forward::Union, E::Model) => get(model),
            (Forward::Union, _) => get(models),
            (Forward::Own, E::Health) => get(|| async { "ok" }),
            (Forward::Own, E::Ready) => get(ready),
            (Forward::Own, _) => get(metrics_text),
        };
        r = r.route(spec.path, methods);
    }
    r.fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .with_state(state)
}

/// The table's methods as axum's filter.
fn method_filter(methods: &[endpoints::Method]) -> MethodFilter {
    use endpoints::Method as M;
    let one = |m: &M| match m {
        M::Get => MethodFilter::GET,
        M::Post => MethodFilter::POST,
        M::Delete => MethodFilter::DELETE,
    };
    let mut it = methods.iter();
    let first = it.next().map_or(MethodFilter::GET, one);
    it.fold(first, |f, m| f.or(one(m)))
}

/// The body, bounded by the configured limit (a larger `Content-Length` is refused
/// before a byte of it is read) and by the body-read timeout. Nothing too large for
/// a replica reaches one: its refusal would look like a replica failure.
async fn read_body(
    state: &RouterState,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<Bytes, RouterError> {
    let limit = state.cfg.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(RouterError::BodyTooLarge { limit });
    }
    let read = http_body_util::Limited::new(body, limit).collect();
    let timeout = state.cfg.guard.body_read_timeout;
    match upstream::within(timeout, read).await {
        None => Err(RouterError::BodyTimeout {
            secs: timeout.map_or(0.0, |d| d.as_secs_f64()),
        }),
        Some(Ok(b)) => Ok(b.to_bytes()),
        Some(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(RouterError::BodyTooLarge { limit })
        }
        Some(Err(e)) => Err(RouterError::Body(e.to_string())),
    }
}

fn path_and_query(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned()
}

async fn generate(
    State(state): St,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, RouterError> {
    let default = state.cfg.default_class;
    by_class(state, caller, req, default).await
}

/// A pooled request (embeddings, rerank, score): by class, batch by default.
async fn pooled(
    State(state): St,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, RouterError> {
    by_class(state, caller, req, sloserve_slo::SloClass::Batch).await
}

async fn by_class(
    state: Arc<RouterState>,
    caller: Caller,
    req: Request,
    default_class: sloserve_slo::SloClass,
) -> Result<Response, RouterError> {
    let t0 = Instant::now();
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, &parts.headers, body).await?;
    let (cfg, headers) = (&state.cfg, &parts.headers);
    let routed = request::classify_as(cfg, default_class, caller, headers, &body)?;
    let flow = state.cfg.guard.keys.flow_of(&caller);
    let out = Outgoing {
        method: &parts.method,
        path_and_query: &pq,
        headers: &parts.headers,
        body,
        class: None,
        flow: flow.as_deref(),
        limits: proxy::limits(&state, &parts.headers),
    };
    Ok(proxy::forward(&state, routed.demand, out, t0, routed.stream).await)
}

/// Requests without a class or prompt (tokenize): the default class's fleet.
async fn plain(State(state): St, req: Request) -> Result<Response, RouterError> {
    let t0 = Instant::now();
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, &parts.headers, body).await?;
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
        flow: None,
        limits: proxy::limits(&state, &parts.headers),
    };
    Ok(proxy::forward(&state, demand, out, t0, false).await)
}

async fn batch(State(state): St, req: Request) -> Result<Response, RouterError> {
    let pq = path_and_query(&req);
    let (parts, body) = req.into_parts();
    let body = read_body(&state, &parts.headers, body).await?;
    Ok(batch_api::handle(&state, &parts.method, &pq, &parts.headers, body).await)
}

/// The union of the healthy replicas' models (by id).
async fn models(State(state): St, req: Request) -> Response {
    let data: Vec<Value> = union_models(&state, req.headers().clone())
        .await
        .into_values()
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// One model of the union, by id (404 as a replica answers an unknown one).
async fn model(State(state): St, req: Request) -> Response {
    let id = req
        .uri()
        .path()
        .strip_prefix("/v1/models/")
        .unwrap_or_default()
        .to_owned();
    let mut all = union_models(&state, req.headers().clone()).await;
    match all.remove(&id) {
        Some(m) => axum::Json(m).into_response(),
        None => {
            let served = all.keys().cloned().collect::<Vec<_>>().join(", ");
            RouterError::Api(ApiError::model_not_found(&id, &served)).into_response()
        }
    }
}

/// The healthy replicas' `/v1/models` entries, by id.
async fn union_models(
    state: &RouterState,
    headers: axum::http::HeaderMap,
) -> BTreeMap<String, Value> {
    let mut seen = BTreeMap::new();
    let get = axum::http::Method::GET;
    for b in state.picker.all_backends().filter(|b| b.is_healthy()) {
        let out = Outgoing {
            method: &get,
            path_and_query: "/v1/models",
            headers: &headers,
            body: Bytes::new(),
            class: None,
            flow: None,
            limits: proxy::limits(state, &headers),
        };
        let Attempt::Started { head, first, body } =
            upstream::attempt(&state.client, b, &out).await
        else {
            continue;
        };
        let Ok(bytes) = upstream::read_rest(first, body, 1 << 20, out.limits).await else {
            continue;
        };
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
    seen
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
