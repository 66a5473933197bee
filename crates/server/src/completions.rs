//! `POST /v1/completions`: a prompt (text or token ids) continued by the model.

use std::sync::Arc;

use axum::response::Response;
use sloserve_api::{CompletionRequest, GenParams, Prompt};

use crate::accept::Accepted;
use crate::error::ServerError;
use crate::generate::{generate, Kind};
use crate::state::AppState;

pub async fn handle(a: Accepted<CompletionRequest>) -> Result<Response, ServerError> {
    let (prompt, params) = prompt_and_params(&a.state, a.req).await?;
    generate(
        a.state,
        &a.headers,
        &a.caller,
        prompt,
        params,
        Kind::Completion,
    )
    .await
}

/// A completion request's validated parameters and its prompt (text tokenized
/// off the async workers, or token ids checked).
pub async fn prompt_and_params(
    state: &Arc<AppState>,
    req: CompletionRequest,
) -> Result<(Vec<u32>, GenParams), ServerError> {
    state.check_generates()?;
    let params = req.params()?;
    crate::structured::precheck(params.response_format.as_ref())?;
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
    Ok((prompt, params))
}
