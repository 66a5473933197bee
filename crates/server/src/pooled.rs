//! Prefill-only requests on the server (`/v1/embeddings`, `/v1/rerank`,
//! `/score`): which pooling the served model runs ([`PoolingMode`], from the
//! GGUF's `{arch}.pooling_type` or `--pooling`), and a list of prompts run as
//! pooled engine requests (batch class unless asked, the caller's cache scope,
//! deadline and flow as for generation).

use std::sync::Arc;

use axum::http::HeaderMap;
use sloserve_api::ApiError;
use sloserve_engine::{Event, FinishReason, Pooling, Request, RequestStream};
use sloserve_model::tokenizer::Tokenizer;
use sloserve_slo::{Asked, SloClass};

use crate::error::ServerError;
use crate::keys::Caller;
use crate::metrics::Metrics;
use crate::state::AppState;

/// `--pooling` (llama-server's names and llama.cpp's `pooling_type` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolingFlag {
    None,
    Mean,
    Cls,
    Last,
    Rank,
}

impl PoolingFlag {
    /// llama.cpp's `pooling_type` value.
    pub fn from_type(t: u32) -> Option<Self> {
        [Self::None, Self::Mean, Self::Cls, Self::Last, Self::Rank]
            .get(t as usize)
            .copied()
    }
}

/// What the pooled endpoints run on the served model.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolingMode {
    /// `pooling_type` none: per-token states, which are not served.
    None,
    /// An embedding model: `/v1/embeddings`; rerank and score by the cosine of
    /// the two texts' embeddings.
    Embed(Pooling),
    /// A decoder reranker (Qwen3-Reranker's recipe): a pair's score is
    /// P(yes) / (P(yes) + P(no)) at the last position of its prompt.
    Rank { yes: u32, no: u32 },
}

impl PoolingMode {
    /// `--pooling` over the file's `pooling_type`, else last-token pooling.
    pub fn resolve(
        flag: Option<PoolingFlag>,
        file: Option<u32>,
        tok: &Tokenizer,
    ) -> anyhow::Result<Self> {
        let chosen = match (flag, file) {
            (Some(f), _) => f,
            (None, Some(t)) => PoolingFlag::from_type(t)
                .ok_or_else(|| anyhow::anyhow!("the file's pooling_type {t} is not one of 0-4"))?,
            (None, None) => PoolingFlag::Last,
        };
        Ok(match chosen {
            PoolingFlag::None => PoolingMode::None,
            PoolingFlag::Mean => PoolingMode::Embed(Pooling::Mean),
            PoolingFlag::Cls => PoolingMode::Embed(Pooling::Cls),
            PoolingFlag::Last => PoolingMode::Embed(Pooling::Last),
            PoolingFlag::Rank => {
                let one = |w: &str| -> anyhow::Result<u32> {
                    match tok.encode(w, false).ok().as_deref() {
                        Some(&[id]) => Ok(id),
                        _ => anyhow::bail!(
                            "rank pooling scores by the tokens \"yes\" and \"no\": {w:?} is not one token of this vocabulary"
                        ),
                    }
                };
                PoolingMode::Rank {
                    yes: one("yes")?,
                    no: one("no")?,
                }
            }
        })
    }

    /// The embedding pooling, or the 400 of a model that does not embed.
    pub fn embedding(&self) -> Result<Pooling, ServerError> {
        match self {
            PoolingMode::Embed(p) => Ok(p.clone()),
            PoolingMode::None => Err(ApiError::invalid(
                "model",
                "this model's pooling is none (per-token states), which /v1/embeddings does not serve; start it with --pooling mean|cls|last",
            )
            .into()),
            PoolingMode::Rank { .. } => Err(ApiError::invalid(
                "model",
                "this model is a reranker (pooling rank): use /v1/rerank or /score",
            )
            .into()),
        }
    }
}

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
    let salt = crate::ingress::cache_salt(state.cache_scope, None, caller);
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
