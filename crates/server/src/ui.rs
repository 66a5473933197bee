//! The live SLO page: `GET /slo` and its script and stylesheet (`ui/`, embedded in
//! the binary: no build step, nothing fetched from elsewhere), served without a
//! key, and its data route `GET /slo/status` ([`crate::slo_status`]), which needs
//! one whenever the server has keys. Not an OpenAI endpoint.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sloserve_api::endpoints::{self, Endpoint as E, Runs};

use crate::App;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");

/// Only this origin's script, style and fetches; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

/// The page's routes (the endpoint table's [`Runs::Page`] rows), to merge into
/// the server's router.
pub fn routes(app: &App) -> Router {
    let mut r = Router::new();
    for spec in endpoints::running(Runs::Page) {
        let handler = match spec.endpoint {
            E::SloPage => get(index),
            E::SloScript => get(app_js),
            E::SloStyle => get(style_css),
            E::SloStatus => get(crate::slo_status::handle),
            E::Completions
            | E::ChatCompletions
            | E::Responses
            | E::Embeddings
            | E::Rerank
            | E::Score
            | E::CompletionsRender
            | E::ChatCompletionsRender
            | E::Models
            | E::Model
            | E::Tokenize
            | E::Detokenize
            | E::TokenizerFile
            | E::TokenizerInfo
            | E::Files
            | E::File
            | E::FileContent
            | E::Batches
            | E::Batch
            | E::BatchCancel
            | E::Health
            | E::Ready
            | E::Metrics
            | E::OpenApi => continue,
        };
        r = r.route(spec.path, handler);
    }
    r.with_state(app.clone())
}
