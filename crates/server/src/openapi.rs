//! `/openapi.json`: the OpenAPI 3.1 description of the HTTP API, generated (utoipa)
//! from the wire types of `sloserve-api`; the operations are declared here.
#![allow(dead_code)] // the functions below only carry the operations' descriptions

use std::sync::OnceLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sloserve_api::{
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
    DetokenizeRequest, DetokenizeResponse, ErrorBody, ModelCard, ModelList, ResponseObject,
    ResponsesRequest, TokenizeRequest, TokenizeResponse, TokenizerInfo,
};
use sloserve_api::{
    EmbeddingRequest, EmbeddingResponse, RerankRequest, RerankResponse, ScoreRequest, ScoreResponse,
};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[utoipa::path(
    post, path = "/v1/completions", tag = "generation",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion (JSON), or Server-Sent Events with `stream: true`",
         content((CompletionResponse = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 403, description = "The API key does not allow the asked SLO class", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 408, description = "The request's deadline passed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 500, description = "Internal error", body = ErrorBody),
        (status = 503, description = "Draining, engine stopped, or too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn completions() {}

#[utoipa::path(
    post, path = "/v1/chat/completions", tag = "generation",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The chat completion (JSON), or Server-Sent Events with `stream: true`",
         content((ChatCompletionResponse = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 403, description = "The API key does not allow the asked SLO class", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 408, description = "The request's deadline passed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 500, description = "Internal error", body = ErrorBody),
        (status = 503, description = "Draining, engine stopped, or too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn chat_completions() {}

#[utoipa::path(
    post, path = "/v1/responses", tag = "generation",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response object (JSON), or Server-Sent Events with `stream: true` (`event:` lines: response.created, response.in_progress, response.output_item.added, response.content_part.added, response.output_text.delta, ..., response.completed or response.incomplete; each data with `type` and `sequence_number`). Stateless: nothing is stored",
         content((ResponseObject = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid request (also `previous_response_id` and `conversation`: nothing is stored)", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 403, description = "The API key does not allow the asked SLO class", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 408, description = "The request's deadline passed", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 500, description = "Internal error", body = ErrorBody),
        (status = 503, description = "Draining, engine stopped, or too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn responses() {}

#[utoipa::path(
    post, path = "/v1/embeddings", tag = "pooling",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "OpenAI's embeddings list: one L2-normalised vector per input (floats, or little-endian f32 in base64), `usage.prompt_tokens`. Batch class unless `slo_class` (or `x-slo-class`) says interactive", body = EmbeddingResponse),
        (status = 400, description = "Invalid request: empty input, more than 2048 inputs, an input longer than the context, `dimensions` past the model's, a model that does not embed (pooling none or rank)", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 408, description = "The request's deadline passed", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 503, description = "Draining or engine stopped", body = ErrorBody),
    )
)]
fn embeddings() {}

#[utoipa::path(
    post, path = "/v1/rerank", tag = "pooling",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "The documents by relevance to the query, best first (`top_n` of them): a reranker's P(yes) / (P(yes) + P(no)), else the cosine of the embeddings", body = RerankResponse),
        (status = 400, description = "Invalid request: no documents, more than 2048, an empty text, a pair longer than the context", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 503, description = "Draining or engine stopped", body = ErrorBody),
    )
)]
fn rerank() {}

#[utoipa::path(
    post, path = "/score", tag = "pooling",
    request_body = ScoreRequest,
    responses(
        (status = 200, description = "vLLM's score list: one score per pair (`text_1` against each `text_2`, or pair by pair)", body = ScoreResponse),
        (status = 400, description = "Invalid request: lists of different lengths, empty texts, more than 2048 pairs", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 429, description = "Overloaded (Retry-After)", body = ErrorBody),
        (status = 503, description = "Draining or engine stopped", body = ErrorBody),
    )
)]
fn score() {}

#[utoipa::path(
    post, path = "/v1/completions/render", tag = "generation",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "vLLM's render answer, generating nothing: a one-element array of `{token_ids, request_id, model, sampling_params, features: null, ...}`, `token_ids` the prompt generation would run"),
        (status = 400, description = "Invalid request (the generation endpoint's error)", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
    )
)]
fn completions_render() {}

