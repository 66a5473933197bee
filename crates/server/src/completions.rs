//! `POST /v1/completions`: a prompt (text or token ids) continued by the model.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use sloserve_api::{parse_json, CompletionRequest, Prompt};

use crate::error::ServerError;
use crate::generate::{generate, Kind};
use crate::keys::Caller;
use crate::state::AppState;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServerError> {
    let body = body.map_err(|r| ServerError::from_body_rejection(r, state.max_body_bytes))?;
    state.check_accepting()?;
    let req: CompletionRequest = parse_json(&body)?;
    state.check_model(req.model.as_deref())?;
    let params = req.params()?;
    let prompt = match req.prompt {
        Prompt::Text(text) => {
            state.prompt_bound.check(text.len(), "prompt")?;
            let parse_special = !req.split_special_tokens.unwrap_or(false);
            state.encode_async(text, parse_special, "prompt").await?
        }
        Prompt::Tokens(ids) => {
            state.check_ids(&ids, "prompt")?;
            ids
        }
        Prompt::Batch(_) => unreachable!("refused by params()"),
    };
    let caller = caller.map_or(Caller::OPEN, |c| c.0);
    generate(state, &headers, &caller, prompt, params, Kind::Completion).await
}
