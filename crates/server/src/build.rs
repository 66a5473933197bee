//! The served state built from `sloserve serve`'s flags: the model loaded,
//! `--chat-template-file` applied, the engine started (with the KV-events
//! publisher when asked), names and limits read from the flags.

use std::sync::Arc;

use anyhow::Context;
use sloserve_engine::{EngineConfig, ModelRunner};
use sloserve_model::chat_template::ChatTemplate;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::LoadedModel;

use crate::args::ServeArgs;
use crate::guard_args::{secs, PrefixCacheScope};
use crate::keys::ApiKeys;
use crate::listen::ConnLimits;
use crate::state::{AppState, StateParts};

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
            kernels = sloserve_model::kernels::cpu::kernels_in_use(),
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
            mut chat_template,
            runner,
            ..
        } = model;
        if let Some(path) = &args.chat_template_file {
            let src = std::fs::read_to_string(path)
                .with_context(|| format!("--chat-template-file {}", path.display()))?;
            let t = ChatTemplate::with_tokenizer(&src, &tokenizer)
                .with_context(|| format!("--chat-template-file {}", path.display()))?;
            chat_template = Some(t);
        }
        Self::from_parts(args, tokenizer, chat_template, Box::new(runner), cfg)
    }

    /// The state over any runner (tests wrap the model's runner).
    pub fn from_parts(
        args: &ServeArgs,
        tokenizer: Tokenizer,
        chat_template: Option<ChatTemplate>,
        runner: Box<dyn ModelRunner>,
        cfg: EngineConfig,
    ) -> anyhow::Result<Arc<AppState>> {
        let g = &args.guard;
        let engine = crate::kv_events::start_engine(
            &args.kv_events,
            format!("kv@{}:{}@{}", args.host, args.port, args.model_name()),
            !g.api_keys.is_empty() && g.prefix_cache_scope() == PrefixCacheScope::Global,
            runner,
            cfg,
        )?;
        let name = args.model_name();
        let mut aliases = vec![name.clone(), args.model_stem()];
        if let Some(f) = args.model.file_name() {
            aliases.push(f.to_string_lossy().into_owned());
        }
        aliases.push(args.model.display().to_string());
        // The pooled endpoints' mode and vector length, from the file's header.
        let config = sloserve_model::gguf::GgufFile::open(&args.model)
            .and_then(|f| sloserve_model::config::ModelConfig::from_gguf(&f))
            .with_context(|| format!("cannot read {}", args.model.display()))?;
        let pooling = crate::pooling_mode::PoolingMode::resolve(
            args.pooling,
            config.pooling_type,
            &tokenizer,
        )
        .context("--pooling")?;
        let max_model_len = engine.info().max_model_len;
        let prompt_bound =
            crate::prompt_bound::PromptBound::new(&tokenizer, engine.limits().max_prompt_len);
        tracing::info!(
            profile = %args.profile,
            precision = ?args.precision,
            served_model_name = %name,
            max_model_len,
            kv_blocks = engine.info().num_kv_blocks,
            "effective engine configuration:\n{}",
            engine.config().to_toml_string()
        );
        Ok(AppState::new(StateParts {
            engine,
            tokenizer,
            chat_template,
            model_name: name,
            model_aliases: aliases,
            model_path: args.model.clone(),
            pooling,
            embedding_size: config.hidden_size,
            prompt_bound,
            max_body_bytes: args.max_body_bytes,
            shutdown_timeout: args.shutdown_timeout(),
            api_keys: ApiKeys::new(g.api_keys.clone(), g.metrics_require_key),
            cache_scope: g.prefix_cache_scope(),
            trust_gateway_headers: g.trust_gateway_headers,
            max_inflight_requests: g.max_inflight_requests,
            conn_limits: ConnLimits {
                max_connections: g.max_connections.max(1),
                header_read_timeout: secs(g.header_read_timeout),
                keep_alive_timeout: secs(g.keep_alive_timeout),
                body_read_timeout: secs(g.body_read_timeout),
                stall_timeout: secs(g.stream_write_timeout),
            },
            request_timeout: secs(g.request_timeout),
            stream_write_timeout: secs(g.stream_write_timeout),
        }))
    }
}
