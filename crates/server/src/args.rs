//! `ServeArgs`: the flags of `sloserve serve`, and how they make the effective
//! `EngineConfig` (profile, then `--config` TOML, then flags) and `RunnerOptions`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sloserve_engine::EngineConfig;
use sloserve_model::rope::{RopeOverride, ScalingKind};
use sloserve_model::{Precision, RunnerOptions, WeightType};

/// The default model file (fetched by `make model`).
pub use sloserve_model::DEFAULT_MODEL_PATH as DEFAULT_MODEL;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// GGUF model file.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Engine profile: interactive, batch or mixed.
    #[arg(long, default_value = "interactive")]
    pub profile: String,
    /// TOML file of engine settings laid over the profile (same keys as the profiles).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// fast (quantized weights; 8-bit activations in decode steps, f32 products for
    /// prompts), int8 (8-bit activations throughout, as llama.cpp: faster prefill,
    /// llama.cpp's accuracy) or exact (f32 on dequantized weights).
    #[arg(long, default_value = "fast")]
    pub precision: Precision,
    /// Re-quantize the weight matrices at load to q8_0, q4_0, q4_1 or f16 (default:
    /// the file's own types): trades accuracy for speed and memory.
    #[arg(long)]
    pub quantize: Option<WeightType>,
    /// RoPE scaling over the file's: none, linear or yarn (as llama-server's
    /// `--rope-scaling`); with `--rope-scale` (the context's scaling factor) and,
    /// for YaRN, `--yarn-orig-ctx` (the context the model was trained on).
    #[arg(long, value_parser = parse_rope_scaling)]
    pub rope_scaling: Option<ScalingKind>,
    /// RoPE context scaling factor (llama-server's `--rope-scale`): 4 stretches a
    /// 32k model to 128k.
    #[arg(long)]
    pub rope_scale: Option<f32>,
    /// YaRN's original context length (default: the file's, else its training context).
    #[arg(long)]
    pub yarn_orig_ctx: Option<usize>,
    /// A chat template (Jinja) to use instead of the file's `tokenizer.chat_template`,
    /// as llama-server's `--chat-template-file`.
    #[arg(long)]
    pub chat_template_file: Option<PathBuf>,
    /// Model name clients use (default: the file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// How `/v1/embeddings`, `/v1/rerank` and `/score` pool (llama-server's
    /// `--pooling`): none, mean, cls, last or rank (a decoder reranker's
    /// P(yes)); default: the file's `{arch}.pooling_type`, else last.
    #[arg(long, value_enum)]
    pub pooling: Option<crate::pooling_mode::PoolingFlag>,
    /// Lock the loaded weights and KV cache in RAM (`mlockall`) so they are never
    /// swapped out; a refusal (`ulimit -l`) is a warning and serving goes on.
    #[arg(long)]
    pub mlock: bool,
    /// Compute threads for the model (default: one per core); several replicas
    /// can share a machine without oversubscribing it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// The engine's settings (generated from `EngineConfig`'s declarations; see
    /// docs/serving.md's table).
    #[command(flatten)]
    pub engine: crate::engine_flags::EngineFlags,
    /// Seconds in-flight requests get to finish after SIGTERM / ctrl-c.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// API keys, connection limits and timeouts.
    #[command(flatten)]
    pub guard: crate::guard_args::GuardArgs,
    /// Print the effective engine configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    #[command(flatten)]
    pub batch: crate::batch_args::BatchApiArgs,
    /// KV-cache events over ZMQ (`--kv-events-endpoint`).
    #[command(flatten)]
    pub kv_events: crate::kv_events::KvEventsArgs,
}

pub use sloserve_engine::knobs::parse_bytes;

impl ServeArgs {
    /// Arguments with every default (as `sloserve serve` with no flags).
    pub fn defaults() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: ServeArgs,
        }
        P::parse_from(["serve"]).a
    }

    /// Profile, then `--config` TOML, then flags.
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        Ok(EngineConfig::load(
            &self.profile,
            self.config.as_deref(),
            self.engine.overrides(),
            |_| {},
        )?)
    }

    pub fn runner_options(&self, cfg: &EngineConfig) -> RunnerOptions {
        RunnerOptions {
            precision: self.precision,
            block_size: cfg.block_size,
            kv_cache_memory: cfg.kv_cache_memory.map(|b| b as usize),
            kv_cache_type: cfg.kv_cache_type,
            max_model_len: cfg.max_model_len,
            quantize: self.quantize,
            rope: RopeOverride {
                kind: self.rope_scaling,
                factor: self.rope_scale,
                orig_ctx: self.yarn_orig_ctx,
            },
            kv_dtype: None,
        }
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.shutdown_timeout.max(0.0))
    }

    /// The name clients use: `--served-model-name`, else the file's stem.
    pub fn model_name(&self) -> String {
        self.served_model_name
            .clone()
            .unwrap_or_else(|| self.model_stem())
    }

    pub fn model_stem(&self) -> String {
        self.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
}

fn parse_rope_scaling(s: &str) -> Result<ScalingKind, String> {
    ScalingKind::parse(s).ok_or_else(|| format!("'{s}': expected none, linear or yarn"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_config_then_flags() {
        let dir = std::env::temp_dir().join(format!("sloserve-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "max_num_seqs = 7\nmax_prefill_chunk = 99\n").unwrap();
        let mut a = ServeArgs::defaults();
        assert_eq!(a.port, 8000);
        a.profile = "mixed".into();
        a.config = Some(file);
        a.engine.set("max-prefill-chunk", "64").unwrap();
        a.engine.set("max-waiting-requests", "3").unwrap();
        a.engine.set("kv-cache-memory", "64MiB").unwrap();
        let c = a.engine_config().unwrap();
        assert_eq!(c.max_num_seqs, 7);
        assert_eq!(c.max_prefill_chunk, 64);
        assert_eq!(c.batch_aging_ms, 5000); // from the profile
        assert_eq!(c.admission.batch.max_waiting_requests, 3);
        assert_eq!(a.runner_options(&c).kv_cache_memory, Some(64 << 20));
        a.profile = "nope".into();
        assert!(a.engine_config().is_err());
        a.profile = "mixed".into();
        a.config = Some(dir.join("missing.toml"));
        let e = a.engine_config().unwrap_err().to_string();
        assert!(e.contains("missing.toml: cannot read it"), "{e}");
        assert_eq!(a.model_name(), "SmolLM2-135M-Instruct.Q4_1");
        assert!(parse_bytes("12x").is_err());
    }
}
