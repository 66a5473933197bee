//! `sloserve serve`: an OpenAI-compatible HTTP server (axum) in front of the engine.
//! Completions and chat (JSON or Server-Sent Events), `/v1/models`, vLLM's
//! `/tokenize` / `/detokenize`, `/health`, `/ready`, Prometheus `/metrics`; SLO
//! classes per request, admission control (429 + Retry-After), per-request timings
//! in `usage.sloserve`, graceful drain on SIGTERM / ctrl-c. Handlers run no model
//! code: the model runs on the engine's thread and tokens come back as events.
//!
//! Entry points: [`run`] (the command; builds its own runtime), [`serve_on`] (a
//! listener and a shutdown signal), [`spawn`] (in-process, for tests).

pub mod accept;
pub mod app;
pub mod args;
pub mod auth;
pub mod batch;
pub mod batch_args;
pub mod body;
pub mod build;
pub mod chat;
pub mod completions;
pub mod echo;
pub mod embeddings;
pub mod engine_flags;
pub mod error;
pub mod generate;
pub mod generation;
pub mod guard_args;
pub mod ingress;
pub mod keys;
pub mod kv_events;
pub mod limits;
pub mod listen;
pub mod metric_families;
pub mod metrics;
pub mod mlock;
pub mod openapi;
pub mod pooled;
pub mod pooling_mode;
pub mod prompt_bound;
pub mod reasoning;
mod reasoning_budget;
pub mod render;
pub mod request_id;
pub mod rerank;
pub mod responses;
pub mod routes;
pub mod shutdown;
pub mod slo_status;
pub mod state;
pub mod stream;
pub mod structured;
pub mod tcp_progress;
pub mod tool_body;
pub mod tool_parser;
pub mod tools;
pub mod ui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, on, MethodFilter, MethodRouter};
use axum::Router;
use sloserve_api::Endpoint;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub use app::App;
pub use args::ServeArgs;
pub use error::ServerError;
pub use state::AppState;

/// Every route, with the body limit (the Batch API's upload has its own), the
/// in-flight limit and the API-key check (outermost: every route, including the
/// Batch API's and ones added later, needs a key except the open ones `auth` names).
/// In order: key, content type (415), the body read whole under its deadline,
/// then the in-flight slot, so a slow body never holds a slot.
pub fn router(app: &App) -> Router {
    let state = app.state.clone();
    let mut routes = Router::new();
    for spec in sloserve_api::endpoints::TABLE {
        if let Some(handler) = handler(spec.endpoint, method_filter(spec.methods)) {
            routes = routes.route(spec.path, handler);
        }
    }
    let routes = routes
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state.clone())
        // The engine's and the Batch API's metrics.
        .merge(
            Router::new()
                .route(Endpoint::Metrics.path(), get(routes::metrics))
                .with_state(app.clone()),
        )
        // The live SLO page (a UI route, not an OpenAI endpoint).
        .merge(ui::routes(app));
    let routes = match &app.batch {
        Some(b) => routes.merge(sloserve_batch::http::routes(b.clone())),
        None => routes,
    };
    routes
        .layer(from_fn_with_state(
            state.inflight_limit.clone(),
            limits::limit_inflight,
        ))
        .layer(from_fn_with_state(state.clone(), body::read_body))
        .layer(axum::middleware::from_fn(body::require_content_type))
        .layer(from_fn_with_state(state.clone(), auth::require_key))
        .layer(from_fn_with_state(state, request_id::echo))
}

/// What serves each endpoint of the table on the state alone; `None`: served
/// elsewhere (`/metrics` from the whole [`App`], the Batch API by its own crate).
fn handler(e: Endpoint, m: MethodFilter) -> Option<MethodRouter<Arc<AppState>>> {
    use Endpoint as E;
    Some(match e {
        E::Completions => on(m, completions::handle),
        E::ChatCompletions => on(m, chat::handle),
        E::Responses => on(m, responses::handle),
        E::Embeddings => on(m, embeddings::handle),
        E::Rerank => on(m, rerank::rerank),
        E::Score => on(m, rerank::score),
        E::CompletionsRender => on(m, render::completions),
        E::ChatCompletionsRender => on(m, render::chat),
        E::Models => on(m, routes::models),
        E::Model => on(m, routes::model),
        E::Tokenize => on(m, routes::tokenize),
        E::Detokenize => on(m, routes::detokenize),
        E::TokenizerFile => on(m, routes::tokenizer_file),
        E::TokenizerInfo => on(m, routes::tokenizer_info),
        E::Health => on(m, routes::health),
        E::Ready => on(m, routes::ready),
        E::OpenApi => on(m, openapi::handle),
        E::Metrics
        | E::Files
        | E::File
        | E::FileContent
        | E::Batches
        | E::Batch
        | E::BatchCancel
        | E::SloPage
        | E::SloScript
        | E::SloStyle
        | E::SloStatus => return None,
    })
}

