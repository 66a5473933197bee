//! The API-key middleware: every route except the endpoint table's open ones
//! (`/health`, `/ready`, `/openapi.json`, the SLO page's files, and `/metrics`
//! unless `--metrics-require-key`; the page's data `/slo/status` is not open) needs a configured key ([`crate::keys`]), never
//! logged; the caller and its Batch API owner go into the request's extensions.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sloserve_api::ApiError;

use crate::error::ServerError;
use crate::keys::{presented_key, Caller};
use crate::state::AppState;

/// The middleware: 401 (OpenAI's shape) without a valid key on a closed path; the
/// `Caller` and its Batch API `Owner` go into the request's extensions.
pub async fn require_key(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let keys = &state.api_keys;
    let caller = match keys.identify(req.headers()) {
        Some(c) => c,
        None if keys.is_open(req.uri().path()) => Caller::OPEN,
        None => {
            let why = if presented_key(req.headers()).is_some() {
                "Incorrect API key provided."
            } else {
                "Missing API key: send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY')."
            };
            tracing::debug!(path = req.uri().path(), "request refused: {why}");
            return ServerError::Api(ApiError::unauthorized(why)).into_response();
        }
    };
    req.extensions_mut().insert(keys.owner_of(&caller));
    req.extensions_mut().insert(caller);
    next.run(req).await
}
