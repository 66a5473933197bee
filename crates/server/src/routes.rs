//! The small endpoints: `/v1/models`, vLLM's `/tokenize` and `/detokenize`,
//! `/health`, `/ready`, `/metrics`, and the OpenAI-shaped 404 / 405 fallbacks.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sloserve_api::{
    parse_json, ApiError, DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList,
    TokenizeRequest, TokenizeResponse, TokenizerInfo,
};

use crate::chat::encode_messages;
use crate::error::{api_response, ServerError};
use crate::state::AppState;

fn card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.model_name.clone(),
        object: "model".into(),
        created: state.created,
        owned_by: "sloserve".into(),
        root: state.model_aliases.get(1).cloned().unwrap_or_default(),
        max_model_len: state.max_model_len,
    }
}

pub async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![card(&state)],
    })
}

pub async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ServerError> {
    state.check_model(Some(&id))?;
    Ok(Json(card(&state)))
}

/// JSON built off the async workers, as a response.
fn json_text(body: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, ServerError> {
    serde_json::to_string(v).map_err(|e| ServerError::Internal(format!("cannot serialize: {e}")))
}

/// vLLM's `/tokenize`: parsing, chat template, tokenizing and the answer's JSON
/// all run on the blocking pool (bodies are up to `--max-body-bytes`).
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServerError> {
    let body = body.map_err(|r| ServerError::from_body_rejection(r, state.max_body_bytes))?;
    let json = state.blocking(move |st| tokenize_sync(st, &body)).await??;
    Ok(json_text(json))
}

fn tokenize_sync(state: &AppState, body: &[u8]) -> Result<String, ServerError> {
    let req: TokenizeRequest = parse_json(body)?;
    state.check_model(req.model.as_deref())?;
    req.validate()?;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), _) => {
            let ids = state
                .tokenizer
                .encode(p, !req.split_special_tokens.unwrap_or(false))
                .map_err(|e| {
                    ApiError::invalid("prompt", format!("prompt: cannot tokenize: {e}"))
                })?;
            if req.add_special_tokens.unwrap_or(true) {
                state.tokenizer.with_bos(ids)
            } else {
                ids
            }
        }
        (None, Some(m)) => encode_messages(
            state,
            m,
            None,
            req.add_generation_prompt.unwrap_or(true),
            req.add_special_tokens.unwrap_or(false),
            None,
        )?,
        (None, None) => unreachable!("validated"),
    };
    let token_strs = req.return_token_strs.unwrap_or(false).then(|| {
        tokens
            .iter()
            .map(|&t| state.tokenizer.token_str(t).unwrap_or_default().to_string())
            .collect()
    });
    to_json(&TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.max_model_len,
        tokens,
        token_strs,
    })
}

/// vLLM's `/detokenize`, on the blocking pool like `/tokenize`.
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServerError> {
    let body = body.map_err(|r| ServerError::from_body_rejection(r, state.max_body_bytes))?;
    let json = state
        .blocking(move |st| {
            let req: DetokenizeRequest = parse_json(&body)?;
            st.check_model(req.model.as_deref())?;
            st.check_ids(&req.tokens, "tokens")?;
            let prompt = st
                .tokenizer
                .decode(&req.tokens, false)
                .map_err(|e| ApiError::invalid("tokens", format!("tokens: {e}")))?;
            to_json(&DetokenizeResponse { prompt })
        })
        .await??;
    Ok(json_text(json))
}

/// `GET /tokenizer/{file}`: one file of the served model's tokenizer as a Hugging
/// Face folder (`sloserve inspect --export-tokenizer`'s), built once on the
/// blocking pool.
pub async fn tokenizer_file(
    State(state): State<Arc<AppState>>,
    Path(file): Path<String>,
) -> Result<Response, ServerError> {
    let json = state
        .blocking(move |st| {
            let tok = st.hf_tokenizer()?;
            let v = match file.as_str() {
                "tokenizer.json" => &tok.tokenizer,
                "tokenizer_config.json" => &tok.config,
                "special_tokens_map.json" => &tok.special_tokens_map,
                _ => {
                    return Err(ApiError::not_found(format!(
                        "no tokenizer file {file:?}: tokenizer.json, tokenizer_config.json or special_tokens_map.json"
                    ))
                    .into())
                }
            };
            to_json(v)
        })
        .await??;
    Ok(json_text(json))
}

/// vLLM's `GET /tokenizer_info`: the tokenizer's kind, special-token texts and
/// chat template (lm-eval's `tokenizer_backend=remote` reads it, then tokenizes
/// through `/tokenize`).
pub async fn tokenizer_info(State(state): State<Arc<AppState>>) -> Result<Response, ServerError> {
    let tok = &state.tokenizer;
    let text = |id: Option<u32>| id.and_then(|i| tok.token_str(i)).map(str::to_string);
    let eos = text(tok.eos_id());
    to_json(&TokenizerInfo {
        tokenizer_class: tok.model().to_string(),
        bos_token: text(tok.bos_id()),
        pad_token: eos.clone(),
        eos_token: eos,
        chat_template: state.chat_template.as_ref().map(|t| t.source().to_string()),
        model_max_length: state.max_model_len,
        vocab_size: tok.vocab_size(),
    })
    .map(json_text)
}

/// Alive: 200 unless the engine died on its own.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.has_failed() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "engine failed"})),
        )
            .into_response()
    } else if state.engine.is_accepting() || state.is_draining() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "engine stopped"})),
        )
            .into_response()
    }
}

/// Ready: the model is loaded and the server is not draining.
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response()
    } else if !state.engine.is_accepting() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "engine stopped"})),
        )
            .into_response()
    } else {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    }
}

pub async fn metrics(State(app): State<crate::App>) -> Response {
    let mut w = sloserve_api::prom::Writer::with_capacity(24 << 10);
    app.state
        .metrics
        .render_into(&app.state.engine.stats(), &mut w);
    if let Some(b) = &app.batch {
        b.counters().render(b.files(), &mut w);
    }
    let text = w.into_string();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

pub async fn not_found(method: Method, uri: Uri) -> Response {
    api_response(
        &ApiError::route_not_found(method.as_str(), uri.path()),
        None,
    )
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    api_response(
        &ApiError::method_not_allowed(method.as_str(), uri.path()),
        None,
    )
}
