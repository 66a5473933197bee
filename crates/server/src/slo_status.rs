//! `GET /slo/status`: the live SLO page's data as one compact JSON object, read
//! from the same state `/metrics` renders (the [`Metrics`](crate::metrics::Metrics)
//! histograms' accessors, `EngineHandle::stats()`, admission's predicted wait, the
//! Batch API's store): per class its targets, TTFT / TPOT percentiles, attainment,
//! queue and tokens; the KV pool and prefix cache; the caller's running batches.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use sloserve_batch::types::{BatchObject, BatchStatus};
use sloserve_batch::Owner;
use sloserve_engine::stats::SloAttainment;
use sloserve_engine::SloClass;

use crate::metrics::{FinishedCounts, LatencySummary};
use crate::state::unix_now;
use crate::App;

/// The most running batches listed (the caller's newest first).
const MAX_BATCHES: usize = 20;

#[derive(Debug, Serialize)]
pub struct Status {
    pub model: String,
    /// Unix seconds when this was read, and when the server started.
    pub now: u64,
    pub started: u64,
    /// Generation tokens since start, all classes (`generation_tokens_total`).
    pub generation_tokens: u64,
    /// Measured prefill rate, tokens/s (moving average).
    pub prefill_tokens_per_s: f64,
    pub classes: Vec<ClassStatus>,
    pub kv: KvStatus,
    pub prefix_cache: PrefixCacheStatus,
    /// `None` with `--no-batch-api`.
    pub batch: Option<BatchStatusView>,
}

#[derive(Debug, Serialize)]
pub struct ClassStatus {
    pub class: SloClass,
    /// The profile's default targets (ms; requests may carry their own, and
    /// attainment counts each against its own). Batch requests have none.
    pub ttft_target_ms: Option<f64>,
    pub tpot_target_ms: Option<f64>,
    pub ttft: LatencySummary,
    pub tpot: LatencySummary,
    pub attainment: SloAttainment,
    pub running: usize,
    pub waiting: usize,
    /// Seconds a new request of this class is predicted to wait to start.
    pub predicted_wait_s: f64,
    /// Refused by admission control (429) since start.
    pub rejected: u64,
    pub finished: FinishedCounts,
    /// Tokens streamed after each request's first, since start (the page turns
    /// two readings into tokens/s).
    pub tokens_after_first: u64,
}

#[derive(Debug, Serialize)]
pub struct KvStatus {
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub block_size: usize,
    /// `blocks_used / blocks_total`, 0-1.
    pub usage: f64,
    /// Blocks in the prefix cache (held or idle), and those only it holds.
    pub prefix_cache_blocks: usize,
    pub cached_idle_blocks: usize,
}

#[derive(Debug, Serialize)]
pub struct PrefixCacheStatus {
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    /// `hit_tokens / queried_tokens` (0 before any lookup).
    pub hit_rate: f64,
}

#[derive(Debug, Serialize)]
pub struct BatchStatusView {
    /// Jobs in the store by status, all owners (as `sloserve:batch_jobs`).
    pub jobs: BTreeMap<String, u64>,
    /// The caller's jobs not yet finished, newest first.
    pub running: Vec<BatchJob>,
}

#[derive(Debug, Serialize)]
pub struct BatchJob {
    pub id: String,
    pub status: BatchStatus,
    pub created_at: u64,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub output_tokens: u64,
    pub tokens_per_second: Option<f64>,
    pub eta_seconds: Option<f64>,
}

impl From<BatchObject> for BatchJob {
    fn from(b: BatchObject) -> Self {
        BatchJob {
            id: b.id,
            status: b.status,
            created_at: b.created_at,
            total: b.request_counts.total,
            completed: b.request_counts.completed,
            failed: b.request_counts.failed,
            output_tokens: b.usage.output_tokens,
            tokens_per_second: b.sloserve.tokens_per_second,
            eta_seconds: b.sloserve.eta_seconds,
        }
    }
}

/// Everything but the Batch API's part (no I/O).
pub fn engine_status(app: &App) -> Status {
    let state = &app.state;
    let st = state.engine.stats();
    let cfg = state.engine.config();
    let classes = SloClass::ALL
        .into_iter()
        .map(|class| {
            let interactive = class == SloClass::Interactive;
            ClassStatus {
                class,
                ttft_target_ms: cfg.default_ttft_slo_ms.filter(|_| interactive),
                tpot_target_ms: cfg.default_tpot_slo_ms.filter(|_| interactive),
                ttft: state.metrics.ttft(class),
                tpot: state.metrics.tpot(class),
                attainment: *st.counters.slo.get(class),
                running: *st.running.get(class),
                waiting: *st.waiting.get(class),
                predicted_wait_s: state.engine.predicted_wait_s(class),
                rejected: *st.rejected.get(class),
                finished: state.metrics.finished(class),
                tokens_after_first: state.metrics.tokens_after_first(class),
            }
        })
        .collect();
    Status {
        model: state.model_name.clone(),
        now: unix_now(),
        started: state.created,
        generation_tokens: st.counters.generation_tokens,
        prefill_tokens_per_s: st.prefill_tokens_per_s,
        classes,
        kv: KvStatus {
            blocks_total: st.kv_blocks_total,
            blocks_used: st.kv_blocks_used,
            block_size: st.kv_block_size,
            usage: st.kv_usage,
            prefix_cache_blocks: st.prefix_cache_blocks,
            cached_idle_blocks: st.kv_blocks_cached_idle,
        },
        prefix_cache: PrefixCacheStatus {
            queried_tokens: st.counters.prefix_cache_queried_tokens,
            hit_tokens: st.counters.prefix_cache_hit_tokens,
            hit_rate: st.prefix_cache_hit_rate(),
        },
        batch: None,
    }
}

/// The handler. The caller's key is checked by `auth::require_key` like any
/// closed route; the batches listed are its own (as `GET /v1/batches` shows).
pub async fn handle(State(app): State<App>, owner: Option<Extension<Owner>>) -> Response {
    let mut status = engine_status(&app);
    if let Some(b) = app.batch.clone() {
        let owner = owner.map_or(Owner::NONE, |Extension(o)| o);
        let read = tokio::task::spawn_blocking(move || {
            let jobs = b
                .files()
                .batch_status_counts()
                .unwrap_or_default()
                .into_iter()
                .collect();
            let running = match b.list_batches(&owner, None, MAX_BATCHES) {
                Ok(list) => list
                    .data
                    .into_iter()
                    .filter(|j| !j.status.is_terminal())
                    .map(BatchJob::from)
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "slo status: cannot list batches");
                    Vec::new()
                }
            };
            BatchStatusView { jobs, running }
        });
        match read.await {
            Ok(view) => status.batch = Some(view),
            Err(e) => tracing::warn!("slo status: the batch read failed: {e}"),
        }
    }
    Json(status).into_response()
}
