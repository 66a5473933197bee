//! Prefill-only requests on the server (`/v1/embeddings`, `/v1/rerank`,
//! `/score`): a list of prompts run as pooled engine requests (batch class
//! unless asked, the caller's cache scope, deadline and flow as for
//! generation), and the vector arithmetic their answers need.

use std::sync::Arc;

use axum::http::HeaderMap;
use sloserve_api::ApiError;
use sloserve_engine::{Event, FinishReason, Pooling, Request, RequestStream};
use sloserve_slo::{Asked, SloClass};

use crate::error::ServerError;
use crate::keys::Caller;
use crate::metrics::Metrics;
use crate::state::AppState;

/// Each prompt's pooled output, in order. `asked`: the body's SLO fields (the
/// headers' are read here; batch when neither names a class); `param` names
/// the prompts' field in errors (`input[3]`).
pub async fn run(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    caller: &Caller,
    prompts: Vec<Vec<u32>>,
    pooling: Pooling,
    asked: Asked,
    param: &'static str,
) -> Result<Vec<Vec<f32>>, ServerError> {
    let mut slo =
        Asked::read(asked, |n| headers.get(n).map(|v| v.as_bytes())).map_err(ApiError::from)?;
    if slo.class.is_none() && slo.objective.is_none() {
        slo.class = Some(SloClass::Batch);
    }
    let slo = slo.cap(caller.ceiling).map_err(ApiError::from)?;
    let deadline = crate::ingress::client_deadline(headers)?;
    let own = state.api_keys.flow_of(caller);
    let fairness = crate::ingress::flow(state.trust_gateway_headers, headers, own)?;
    let salt = crate::ingress::cache_salt(state.cache_scope, None, own);
    let limits = state.engine.limits();
    let mut reqs = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        state.check_ids(&prompt, param)?;
        let req = Request {
            slo: slo.clone(),
            cache_salt: salt,
            deadline,
            fairness: fairness.clone(),
            ..Request::pooled(prompt, pooling.clone())
        };
        limits.validate(&req).map_err(|e| {
            ApiError::invalid(format!("{param}[{i}]"), format!("{param}[{i}]: {e}"))
        })?;
        reqs.push(req);
    }
    state.check_accepting()?;
    let mut streams = Vec::with_capacity(reqs.len());
    for req in reqs {
        // A refusal drops the streams already submitted (cancelling them).
        streams.push(
            state
                .engine
                .submit(req)
                .map_err(|e| ServerError::engine(e, param))?,
        );
    }
    let timeout = match (deadline, state.request_timeout) {
        (Some(own), Some(server)) => Some(own.min(server)),
        (own, server) => own.or(server),
    };
    let ms = timeout.map_or(0, |t| t.as_millis() as u64);
    let all = collect(&state.metrics, streams, ms);
    match timeout {
        None => all.await,
        Some(t) => tokio::time::timeout(t, all)
            .await
            .unwrap_or(Err(ServerError::TimedOut {
                ms: t.as_millis() as u64,
            })),
    }
}

/// Every stream's output, in order (each counted in `/metrics` as it finishes);
/// the first failure ends the request (the other streams dropped: cancelled).
async fn collect(
    metrics: &Metrics,
    streams: Vec<RequestStream>,
    ms: u64,
) -> Result<Vec<Vec<f32>>, ServerError> {
    let mut out = Vec::with_capacity(streams.len());
    for mut s in streams {
        let mut pooled = None;
        loop {
            match s.recv().await {
                Some(Event::Pooled(v)) => pooled = Some(v),
                Some(Event::Token { .. } | Event::PromptLogprobs(_)) => {}
                Some(Event::Finished(info)) => {
                    metrics.observe_finished(s.admitted().class, &info);
                    if let Some(e) = failure(&info.reason, ms) {
                        return Err(e);
                    }
                    break;
                }
                None => return Err(ServerError::EngineFailure("the engine stopped".into())),
            }
        }
        out.push(pooled.ok_or_else(|| ServerError::Internal("no pooled output".into()))?);
    }
    Ok(out)
}

/// What a pooled request's end means for the client (`ms`: its deadline).
fn failure(reason: &FinishReason, ms: u64) -> Option<ServerError> {
    match reason {
        FinishReason::Stop | FinishReason::Length | FinishReason::StopString => None,
        FinishReason::TimedOut => Some(ServerError::TimedOut { ms }),
        FinishReason::Shed => Some(ServerError::Shed),
        FinishReason::Error(m) => Some(ServerError::EngineFailure(m.clone())),
        _ => Some(ServerError::Aborted),
    }
}

/// `v` scaled to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| (*x as f64) * (*x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// The cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}
