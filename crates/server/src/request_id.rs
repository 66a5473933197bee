//! The request id (`x-request-id`, as vLLM and the gateway send it): kept when the
//! client or gateway gives a sane one, made otherwise; the request's log lines run in
//! a span that carries it, and the response echoes it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use sloserve_slo::headers::REQUEST_ID;
use tracing::Instrument;

use crate::state::AppState;

/// Longest request id kept (longer ones are replaced, not truncated).
const MAX_LEN: usize = 128;

/// The given id when it is 1..=128 visible ASCII characters.
fn given(req: &Request) -> Option<HeaderValue> {
    let v = req.headers().get(REQUEST_ID)?;
    let b = v.as_bytes();
    let ok = !b.is_empty() && b.len() <= MAX_LEN && b.iter().all(|c| c.is_ascii_graphic());
    ok.then(|| v.clone())
}

pub async fn echo(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let id = given(&req).unwrap_or_else(|| {
        HeaderValue::from_str(&state.new_id("req")).unwrap_or(HeaderValue::from_static("req"))
    });
    let span = tracing::info_span!("request", id = %String::from_utf8_lossy(id.as_bytes()));
    let mut resp = next.run(req).instrument(span).await;
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}
