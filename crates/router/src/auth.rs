//! The router's API-key middleware: every route but the endpoint table's open
//! ones needs a configured key ([`crate::keys`]), checked before the body is
//! read and never logged; the caller goes into the request's extensions.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sloserve_api::ApiError;

use crate::error::RouterError;
use crate::keys::{presented_key, Caller};
use crate::state::RouterState;

/// The middleware: 401 (OpenAI's shape) without a valid key on a closed path,
/// before the body is read; the `Caller` goes into the request's extensions.
pub async fn require_key(
    State(state): State<Arc<RouterState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let keys = &state.cfg.guard.keys;
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
            return RouterError::Api(ApiError::unauthorized(why)).into_response();
        }
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}