#[utoipa::path(
    post, path = "/v1/chat/completions/render", tag = "generation",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "vLLM's render answer, generating nothing: one `{token_ids, request_id, model, sampling_params, features: null, ...}`, `token_ids` the templated prompt generation would run"),
        (status = 400, description = "Invalid request (the generation endpoint's error)", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
    )
)]
fn chat_completions_render() {}

#[utoipa::path(
    get, path = "/v1/models", tag = "models",
    responses(
        (status = 200, description = "The served model", body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 503, description = "Too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn models() {}

#[utoipa::path(
    get, path = "/v1/models/{id}", tag = "models",
    params(("id" = String, Path, description = "A model name")),
    responses(
        (status = 200, description = "The served model", body = ModelCard),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 503, description = "Too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn model() {}

#[utoipa::path(
    post, path = "/tokenize", tag = "tokens",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "Token ids", body = TokenizeResponse),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn tokenize() {}

#[utoipa::path(
    post, path = "/detokenize", tag = "tokens",
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "Text", body = DetokenizeResponse),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
        (status = 404, description = "Unknown model", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Too many requests (Retry-After)", body = ErrorBody),
    )
)]
fn detokenize() {}

#[utoipa::path(get, path = "/tokenizer/{file}", tag = "tokens",
    params(("file" = String, Path, description = "`tokenizer.json`, `tokenizer_config.json` or `special_tokens_map.json`")),
    responses(
        (status = 200, description = "The served model's tokenizer as a Hugging Face tokenizer folder's file, built from the GGUF (as `sloserve inspect --export-tokenizer`); save the three into a folder and load it with `AutoTokenizer.from_pretrained`", content_type = "application/json"),
        (status = 404, description = "Not one of the three files", body = ErrorBody),
    ))]
fn tokenizer_file() {}

#[utoipa::path(
    get, path = "/tokenizer_info", tag = "tokens",
    responses(
        (status = 200, description = "The tokenizer's kind, special tokens and chat template", body = TokenizerInfo),
        (status = 401, description = "Missing or wrong API key", body = ErrorBody),
    )
)]
fn tokenizer_info() {}

#[utoipa::path(get, path = "/health", tag = "probes", security(()),
    responses((status = 200, description = "Alive"), (status = 503, description = "The engine failed")))]
fn health() {}

#[utoipa::path(get, path = "/ready", tag = "probes", security(()),
    responses((status = 200, description = "Ready"), (status = 503, description = "Draining or the engine stopped")))]
fn ready() {}

#[utoipa::path(get, path = "/metrics", tag = "probes",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain", body = String),
        (status = 401, description = "Missing or wrong API key (with --metrics-require-key)", body = ErrorBody),
    ))]
fn metrics() {}

#[utoipa::path(get, path = "/openapi.json", tag = "probes", security(()),
    responses((status = 200, description = "This document", content_type = "application/json")))]
fn openapi() {}

#[utoipa::path(post, path = "/v1/files", tag = "batch",
    request_body(content_type = "multipart/form-data", description = "`purpose=batch` and `file`: JSONL, one request a line"),
    responses(
        (status = 200, description = "The file object", content_type = "application/json"),
        (status = 400, description = "Invalid file (the line and field named)", body = ErrorBody),
        (status = 413, description = "Larger than --max-batch-file-bytes, or the key's quota", body = ErrorBody),
    ))]
fn upload_file() {}

#[utoipa::path(get, path = "/v1/files", tag = "batch",
    responses((status = 200, description = "The caller's files", content_type = "application/json")))]
fn list_files() {}

#[utoipa::path(get, path = "/v1/files/{id}", tag = "batch",
    responses((status = 200, description = "The file object", content_type = "application/json"),
              (status = 404, description = "No such file of the caller's", body = ErrorBody)))]
fn get_file() {}

#[utoipa::path(delete, path = "/v1/files/{id}", tag = "batch",
    responses((status = 200, description = "Deleted", content_type = "application/json"),
              (status = 404, description = "No such file of the caller's", body = ErrorBody),
              (status = 409, description = "A running batch uses it", body = ErrorBody)))]
fn delete_file() {}

#[utoipa::path(get, path = "/v1/files/{id}/content", tag = "batch",
    responses((status = 200, description = "The file's bytes (JSONL)", content_type = "application/jsonl"),
              (status = 404, description = "No such file of the caller's", body = ErrorBody)))]
