//! `AppState`: what every handler shares — the engine handle, tokenizer and chat
//! template, names, limits, metrics, the draining flag and the in-flight count —
//! and the checks common to both generation endpoints (model name, prompt
//! encoding, token ids). Built from the flags in `build`; the engine request
//! itself is built in `ingress`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sloserve_api::ApiError;
use sloserve_engine::EngineHandle;
use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::tokenizer::hf_export::HfTokenizer;
use sloserve_model::tokenizer::Tokenizer;

use crate::error::ServerError;
use crate::guard_args::PrefixCacheScope;
use crate::keys::ApiKeys;
use crate::limits::InflightLimit;
use crate::listen::ConnLimits;
use crate::metrics::Metrics;

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The name reported by `/v1/models` and in responses.
    pub model_name: String,
    /// Names accepted in `model`: the served name, the file stem and file name.
    pub model_aliases: Vec<String>,
    /// The GGUF file served (its tokenizer is exported from it on demand).
    pub model_path: PathBuf,
    /// What the pooled endpoints run (embeddings, rerank, score).
    pub pooling: crate::pooling_mode::PoolingMode,
    /// The length of an embedding (the model's hidden size).
    pub embedding_size: usize,
    pub max_model_len: usize,
    /// Refuses prompt texts too long in bytes before they are tokenized.
    pub prompt_bound: crate::prompt_bound::PromptBound,
    pub created: u64,
    pub max_body_bytes: usize,
    pub shutdown_timeout: Duration,
    pub metrics: Metrics,
    /// API keys (`--api-key`); empty: open.
    pub api_keys: ApiKeys,
    /// Whose requests share cached prompt blocks.
    pub cache_scope: PrefixCacheScope,
    /// `--trust-gateway-headers`: the fairness id header names a request's flow.
    pub trust_gateway_headers: bool,
    pub inflight_limit: Arc<InflightLimit>,
    pub conn_limits: ConnLimits,
    /// `--request-timeout` (`None`: no deadline).
    pub request_timeout: Option<Duration>,
    /// `--stream-write-timeout` (`None`: a stream may stall forever).
    pub stream_write_timeout: Option<Duration>,
    /// `response_format` compiled into grammars for the sampler.
    pub structured: crate::structured::Structured,
    /// Bounds the CPU-heavy work running on the blocking pool at once.
    blocking_permits: tokio::sync::Semaphore,
    /// The Hugging Face tokenizer built from `model_path` (on first ask).
    hf_tokenizer: OnceLock<Result<HfTokenizer, String>>,
    draining: AtomicBool,
    inflight: AtomicUsize,
    next_id: AtomicU64,
}

