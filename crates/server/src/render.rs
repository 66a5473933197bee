//! `POST /v1/completions/render` and `POST /v1/chat/completions/render` (vLLM's
//! render endpoints, which the llm-d endpoint picker's token producer calls): the
//! body of the generation endpoint in, the token ids sloserve would run out, with
//! no generation. The prompt is built by the generation endpoints' own code
//! (`AppState::encode`, [`crate::chat::encode_messages`]) and checked by the
//! engine's own request limits, so render equals what generation tokenizes and a
//! bad request is the same 400.
//!
//! Shapes (as vLLM's `GenerateRequest`): chat answers one object, completions a
//! one-element array of it; `token_ids` is what a client reads, `features` is
//! `null` (text only), the rest echoes the request.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sloserve_api::{ChatCompletionRequest, CompletionRequest, GenParams};

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::keys::Caller;
use crate::state::AppState;

/// `POST /v1/completions/render`.
pub async fn completions(a: Accepted<CompletionRequest>) -> Result<Response, ServerError> {
    let (prompt, params) = crate::completions::prompt_and_params(&a.state, a.req).await?;
    let out = rendered(
        &a.state, &a.headers, &a.caller, prompt, &params, "prompt", "cmpl",
    )?;
    Ok(Json(Value::Array(vec![out])).into_response())
}

/// `POST /v1/chat/completions/render`.
pub async fn chat(a: Accepted<ChatCompletionRequest>) -> Result<Response, ServerError> {
    let (prompt, params) = crate::chat::prompt_and_params(&a.state, a.req).await?;
    let (state, headers, caller) = (&a.state, &a.headers, &a.caller);
    let out = rendered(
        state, headers, caller, prompt, &params, "messages", "chatcmpl",
    )?;
    Ok(Json(out).into_response())
}

/// Builds the engine request exactly as generation would (headers, SLO, sampling,
/// salt) and checks it against the engine's limits, then answers its prompt.
fn rendered(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    caller: &Caller,
    prompt: Vec<u32>,
    params: &GenParams,
    prompt_param: &'static str,
    id_prefix: &str,
) -> Result<Value, ServerError> {
    let ingress = crate::ingress::build(state, prompt, params, headers, caller, None)?;
    state
        .engine
        .limits()
        .validate(&ingress.request)
        .map_err(|e| ServerError::engine(e, prompt_param))?;
    let s = &params.sampling;
    Ok(json!({
        "request_id": state.new_id(id_prefix),
        "token_ids": ingress.request.prompt,
        "features": null,
        "sampling_params": {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repetition_penalty,
            "seed": s.seed,
            "max_tokens": params.max_tokens,
            "stop": s.stop,
            "stop_token_ids": [],
        },
        "model": state.model_name,
        "stream": params.stream,
        "stream_options": null,
        "cache_salt": params.cache_salt,
        "priority": 0,
        "kv_transfer_params": null,
    }))
}