fn file_content() {}

#[utoipa::path(post, path = "/v1/batches", tag = "batch",
    request_body(content_type = "application/json", description = "`input_file_id`, `endpoint` (a batchable endpoint: see `x-sloserve-batchable`), `completion_window: 24h`"),
    responses((status = 200, description = "The batch object", content_type = "application/json"),
              (status = 400, description = "Invalid request", body = ErrorBody)))]
fn create_batch() {}

#[utoipa::path(get, path = "/v1/batches", tag = "batch",
    responses((status = 200, description = "The caller's batches (`limit`, `after`)", content_type = "application/json")))]
fn list_batches() {}

#[utoipa::path(get, path = "/v1/batches/{id}", tag = "batch",
    responses((status = 200, description = "The batch object, with progress", content_type = "application/json"),
              (status = 404, description = "No such batch of the caller's", body = ErrorBody)))]
fn get_batch() {}

#[utoipa::path(post, path = "/v1/batches/{id}/cancel", tag = "batch",
    responses((status = 200, description = "The batch object, cancelling", content_type = "application/json"),
              (status = 404, description = "No such batch of the caller's", body = ErrorBody)))]
fn cancel_batch() {}

#[utoipa::path(get, path = "/slo", tag = "page", security(()),
    responses((status = 200, description = "The live SLO page (HTML; docs/slo-page.md)", content_type = "text/html")))]
fn slo_page() {}

#[utoipa::path(get, path = "/slo/app.js", tag = "page", security(()),
    responses((status = 200, description = "The page's script", content_type = "text/javascript")))]
fn slo_script() {}

#[utoipa::path(get, path = "/slo/style.css", tag = "page", security(()),
    responses((status = 200, description = "The page's stylesheet", content_type = "text/css")))]
fn slo_style() {}

#[utoipa::path(get, path = "/slo/status", tag = "page",
    responses((status = 200, description = "What the page shows, as JSON: per class targets, percentiles, attainment, queue and predicted wait, tokens; KV and prefix cache; the caller's running batches", content_type = "application/json"),
              (status = 401, description = "Missing or wrong API key (whenever keys are set)", body = ErrorBody)))]
fn slo_status() {}

/// The endpoint table's facts on each path: what runs it, whether a batch or
/// a stream may use it, and who may call it (`x-sloserve-*`).
struct Table;

impl Modify for Table {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        for spec in sloserve_api::endpoints::TABLE {
            let Some(item) = api.paths.paths.get_mut(&doc_path(spec.path)) else {
                continue; // the test below fails
            };
            let ext: Extensions = [
                (
                    "x-sloserve-runs",
                    json!(format!("{:?}", spec.runs).to_lowercase()),
                ),
                ("x-sloserve-batchable", json!(spec.batchable)),
                ("x-sloserve-streamable", json!(spec.streamable)),
                ("x-sloserve-access", json!(format!("{:?}", spec.access))),
            ]
            .into_iter()
            .collect();
            item.extensions
                .get_or_insert_with(Default::default)
                .merge(ext);
        }
    }
}

/// A table path as OpenAPI writes it (`{*id}`: `{id}`).
pub fn doc_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The API-key schemes (`Authorization: Bearer` or `x-api-key`).
struct Keys;

impl Modify for Keys {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "x-api-key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("x-api-key"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "sloserve", description = "OpenAI-compatible LLM serving with SLO classes"),
    paths(completions, chat_completions, responses, embeddings, rerank, score, completions_render, chat_completions_render, models, model, tokenize, detokenize, tokenizer_file, tokenizer_info, health, ready, metrics, openapi,
        upload_file, list_files, get_file, delete_file, file_content, create_batch, list_batches, get_batch, cancel_batch, slo_page, slo_script, slo_style, slo_status),
    modifiers(&Keys, &Table),
    security(("bearer" = []), ("x-api-key" = [])),
)]
struct ApiDoc;

/// The description as JSON (built once).
pub fn json() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    })
}

