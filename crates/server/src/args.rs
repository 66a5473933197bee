//! `ServeArgs`: the flags of `sloserve serve`, and how they make the effective
//! `EngineConfig` (profile, then `--config` TOML, then flags) and `RunnerOptions`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sloserve_engine::{EngineConfig, SloClass, StepBudgetPolicy};
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
    /// Model name clients use (default: the file's stem).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most sequences running at once.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one engine step.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Most prompt tokens of one sequence per step.
    #[arg(long)]
    pub max_prefill_chunk: Option<usize>,
    /// While interactive requests wait or run, batch prefill fills a step only up
    /// to this many tokens.
    #[arg(long)]
    pub interactive_max_batched_tokens: Option<usize>,
    /// Caps the model's context length.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Compute threads for the model (default: one per core); several replicas
    /// can share a machine without oversubscribing it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Tokens per KV block.
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV cache memory in bytes (suffixes KiB, MiB, GiB accepted).
    #[arg(long, value_parser = parse_bytes)]
    pub kv_cache_memory: Option<u64>,
    /// Exact number of KV blocks (at most what the memory budget holds).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Disable the prefix cache.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Class of requests that name none.
    #[arg(long)]
    pub default_slo_class: Option<SloClass>,
    /// TTFT target of interactive requests that give none (ms).
    #[arg(long)]
    pub default_ttft_slo_ms: Option<f64>,
    /// TPOT target of interactive requests that give none (ms; default: the
    /// relative bound `--max-batch-interference`).
    #[arg(long)]
    pub default_tpot_slo_ms: Option<f64>,
    /// How steps carrying interactive work are bounded: `time` (SLO-aware) or
    /// `tokens` (the earlier policy).
    #[arg(long)]
    pub step_budget: Option<StepBudgetPolicy>,
    /// How much longer batch work may make a step carrying interactive work (0.2 = 20%).
    #[arg(long)]
    pub max_batch_interference: Option<f64>,
    /// Fraction of a target's allowance kept back for prediction error.
    #[arg(long)]
    pub slo_margin: Option<f64>,
    /// A batch sequence skipped this many steps in a row joins the next.
    #[arg(long)]
    pub batch_max_skip_steps: Option<u64>,
    /// For this long after interactive work, steps without it stay bounded (ms).
    #[arg(long)]
    pub interactive_linger_ms: Option<u64>,
    /// Longest predicted step without interactive work (ms).
    #[arg(long)]
    pub max_step_ms: Option<f64>,
    /// Refuse an interactive request whose predicted TTFT exceeds its SLO times this (0: never).
    #[arg(long)]
    pub ttft_reject_factor: Option<f64>,
    /// Refuse an interactive request predicted to wait longer than this to start
    /// (seconds; 0: never). Batch requests queue whatever their wait.
    #[arg(long)]
    pub max_queue_wait: Option<f64>,
    /// Waiting-queue bound (requests) of both classes.
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// Waiting-queue bound (prompt tokens) of both classes.
    #[arg(long)]
    pub max_waiting_prompt_tokens: Option<usize>,
    /// Waiting-queue bound (requests) of the batch class alone (after
    /// `--max-waiting-requests`; default 16384): the only bound, with the next, a
    /// batch request is refused for, besides its own deadline.
    #[arg(long)]
    pub batch_max_waiting_requests: Option<usize>,
    /// Waiting-queue bound (prompt tokens) of the batch class alone (default 16 Mi).
    #[arg(long)]
    pub batch_max_waiting_prompt_tokens: Option<usize>,
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
    pub batch: crate::batch::BatchApiArgs,
    /// KV-cache events over ZMQ (`--kv-events-endpoint`).
    #[command(flatten)]
    pub kv_events: crate::kv_events::KvEventsArgs,
}

/// "512MiB" -> 536870912.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((t, 1));
    num.trim()
        .parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("'{s}' is not a byte count (e.g. 536870912, 512MiB, 2GiB)"))
}

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
            |cfg| self.apply_flags(cfg),
        )?)
    }

    /// Set the engine settings given as flags.
    fn apply_flags(&self, cfg: &mut EngineConfig) {
        macro_rules! set {
            ($flag:ident => $($field:ident).+) => {
                if let Some(v) = self.$flag { cfg.$($field).+ = v; }
            };
        }
        set!(max_num_seqs => max_num_seqs);
        set!(max_num_batched_tokens => max_num_batched_tokens);
        set!(max_prefill_chunk => max_prefill_chunk);
        set!(block_size => block_size);
        set!(kv_cache_memory => kv_cache_memory);
        set!(default_slo_class => default_slo_class);
        set!(ttft_reject_factor => admission.ttft_reject_factor);
        set!(max_queue_wait => admission.max_queue_wait_s);
        set!(step_budget => step_budget);
        set!(max_batch_interference => max_batch_interference);
        set!(slo_margin => slo_margin);
        set!(batch_max_skip_steps => batch_max_skip_steps);
        set!(interactive_linger_ms => interactive_linger_ms);
        if self.max_step_ms.is_some() {
            cfg.max_step_ms = self.max_step_ms;
        }
        if self.default_tpot_slo_ms.is_some() {
            cfg.default_tpot_slo_ms = self.default_tpot_slo_ms;
        }
        if self.max_model_len.is_some() {
            cfg.max_model_len = self.max_model_len;
        }
        if self.interactive_max_batched_tokens.is_some() {
            cfg.interactive_max_batched_tokens = self.interactive_max_batched_tokens;
        }
        if self.num_kv_blocks.is_some() {
            cfg.num_kv_blocks = self.num_kv_blocks;
        }
        if self.default_ttft_slo_ms.is_some() {
            cfg.default_ttft_slo_ms = self.default_ttft_slo_ms;
        }
        if self.no_prefix_cache {
            cfg.enable_prefix_cache = false;
        }
        for limits in [&mut cfg.admission.interactive, &mut cfg.admission.batch] {
            if let Some(n) = self.max_waiting_requests {
                limits.max_waiting_requests = n;
            }
            if let Some(n) = self.max_waiting_prompt_tokens {
                limits.max_waiting_prompt_tokens = n;
            }
        }
        set!(batch_max_waiting_requests => admission.batch.max_waiting_requests);
        set!(batch_max_waiting_prompt_tokens => admission.batch.max_waiting_prompt_tokens);
    }

    pub fn runner_options(&self, cfg: &EngineConfig) -> RunnerOptions {
        RunnerOptions {
            precision: self.precision,
            block_size: cfg.block_size,
            kv_cache_memory: cfg.kv_cache_memory as usize,
            max_model_len: cfg.max_model_len,
            quantize: self.quantize,
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
        a.max_prefill_chunk = Some(64);
        a.max_waiting_requests = Some(3);
        a.kv_cache_memory = Some(parse_bytes("64MiB").unwrap());
        let c = a.engine_config().unwrap();
        assert_eq!(c.max_num_seqs, 7);
        assert_eq!(c.max_prefill_chunk, 64);
        assert_eq!(c.batch_aging_ms, 5000); // from the profile
        assert_eq!(c.admission.batch.max_waiting_requests, 3);
        assert_eq!(a.runner_options(&c).kv_cache_memory, 64 << 20);
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
