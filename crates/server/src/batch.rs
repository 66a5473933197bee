//! The Batch API in `sloserve serve` and `sloserve batch run`: the
//! dispatcher that runs a batch line through the same handler as the synchronous
//! endpoint, as the batch's owner (so the body, cache scope, class ceiling and
//! limits are exactly what that key gets synchronously), and the offline run.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::body::{to_bytes, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use clap::Args;
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sloserve_api::{ApiError, NamesModel};
use sloserve_batch::offline::{self, OfflineRun};
use sloserve_batch::{BatchConfig, BatchService, Dispatch, Owner, Reply};

use crate::accept::Accepted;
use crate::batch_args::BatchApiArgs;
use crate::error::ServerError;
use crate::keys::Caller;
use crate::state::AppState;
use crate::{chat, completions, embeddings, rerank, responses, ServeArgs};

/// Runs a line through the synchronous handlers of a server's state.
pub struct HandlerDispatch {
    state: Arc<AppState>,
    /// `sloserve batch run`: the operator's own file, every line as the open caller.
    offline: bool,
}

impl HandlerDispatch {
    /// For the server's Batch API: each line runs as its batch's owner.
    pub fn new(state: &Arc<AppState>) -> Self {
        HandlerDispatch {
            state: state.clone(),
            offline: false,
        }
    }

    /// For `sloserve batch run`: lines run with no key.
    pub fn offline(state: &Arc<AppState>) -> Self {
        HandlerDispatch {
            state: state.clone(),
            offline: true,
        }
    }
}

impl Dispatch for HandlerDispatch {
    fn call<'a>(&'a self, owner: &'a Owner, url: &'a str, body: Value) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let state = self.state.clone();
            // The key that made the batch, resolved the way the auth middleware
            // resolves a synchronous request's: its cache salt and class ceiling
            // then come from the same `build_request` as that request's.
            let caller = match self.offline {
                true => Some(Caller::OPEN),
                false => state.api_keys.caller_for(owner),
            };
            let Some(caller) = caller else {
                return owner_gone();
            };
            // The line itself asks for the batch class (`sloserve_batch::line`).
            let body = || Ok(Bytes::from(body.to_string()));
            use sloserve_api::Endpoint as E;
            let Some(endpoint) = E::from_batch_url(url) else {
                return not_batchable(url);
            };
            let resp = match endpoint {
                E::Completions => run(state, caller, body(), completions::handle).await,
                E::ChatCompletions => run(state, caller, body(), chat::handle).await,
                E::Responses => run(state, caller, body(), responses::handle).await,
                E::Embeddings => run(state, caller, body(), embeddings::handle).await,
                E::Rerank => run(state, caller, body(), rerank::rerank).await,
                E::Score => run(state, caller, body(), rerank::score).await,
                // Not batchable (`from_batch_url` never names them).
                E::CompletionsRender
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
                | E::OpenApi
                | E::SloPage
                | E::SloScript
                | E::SloStyle
                | E::SloStatus => return not_batchable(url),
            }
            .into_response();
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse().ok());
            let bytes = to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Reply {
                status,
                body,
                retry_after,
            }
        })
    }
}

/// A handler run on a line: the endpoint's own prologue ([`Accepted`]), then it.
async fn run<T, F, Fut>(
    state: Arc<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
    handler: F,
) -> Response
where
    T: DeserializeOwned + NamesModel,
    F: FnOnce(Accepted<T>) -> Fut,
    Fut: Future<Output = Result<Response, ServerError>>,
{
    match Accepted::new(state, Some(caller), HeaderMap::new(), body) {
        Ok(a) => handler(a).await.into_response(),
        Err(e) => e.into_response(),
    }
}

/// A line whose `url` the Batch API does not take (validation refuses such a
/// file at upload; this holds for a job stored by an older version): a final 400.
fn not_batchable(url: &str) -> Reply {
    let e = ApiError::invalid(
        "url",
        format!("url: {url:?} is not an endpoint the Batch API runs"),
    );
    Reply {
        status: e.status,
        body: serde_json::to_value(e.body()).unwrap_or_default(),
        retry_after: None,
    }
}

/// The line's owner has no key on this server: a final 401 for the line.
fn owner_gone() -> Reply {
    let e = ApiError::unauthorized(
        "the API key that created this batch is not configured on this server; the line was not run",
    );
    Reply {
        status: e.status,
        body: serde_json::to_value(e.body()).unwrap_or_default(),
        retry_after: None,
    }
}

/// The in-flight bound of batch lines for the server's engine.
fn max_inflight(args: &BatchApiArgs, state: &AppState) -> usize {
    args.batch_max_inflight.unwrap_or_else(|| {
        let cfg = state.engine.config();
        cfg.max_num_seqs
            .min(cfg.admission.batch.max_waiting_requests / 2)
            .max(1)
    })
}

/// Opens the Batch API's store for `state` (None with `--no-batch-api`).
pub fn open(
    args: &BatchApiArgs,
    state: &Arc<AppState>,
) -> anyhow::Result<Option<Arc<BatchService>>> {
    if args.no_batch_api {
        return Ok(None);
    }
    let cfg = BatchConfig {
        data_dir: args.data_dir.clone(),
        max_file_bytes: args.max_batch_file_bytes,
        quota_bytes_per_owner: args.batch_quota_bytes_per_key,
        max_lines: args.max_batch_lines,
        // A line is a request: the synchronous endpoints' body limit bounds it.
        max_line_bytes: state.max_body_bytes,
        max_inflight: max_inflight(args, state),
        retention: args.batch_retention,
        machine_cost_per_hour: args.machine_cost_per_hour,
    };
    let svc = BatchService::open(cfg, Box::new(HandlerDispatch::new(state)))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot open the batch store in {}", args.data_dir.display()))?;
    Ok(Some(svc))
}

/// `sloserve batch run`: a batch file through the model in-process.
#[derive(Args, Debug, Clone)]
pub struct BatchRunArgs {
    /// Input file: one `{custom_id, method, url, body}` per line.
    #[arg(short, long)]
    pub input: PathBuf,
    /// Output file (appended to: a partial file from an interrupted run is resumed).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Error lines go here (default: into the output file, as vLLM's run-batch).
    #[arg(long)]
    pub errors: Option<PathBuf>,
    /// Requests in flight at once (default: the engine's max_num_seqs).
    #[arg(long)]
    pub concurrency: Option<usize>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

pub fn run_offline(args: BatchRunArgs) -> anyhow::Result<()> {
    let mut serve = args.serve.clone();
    serve.batch.no_batch_api = true;
    sloserve_model::set_compute_threads(serve.threads);
    let state = AppState::load(&serve)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let run = OfflineRun {
        input: args.input,
        output: args.output,
        errors: args.errors,
        concurrency: args
            .concurrency
            .unwrap_or_else(|| state.engine.config().max_num_seqs),
        max_lines: serve.batch.max_batch_lines,
        max_line_bytes: serve.max_body_bytes,
        progress: true,
    };
    let s = rt.block_on(offline::run(
        &run,
        Arc::new(HandlerDispatch::offline(&state)),
    ))?;
    eprintln!(
        "{} completed, {} failed, {} already done; {} output tokens in {:.1} s ({:.1} tok/s)",
        s.completed,
        s.failed,
        s.skipped,
        s.output_tokens,
        s.secs,
        s.output_tokens as f64 / s.secs.max(1e-9)
    );
    state.begin_drain();
    Ok(())
}