/// `GET /openapi.json` (open, like the probes).
pub async fn handle() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        json(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The document has exactly the table's paths and methods, with the table's facts.
    #[test]
    fn the_description_is_the_endpoint_table() {
        let v: serde_json::Value = serde_json::from_str(super::json()).unwrap();
        let doc: BTreeSet<(String, String)> = v["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(p, item)| {
                ["get", "post", "delete", "put", "patch"]
                    .into_iter()
                    .filter(|m| item[*m].is_object())
                    .map(move |m| (p.clone(), m.to_uppercase()))
            })
            .collect();
        let table: BTreeSet<(String, String)> = sloserve_api::endpoints::TABLE
            .iter()
            .flat_map(|s| {
                s.methods
                    .iter()
                    .map(move |m| (super::doc_path(s.path), m.as_str().to_string()))
            })
            .collect();
        assert_eq!(doc, table);
        let chat = &v["paths"]["/v1/chat/completions"];
        assert_eq!(chat["x-sloserve-runs"], "generation");
        assert_eq!(chat["x-sloserve-batchable"], true);
        assert_eq!(v["paths"]["/tokenize"]["x-sloserve-streamable"], false);
        assert_eq!(v["paths"]["/health"]["x-sloserve-access"], "Open");
        let emb = &v["paths"]["/v1/embeddings"];
        assert_eq!(emb["x-sloserve-runs"], "pooling");
        assert_eq!(emb["x-sloserve-batchable"], true);
        let s = &v["components"]["schemas"];
        for schema in ["EmbeddingRequest", "RerankRequest", "ScoreRequest"] {
            assert!(s[schema].is_object(), "{schema}");
        }
    }

    #[test]
    fn the_description_names_every_route_and_schema() {
        let v: serde_json::Value = serde_json::from_str(super::json()).unwrap();
        for p in [
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/completions/render",
            "/v1/chat/completions/render",
            "/tokenize",
            "/detokenize",
            "/tokenizer_info",
            "/v1/models",
        ] {
            assert!(v["paths"][p].is_object(), "{p}");
        }
        let s = &v["components"]["schemas"];
        // The shared fields are declared once and referenced by both requests.
        for req in [
            "CompletionRequest",
            "ChatCompletionRequest",
            "ResponsesRequest",
        ] {
            let parts = s[req]["allOf"].to_string();
            for shared in ["SamplingFields", "RequestFields"] {
                assert!(
                    parts.contains(&format!("schemas/{shared}")),
                    "{req}: {parts}"
                );
            }
        }
        assert!(
            s["RequestFields"]["properties"]["cache_salt"].is_object(),
            "{s}"
        );
        assert!(s["RequestFields"]["properties"]["response_format"].is_object());
        assert!(s["SamplingFields"]["properties"]["temperature"].is_object());
        let chat = s["ChatCompletionRequest"]["allOf"].as_array().unwrap();
        assert!(chat.iter().any(|p| p["properties"]["messages"].is_object()));
        // Tool calling: the request's fields, messages' calls and results, the answer's.
        assert!(chat
            .iter()
            .any(|p| p.to_string().contains("schemas/ToolFields")));
        for f in ["tools", "tool_choice", "parallel_tool_calls"] {
            assert!(s["ToolFields"]["properties"][f].is_object(), "{f}");
        }
        for (schema, f) in [
            ("ChatMessage", "tool_calls"),
            ("ChatMessage", "tool_call_id"),
            ("ResponseMessage", "tool_calls"),
            ("Tool", "function"),
            ("FunctionDef", "parameters"),
            ("ToolCall", "function"),
        ] {
            assert!(s[schema]["properties"][f].is_object(), "{schema}.{f}");
        }
        assert!(s["ErrorBody"].is_object() && s["Usage"].is_object());
        // The Responses API: its request's own fields, the response object and items.
        let r = s["ResponsesRequest"]["allOf"].to_string();
        for f in [
            "input",
            "instructions",
            "text",
            "max_output_tokens",
            "previous_response_id",
        ] {
            assert!(r.contains(&format!("\"{f}\"")), "{f}: {r}");
        }
        for (schema, f) in [
            ("ResponseObject", "output"),
            ("ResponseObject", "usage"),
            ("OutputItem", "call_id"),
            ("OutputText", "annotations"),
            ("ResponseUsage", "input_tokens_details"),
        ] {
            let v = s[schema].to_string();
            assert!(v.contains(&format!("\"{f}\"")), "{schema}.{f}: {v}");
        }
    }
}
