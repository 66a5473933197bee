//! `AppState`: what every handler shares — the engine handle, tokenizer and chat
//! template, names, limits, metrics, the draining flag and the in-flight count —
//! and the steps common to both generation endpoints (model name check, prompt
//! encoding, SLO class, building and submitting the engine `Request`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::http::HeaderMap;
use sloserve_api::{ApiError, GenParams};
use sloserve_engine::{
    Engine, EngineConfig, EngineHandle, Request, SamplingParams, SloClass, StopConditions,
};
use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::LoadedModel;

use crate::args::ServeArgs;
use crate::error::ServerError;
use crate::metrics::Metrics;

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The name reported by `/v1/models` and in responses.
    pub model_name: String,
    /// Names accepted in `model`: the served name, the file stem and file name.
    pub model_aliases: Vec<String>,
    pub max_model_len: usize,
    pub created: u64,
    pub max_body_bytes: usize,
    pub shutdown_timeout: Duration,
    pub metrics: Metrics,
    draining: AtomicBool,
    inflight: AtomicUsize,
    next_id: AtomicU64,
}

/// Prompts longer than this (bytes) are tokenized on a blocking thread.
const LARGE_TEXT: usize = 16 << 10;

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    /// Loads the model, starts the engine and logs the effective configuration.
    pub fn load(args: &ServeArgs) -> anyhow::Result<Arc<AppState>> {
        let cfg = args.engine_config()?;
        let opts = args.runner_options(&cfg);
        let t0 = std::time::Instant::now();
        let model = LoadedModel::load(&args.model, &opts)
            .with_context(|| format!("cannot load {}", args.model.display()))?;
        tracing::info!(
            model = %args.model.display(),
            secs = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "model loaded"
        );
        Self::from_model(args, model, cfg)
    }

    pub fn from_model(
        args: &ServeArgs,
        model: LoadedModel,
        cfg: EngineConfig,
    ) -> anyhow::Result<Arc<AppState>> {
        let LoadedModel {
            tokenizer,
            chat_template,
            runner,
            ..
        } = model;
        let engine = Engine::start(Box::new(runner), cfg)?;
        let name = args.model_name();
        let mut aliases = vec![name.clone(), args.model_stem()];
        if let Some(f) = args.model.file_name() {
            aliases.push(f.to_string_lossy().into_owned());
        }
        aliases.push(args.model.display().to_string());
        let max_model_len = engine.info().max_model_len;
        tracing::info!(
            profile = %args.profile,
            precision = ?args.precision,
            served_model_name = %name,
            max_model_len,
            kv_blocks = engine.info().num_kv_blocks,
            "effective engine configuration:\n{}",
            engine.config().to_toml_string()
        );
        Ok(Arc::new(AppState {
            engine,
            tokenizer,
            chat_template,
            metrics: Metrics::new(&name),
            model_name: name,
            model_aliases: aliases,
            max_model_len,
            created: unix_now(),
            max_body_bytes: args.max_body_bytes,
            shutdown_timeout: args.shutdown_timeout(),
            draining: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }))
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

    /// Tokenizes prompt text with the tokenizer's one BOS rule (`Tokenizer::encode_prompt`).
    pub fn encode(&self, text: &str, param: &str) -> Result<Vec<u32>, ServerError> {
        self.tokenizer
            .encode_prompt(text)
            .map_err(|e| ApiError::invalid(param, format!("{param}: cannot tokenize: {e}")).into())
    }

    /// `encode` off the async workers when the text is large.
    pub async fn encode_async(
        self: &Arc<Self>,
        text: String,
        param: &'static str,
    ) -> Result<Vec<u32>, ServerError> {
        if text.len() < LARGE_TEXT {
            return self.encode(&text, param);
        }
        let st = self.clone();
        tokio::task::spawn_blocking(move || st.encode(&text, param))
            .await
            .map_err(|e| ServerError::Internal(format!("tokenizer task failed: {e}")))?
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

    /// The request's class: body `slo_class`, else the `X-SLO-Class` header, else
    /// the profile's default (always the default when the engine runs without classes).
    pub fn resolve_class(
        &self,
        headers: &HeaderMap,
        params: &GenParams,
    ) -> Result<(Option<SloClass>, SloClass), ServerError> {
        let asked = match (&params.slo_class, headers.get("x-slo-class")) {
            (Some(c), _) => Some(
                c.parse::<SloClass>()
                    .map_err(|e| ApiError::invalid("slo_class", e))?,
            ),
            (None, Some(h)) => Some(
                h.to_str()
                    .map_err(|_| "not ASCII".to_string())
                    .and_then(|s| s.parse::<SloClass>())
                    .map_err(|e| {
                        ApiError::invalid("X-SLO-Class", format!("X-SLO-Class header: {e}"))
                    })?,
            ),
            (None, None) => None,
        };
        let cfg = self.engine.config();
        let effective = match (cfg.slo_classes, asked) {
            (true, Some(c)) => c,
            _ => cfg.default_slo_class,
        };
        Ok((asked, effective))
    }

    /// Builds the engine request: checks the prompt and `max_tokens` against the
    /// context (errors name `prompt_param` / `max_tokens`), fills EOS ids.
    pub fn build_request(
        &self,
        prompt: Vec<u32>,
        params: &GenParams,
        class: Option<SloClass>,
        prompt_param: &'static str,
    ) -> Result<Request, ServerError> {
        let len = prompt.len();
        let limits = self.engine.limits();
        if len > limits.max_prompt_len {
            return Err(ServerError::engine(
                sloserve_engine::EngineError::PromptTooLong {
                    len,
                    max: limits.max_prompt_len,
                },
                prompt_param,
            ));
        }
        if len == 0 {
            return Err(ApiError::invalid(
                prompt_param,
                format!("{prompt_param}: the prompt is empty"),
            )
            .into());
        }
        let room = self.max_model_len - len;
        let max_tokens = match params.max_tokens {
            None => room,
            Some(m) if m as usize <= room => m as usize,
            Some(m) => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "max_tokens: this model's maximum context length is {} tokens, but {} were requested ({len} in the prompt, {m} for the completion); reduce the prompt or max_tokens",
                        self.max_model_len,
                        len + m as usize
                    ),
                )
                .with_code("context_length_exceeded")
                .into())
            }
        };
        Ok(Request {
            prompt,
            sampling: SamplingParams {
                temperature: params.temperature,
                top_k: params.top_k,
                top_p: params.top_p,
                min_p: params.min_p,
                seed: params.seed,
                presence_penalty: params.presence_penalty,
                frequency_penalty: params.frequency_penalty,
                logprobs: params.logprobs,
            },
            stop: StopConditions {
                max_tokens,
                stop_token_ids: Vec::new(),
                eos_token_ids: self.tokenizer.stop_token_ids(),
                ignore_eos: params.ignore_eos,
            },
            slo_class: class,
            ttft_slo_ms: params.ttft_slo_ms,
        })
    }
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