/// What [`AppState::new`] is made of (the rest starts empty).
pub struct StateParts {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub model_name: String,
    pub model_aliases: Vec<String>,
    pub model_path: PathBuf,
    pub pooling: crate::pooling_mode::PoolingMode,
    pub embedding_size: usize,
    pub prompt_bound: crate::prompt_bound::PromptBound,
    pub max_body_bytes: usize,
    pub shutdown_timeout: Duration,
    pub api_keys: ApiKeys,
    pub cache_scope: PrefixCacheScope,
    pub trust_gateway_headers: bool,
    pub max_inflight_requests: usize,
    pub conn_limits: ConnLimits,
    pub request_timeout: Option<Duration>,
    pub stream_write_timeout: Option<Duration>,
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    /// The state over `parts` (built from the flags in [`crate::build`]); the
    /// counters start at zero.
    pub fn new(parts: StateParts) -> Arc<AppState> {
        let StateParts {
            engine,
            tokenizer,
            chat_template,
            model_name,
            model_aliases,
            model_path,
            pooling,
            embedding_size,
            prompt_bound,
            max_body_bytes,
            shutdown_timeout,
            api_keys,
            cache_scope,
            trust_gateway_headers,
            max_inflight_requests,
            conn_limits,
            request_timeout,
            stream_write_timeout,
        } = parts;
        Arc::new(AppState {
            max_model_len: engine.info().max_model_len,
            engine,
            tokenizer,
            chat_template,
            metrics: Metrics::new(&model_name),
            model_name,
            model_aliases,
            model_path,
            pooling,
            embedding_size,
            prompt_bound,
            created: unix_now(),
            max_body_bytes,
            shutdown_timeout,
            api_keys,
            cache_scope,
            trust_gateway_headers,
            inflight_limit: Arc::new(InflightLimit::new(max_inflight_requests)),
            conn_limits,
            request_timeout,
            stream_write_timeout,
            structured: Default::default(),
            blocking_permits: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            ),
            hf_tokenizer: OnceLock::new(),
            draining: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        })
    }

    /// The served model's tokenizer as a Hugging Face folder (built from the
    /// file's header once; blocking: call it on the blocking pool).
    pub fn hf_tokenizer(&self) -> Result<&HfTokenizer, ServerError> {
        self.hf_tokenizer
            .get_or_init(|| {
                sloserve_model::gguf::GgufFile::open(&self.model_path)
                    .and_then(|f| HfTokenizer::from_gguf(&f))
                    .map_err(|e| format!("{}: {e}", self.model_path.display()))
            })
            .as_ref()
            .map_err(|e| ServerError::Internal(format!("cannot export the tokenizer: {e}")))
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Stops taking requests: `/ready` turns 503, new requests get 503, the engine
    /// finishes what it has.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.engine.shutdown();
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    /// Waits until no request is in flight.
    pub async fn wait_idle(&self) {
        while self.inflight() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn check_accepting(&self) -> Result<(), ServerError> {
        if self.is_draining() {
            Err(ServerError::Draining)
        } else {
            Ok(())
        }
    }

    /// A 400 on a model that cannot generate (an encoder: it only pools), before
    /// a generation request's prompt is rendered or tokenized.
    pub fn check_generates(&self) -> Result<(), ServerError> {
        match self.engine.limits().pooled_only {
            true => Err(ServerError::engine(
                sloserve_engine::EngineError::PooledOnly,
                "model",
            )),
            false => Ok(()),
        }
    }

    /// `None` or a known name is fine; another name is a 404.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ServerError> {
        match model {
            Some(m) if !m.is_empty() && !self.model_aliases.iter().any(|a| a == m) => {
                Err(ApiError::model_not_found(m, &self.model_name).into())
            }
            _ => Ok(()),
        }
    }

    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }

    /// Tokenizes prompt text with the tokenizer's one BOS rule (`Tokenizer::with_bos`);
    /// control-token texts become their ids when `parse_special`, else plain text.
    pub fn encode(
        &self,
        text: &str,
        parse_special: bool,
        param: &str,
    ) -> Result<Vec<u32>, ServerError> {
        self.tokenizer
            .encode(text, parse_special)
            .map(|ids| self.tokenizer.with_bos(ids))
            .map_err(|e| ApiError::invalid(param, format!("{param}: cannot tokenize: {e}")).into())
    }

    /// `encode` off the async workers.
    pub async fn encode_async(
        self: &Arc<Self>,
        text: String,
        parse_special: bool,
        param: &'static str,
    ) -> Result<Vec<u32>, ServerError> {
        self.blocking(move |st| st.encode(&text, parse_special, param))
            .await?
    }

    /// Runs CPU-heavy request work (parsing large bodies, chat templates,
    /// tokenizing) on tokio's blocking pool, at most `blocking_permits` at once,
    /// so the async workers keep answering (e.g. `/health`), and below the
    /// engine's priority (`thread_priority::PREPARE_NICE`): a flood of requests
    /// to prepare or refuse does not slow the streams already running.
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&AppState) -> T + Send + 'static,
    ) -> Result<T, ServerError> {
        let _permit = self
            .blocking_permits
            .acquire()
            .await
            .map_err(|_| ServerError::Internal("the worker pool is closed".into()))?;
        let st = self.clone();
        tokio::task::spawn_blocking(move || {
            below_engine();
            f(&st)
        })
        .await
        .map_err(|e| {
            tracing::error!("a blocking worker task failed: {e}");
            ServerError::Internal("a worker task failed".into())
        })
    }

    /// Checks token ids given directly.
    pub fn check_ids(&self, ids: &[u32], param: &str) -> Result<(), ServerError> {
        let v = self.tokenizer.vocab_size();
        if let Some(t) = ids.iter().find(|&&t| t as usize >= v) {
            return Err(ApiError::invalid(
                param,
                format!("{param}: token id {t} is outside the vocabulary (size {v})"),
            )
            .into());
        }
        Ok(())
    }
}

/// Lowers this blocking-pool thread below the engine's priority, once.
fn below_engine() {
    thread_local!(static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    LOWERED.with(|l| {
        if !l.replace(true) {
            sloserve_engine::thread_priority::lower_current_thread(
                sloserve_engine::thread_priority::PREPARE_NICE,
            );
        }
    });
}

/// Counts a request as in flight while alive (graceful shutdown waits for zero).
pub struct InflightGuard(Arc<AppState>);

impl InflightGuard {
    pub fn new(state: &Arc<AppState>) -> Self {
        state.inflight.fetch_add(1, Ordering::AcqRel);
        InflightGuard(state.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}