fn method_filter(methods: &[sloserve_api::endpoints::Method]) -> MethodFilter {
    use sloserve_api::endpoints::Method as M;
    let one = |m: &M| match m {
        M::Get => MethodFilter::GET,
        M::Post => MethodFilter::POST,
        M::Delete => MethodFilter::DELETE,
    };
    let mut it = methods.iter();
    let first = it.next().map_or(MethodFilter::GET, one);
    it.fold(first, |f, m| f.or(one(m)))
}

/// Serves `listener` until `shutdown` resolves, then drains (see [`shutdown::drain`]),
/// closes the listener and waits for the engine thread. If the engine stops for
/// good (panics it could not recover from) it shuts down the same way and returns
/// an error, so the process exits non-zero and an orchestrator restarts it.
pub async fn serve_on(
    listener: TcpListener,
    app: impl Into<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app: App = app.into();
    let state = app.state.clone();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    if let Some(b) = &app.batch {
        b.start()
            .map_err(|e| anyhow::anyhow!("cannot resume batches: {e}"))?;
    }
    let server = listen::serve(listener, router(&app), state.conn_limits, async move {
        let _ = stop_rx.await;
    });
    let mut task = tokio::spawn(async move {
        server.await;
        Ok::<(), anyhow::Error>(())
    });
    tokio::select! {
        r = &mut task => {
            return match r {
                Ok(r) => r.context("server failed"),
                Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
            };
        }
        _ = shutdown => {}
        _ = engine_failed(&state) => {
            tracing::error!("the engine failed and cannot restart; shutting down");
        }
    }
    // No new batch lines; those in flight finish in the drain like any request.
    if let Some(b) = &app.batch {
        b.stop_feeding();
    }
    let all = shutdown::drain(&state).await;
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(5), &mut task).await {
        Ok(Ok(r)) => r.context("server failed")?,
        Ok(Err(e)) => anyhow::bail!("server task failed: {e}"),
        Err(_) => {
            tracing::warn!("connections still open 5 s after draining; closing them");
            task.abort();
        }
    }
    let engine = state.engine.clone();
    let stopped =
        tokio::task::spawn_blocking(move || engine.wait_stopped(Some(Duration::from_secs(5))))
            .await
            .unwrap_or(false);
    tracing::info!(
        all_finished = all,
        engine_stopped = stopped,
        "server stopped"
    );
    if state.engine.has_failed() {
        anyhow::bail!(
            "the engine failed and could not restart (see the log); exiting non-zero so the process is restarted"
        );
    }
    Ok(())
}

/// `sloserve serve`: loads the model, starts the engine, serves until SIGTERM /
/// ctrl-c, drains, exits. Builds its own multi-thread runtime (2 workers).
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.print_config {
        print!("{}", args.engine_config()?.to_toml_string());
        return Ok(());
    }
    sloserve_model::set_compute_threads(args.threads);
    let app = App::load(&args)?;
    if args.mlock {
        mlock::lock_current_pages();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sloserve-http")
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async {
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        tracing::info!(
            addr = %listener.local_addr()?,
            model = %app.state.model_name,
            "sloserve serve: listening (OpenAI-compatible API at /v1)"
        );
        serve_on(listener, app, shutdown::signal()).await
    })
}

/// Resolves once the engine has stopped for good after panics it could not
/// recover from (`/health` and `/ready` answer 503 from then on).
async fn engine_failed(state: &AppState) {
    while !state.engine.has_failed() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A server started in-process by [`spawn`].
pub struct ServerHandle {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServerHandle {
    /// Starts the graceful shutdown (as SIGTERM would).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Whether the server stopped (by `shutdown`, or by itself when the engine failed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the server to stop (after `shutdown`).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("server task panicked")?
    }
}

/// Starts serving `app` (a state alone: no Batch API) on `host:port` (port 0: a
/// free one) in the current runtime.
pub async fn spawn(app: impl Into<App>, host: &str, port: u16) -> anyhow::Result<ServerHandle> {
    let app: App = app.into();
    let state = app.state.clone();
    let listener = TcpListener::bind((host, port)).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_on(listener, app, async move {
        let _ = rx.await;
    }));
    Ok(ServerHandle {
        addr,
        state,
        stop: Some(tx),
        task,
    })
}
