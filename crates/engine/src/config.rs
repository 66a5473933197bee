//! `EngineConfig`: every scheduling knob of the engine, with defaults, as data that
//! TOML (`--config FILE`, profiles) can set field by field.

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::request::SloClass;

crate::knobs! {
/// Admission limits of one SLO class's waiting queue (requests not yet started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassLimits {
    /// Waiting-queue bound (requests): beyond it a request is refused as queue-full.
    [flag "max-waiting-requests"]
    pub max_waiting_requests: usize = 1024,
    /// Waiting-queue bound (prompt tokens): beyond it a request is refused as queue-full.
    [flag "max-waiting-prompt-tokens"]
    pub max_waiting_prompt_tokens: usize = 1 << 20,
}
}

crate::knobs! {
/// Admission control: bounded waiting queues per class, and latency-based
/// refusal of interactive requests only. A batch request is refused only past
/// its class's queue bound (`batch`) or its own deadline (`Request::deadline`):
/// a batch client expects to wait, so it queues whatever its predicted wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    pub interactive: ClassLimits = ClassLimits::default(),
    /// The batch queue bound: large (16384 requests, 16 Mi prompt tokens, about
    /// 64 MiB of prompt ids), the only limit on how much batch work may wait.
    pub batch: ClassLimits = ClassLimits {
        max_waiting_requests: 16384,
        max_waiting_prompt_tokens: 1 << 24,
    },
    /// Refuse an interactive request whose predicted TTFT exceeds its target times
    /// this factor (0: never).
    [flag "ttft-reject-factor"]
    pub ttft_reject_factor: f64 = 0.9,
    /// Refuse an interactive request predicted to wait longer than this many
    /// seconds before it starts (one waiting twice this is shed; 0: never). Batch
    /// requests queue whatever their wait.
    [flag "max-queue-wait"]
    pub max_queue_wait_s: f64 = 60.0,
}
}

impl AdmissionConfig {
    pub fn limits(&self, class: SloClass) -> &ClassLimits {
        match class {
            SloClass::Interactive => &self.interactive,
            SloClass::Batch => &self.batch,
        }
    }
}

/// How the scheduler bounds a step that carries interactive work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepBudgetPolicy {
    /// In time: batch work joins a step only as far as the predicted step time
    /// stays within the tightest interactive target (absolute TPOT/TTFT, or the
    /// relative `max_batch_interference` bound). The SLO-aware default.
    #[default]
    Time,
    /// In tokens (the earlier policy): every running decode joins each step and
    /// batch prefill fills it up to `interactive_max_batched_tokens`.
    Tokens,
}

impl std::str::FromStr for StepBudgetPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "time" => Ok(StepBudgetPolicy::Time),
            "tokens" => Ok(StepBudgetPolicy::Tokens),
            other => Err(format!(
                "unknown step budget '{other}' (expected 'time' or 'tokens')"
            )),
        }
    }
}

/// What the paged KV cache holds per value (llama.cpp's `-ctk`/`-ctv` names):
/// `f16` (the default; f32 in exact precision), or blocks of 32 values along the
/// head dimension with one f16 scale, `q8_0` (8-bit values, 34 bytes a block: 0.53x
/// f16's memory) or `q4_0` (4-bit, 18 bytes: 0.28x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KvCacheType {
    #[default]
    #[serde(rename = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
}

impl KvCacheType {
    /// The flag's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F16 => "f16",
            KvCacheType::Q8_0 => "q8_0",
            KvCacheType::Q4_0 => "q4_0",
        }
    }
}

impl std::str::FromStr for KvCacheType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f16" => Ok(KvCacheType::F16),
            "q8_0" => Ok(KvCacheType::Q8_0),
            "q4_0" => Ok(KvCacheType::Q4_0),
            other => Err(format!(
                "unknown KV cache type '{other}' (expected 'f16', 'q8_0' or 'q4_0')"
            )),
        }
    }
}

crate::knobs! {
/// The engine's configuration, declared once: each field's doc is its `serve`
/// flag's help and its row in docs/serving.md. Missing TOML keys take the
/// defaults below; unknown keys are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Tokens per KV block (the runner's value wins if they differ).
    [flag "block-size"]
    pub block_size: usize = 16,
    /// KV cache memory budget in bytes (suffixes KiB, MiB, GiB); the runner
    /// allocates as many blocks as fit. Unset: half of the memory the machine has
    /// available at start once the weights and a 300 MB margin are taken, at most
    /// 8 GiB (docs/serving.md, "KV cache memory").
    [flag "kv-cache-memory" bytes]
    pub kv_cache_memory: Option<u64> = None,
    /// What the KV cache holds: `f16` (f32 in exact precision), `q8_0` or `q4_0`
    /// (llama.cpp's block types: 32 values along the head dimension and one f16
    /// scale; 0.53x and 0.28x f16's bytes per token, so as many more tokens fit the
    /// same `kv_cache_memory`). Needs a head dimension that is a multiple of 32.
    [flag "kv-cache-type"]
    pub kv_cache_type: KvCacheType = KvCacheType::F16,
    /// Exact number of KV blocks, overriding the memory budget (at most what it holds).
    [flag "num-kv-blocks"]
    pub num_kv_blocks: Option<usize> = None,
    /// Caps the model's context length.
    [flag "max-model-len"]
    pub max_model_len: Option<usize> = None,
    /// Most sequences running at once (the batch size).
    [flag "max-num-seqs"]
    pub max_num_seqs: usize = 64,
    /// Most tokens (decodes + prefill chunks) in one step.
    [flag "max-num-batched-tokens"]
    pub max_num_batched_tokens: usize = 1024,
    /// Most prompt tokens of one sequence in one step.
    [flag "max-prefill-chunk"]
    pub max_prefill_chunk: usize = 256,
    /// With `step_budget = "tokens"` and SLO classes: while interactive requests
    /// wait or run, batch prefill fills a step only up to this many tokens (at
    /// least one block's worth; unset: `max_num_batched_tokens`).
    [flag "interactive-max-batched-tokens"]
    pub interactive_max_batched_tokens: Option<usize> = None,
    /// How steps carrying interactive work are bounded: `time` (SLO-aware: batch
    /// work joins only as far as the predicted step meets the interactive targets)
    /// or `tokens` (the earlier policy).
    [flag "step-budget"]
    pub step_budget: StepBudgetPolicy = StepBudgetPolicy::Time,
    /// With `step_budget = "time"`: how much longer batch work may make a step
    /// carrying interactive requests without an absolute target (0.2 = 20%).
    [flag "max-batch-interference"]
    pub max_batch_interference: f64 = 0.2,
    /// With `step_budget = "time"` and an absolute TPOT target: a step carrying
    /// interactive decodes is also bounded by this many times their predicted time
    /// alone (unset: by the target only). On a fast model a reading-speed target
    /// allows steps many times a stream's own: its reader does not notice, but an
    /// arriving request's first token waits behind such a step.
    [flag "max-tpot-stretch"]
    pub max_tpot_stretch: Option<f64> = None,
    /// Safety margin on every time bound: batch work may use this fraction less of
    /// the time a target leaves over the interactive work (prediction error).
    [flag "slo-margin"]
    pub slo_margin: f64 = 0.5,
    /// A batch sequence left out of this many consecutive steps joins the next one
    /// whatever it costs (no batch sequence starves).
    [flag "batch-max-skip-steps"]
    pub batch_max_skip_steps: u64 = 32,
    /// With `step_budget = "time"`: for this long (ms) after the last step that
    /// carried interactive work, steps without any stay bounded as if they carried
    /// it (a client's next request does not wait behind a full batch step; 0: off).
    [flag "interactive-linger-ms"]
    pub interactive_linger_ms: u64 = 1000,
    /// With `step_budget = "time"`: for this long (ms) after an interactive request
    /// finishes, every step stays within the relative bound
    /// (`max_batch_interference`), as while an interactive request waits: the
    /// client's next request, which agents, tool loops and other closed-loop
    /// clients send at once, starts after a short step instead of a full one
    /// (0: off).
    [flag "interactive-followup-ms"]
    pub interactive_followup_ms: u64 = 20,
    /// With `step_budget = "time"`: the longest predicted batch prefill of a step
    /// without interactive work (ms), on top of its batch decode rows, so an
    /// interactive arrival never waits behind a long step (unset: the token budget).
    [flag "max-step-ms"]
    pub max_step_ms: Option<f64> = None,
    /// Reuse cached KV of shared prompt prefixes (the flag disables it).
    [flag "no-prefix-cache" off]
    pub enable_prefix_cache: bool = true,
    /// Also keep the prefix cache's full blocks on disk under this directory
    /// (written as they are cached, off the engine thread), so a prefix evicted
    /// from RAM or lost in a restart is loaded instead of recomputed
    /// (docs/serving.md, "Prefix cache tiers"). Unset: RAM only.
    [flag "prefix-cache-dir"]
    pub prefix_cache_dir: Option<std::path::PathBuf> = None,
    /// Most bytes the prefix cache's disk tier keeps (suffixes KiB, MiB, GiB);
    /// past it the least recently used block files are deleted.
    [flag "prefix-cache-disk-size" bytes]
    pub prefix_cache_disk_size: u64 = 10 << 30,
    /// Serve interactive before batch requests. Off: every request is
    /// `default_slo_class`, first-come first-served.
    pub slo_classes: bool = true,
    /// Let a waiting interactive request preempt running batch sequences when the
    /// engine is full. (Preemption for KV memory among running sequences always
    /// happens; without it the engine could deadlock.)
    pub enable_preemption: bool = true,
    /// A sequence preempted for another reason than KV memory (an interactive
    /// request taking its place) keeps its KV blocks while it waits, and resumes
    /// without recomputing; when memory is needed they are released before any
    /// running sequence is preempted (its full blocks stay in the prefix cache and
    /// its disk tier). The flag disables it: preempted sequences free their KV at once.
    [flag "no-preemption-keeps-kv" off]
    pub preemption_keeps_kv: bool = true,
    /// When no batch sequence runs, a batch request that has waited longer than
    /// this (ms) is admitted as interactive, so batch work never starves.
    [flag "batch-aging-ms"]
    pub batch_aging_ms: u64 = 10_000,
    /// Class of requests that name none.
    [flag "default-slo-class"]
    pub default_slo_class: SloClass = SloClass::Interactive,
    /// TTFT target of interactive requests that give none (ms).
    [flag "default-ttft-slo-ms"]
    pub default_ttft_slo_ms: Option<f64> = None,
    /// TPOT target of interactive requests that give none (ms; unset: the relative
    /// bound `max_batch_interference`).
    [flag "default-tpot-slo-ms"]
    pub default_tpot_slo_ms: Option<f64> = None,
    /// Fraction of KV blocks kept free when admitting a new sequence, so running
    /// sequences can grow without immediate preemption.
    [flag "kv-watermark"]
    pub kv_watermark: f64 = 0.01,
    /// N-gram speculation (prompt lookup) for interactive decode rows: the most
    /// draft tokens verified in one step (0: off). A row drafts only when its
    /// measured acceptance pays for the verification in the step-time model
    /// (so not in large batches); batch-class rows never draft.
    [flag "spec-max-draft"]
    pub spec_max_draft: usize = 8,
    /// N-gram speculation: the longest suffix of a sequence looked up among its
    /// earlier tokens (prompt and output).
    [flag "spec-ngram-max"]
    pub spec_ngram_max: usize = 4,
    /// N-gram speculation: the shortest suffix looked up.
    [flag "spec-ngram-min"]
    pub spec_ngram_min: usize = 2,
    /// Structured output: the most tokens a grammar forces (its only
    /// continuation) that one decode row verifies in a step as its draft
    /// (fast-forward), for both classes, beside any n-gram draft (0: off).
    [flag "grammar-max-forced"]
    pub grammar_max_forced: usize = 16,
    /// Admission limits (queue bounds per class, latency-based refusal).
    pub admission: AdmissionConfig = AdmissionConfig::default(),
    /// Inference objectives (the gateway's `x-llm-d-inference-objective` header)
    /// and the class each runs as, e.g. `chat = "interactive"`, `offline = "batch"`.
    /// A request that names its class itself keeps it; an unknown objective gets
    /// the default class.
    pub objectives: std::collections::BTreeMap<String, SloClass> = Default::default(),
}
}

fn bad(msg: impl Into<String>) -> EngineError {
    EngineError::InvalidConfig(msg.into())
}

/// Recursively overlays `over` onto `base` (tables merge key by key).
pub(crate) fn merge_toml(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_toml(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

impl EngineConfig {
    /// How n-gram drafts are found.
    pub fn ngram_params(&self) -> crate::speculate::NgramParams {
        crate::speculate::NgramParams {
            ngram_max: self.spec_ngram_max,
            ngram_min: self.spec_ngram_min,
            max_draft: self.spec_max_draft,
        }
    }

    /// The profile's side of the SLO contract (`sloserve_slo::resolve`).
    pub fn slo_policy(&self) -> sloserve_slo::Policy<'_> {
        sloserve_slo::Policy {
            classes: self.slo_classes,
            default_class: self.default_slo_class,
            objectives: &self.objectives,
            default_ttft_ms: self.default_ttft_slo_ms,
            default_tpot_ms: self.default_tpot_slo_ms,
        }
    }

    /// A full configuration from TOML (missing keys default).
    pub fn from_toml_str(s: &str) -> Result<Self, EngineError> {
        toml::from_str(s).map_err(|e| bad(e.to_string()))
    }

    /// This configuration with the keys set in `s` (TOML) replaced, e.g. a
    /// `--config FILE` over a profile.
    pub fn with_overrides_toml(&self, s: &str) -> Result<Self, EngineError> {
        let over: toml::Table = toml::from_str(s).map_err(|e| bad(e.to_string()))?;
        self.with_overrides(over)
    }

    pub(crate) fn with_overrides(&self, over: toml::Table) -> Result<Self, EngineError> {
        let mut base = toml::Table::try_from(self).map_err(|e| bad(e.to_string()))?;
        merge_toml(&mut base, over);
        let cfg: EngineConfig = base
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// As TOML (for `--print-config` and logs).
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Blocks of `block_size` tokens that fit the memory budget (or the override);
    /// unbounded when neither is set (the runner sized its pool from the machine).
    pub fn num_kv_blocks_for(&self, kv_bytes_per_token: usize) -> usize {
        match (self.num_kv_blocks, self.kv_cache_memory) {
            (Some(n), _) => n,
            (None, Some(bytes)) => {
                let per_block = (kv_bytes_per_token.max(1) * self.block_size.max(1)) as u64;
                (bytes / per_block) as usize
            }
            (None, None) => usize::MAX,
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        if self.block_size == 0 {
            return Err(bad("block_size must be > 0"));
        }
        if self.max_num_seqs == 0 {
            return Err(bad("max_num_seqs must be > 0"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(bad("max_num_batched_tokens must be > 0"));
        }
        if self.spec_ngram_min == 0 || self.spec_ngram_min > self.spec_ngram_max {
            return Err(bad(
                "spec_ngram_min must be at least 1 and at most spec_ngram_max",
            ));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(bad(
                "max_num_batched_tokens must be >= max_num_seqs (every running sequence decodes each step)",
            ));
        }
        if self.interactive_max_batched_tokens == Some(0) {
            return Err(bad("interactive_max_batched_tokens must be > 0"));
        }
        if self.max_prefill_chunk == 0 {
            return Err(bad("max_prefill_chunk must be > 0"));
        }
        if !(0.0..=0.5).contains(&self.kv_watermark) {
            return Err(bad("kv_watermark must be in [0, 0.5]"));
        }
        let f = self.max_batch_interference;
        if !f.is_finite() || f < 0.0 {
            return Err(bad("max_batch_interference must be >= 0"));
        }
        if self
            .max_tpot_stretch
            .is_some_and(|k| !k.is_finite() || k < 1.0)
        {
            return Err(bad("max_tpot_stretch must be >= 1"));
        }
        if !(0.0..1.0).contains(&self.slo_margin) {
            return Err(bad("slo_margin must be in [0, 1)"));
        }
        if self.batch_max_skip_steps == 0 {
            return Err(bad("batch_max_skip_steps must be > 0"));
        }
        for (name, v) in [
            ("max_step_ms", self.max_step_ms),
            ("default_ttft_slo_ms", self.default_ttft_slo_ms),
            ("default_tpot_slo_ms", self.default_tpot_slo_ms),
        ] {
            if v.is_some_and(|ms| !ms.is_finite() || ms <= 0.0) {
                return Err(bad(format!("{name} must be > 0")));
            }
        }
        for (name, v) in [
            (
                "admission.ttft_reject_factor",
                self.admission.ttft_reject_factor,
            ),
            (
                "admission.max_queue_wait_s",
                self.admission.max_queue_wait_s,
            ),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(bad(format!("{name} must be >= 0")));
            }
        }
        if self.num_kv_blocks == Some(0) {
            return Err(bad("num_kv_blocks must be > 0"));
        }
        Ok(())
    }

    /// The configuration `serve` and `tune` run with: built-in profile
    /// `profile`, then the keys of the TOML file `config_file` over it (errors
    /// name the file), then `flags` (TOML keys, e.g. from the command line's
    /// [`crate::knobs::flags`]), then `overrides`; validated.
    pub fn load(
        profile: &str,
        config_file: Option<&std::path::Path>,
        flags: toml::Table,
        overrides: impl FnOnce(&mut EngineConfig),
    ) -> Result<EngineConfig, EngineError> {
        let mut cfg = crate::profile::Profile::load(profile)?;
        if let Some(path) = config_file {
            let in_file = |why: String| bad(format!("{}: {why}", path.display()));
            let text = std::fs::read_to_string(path)
                .map_err(|e| in_file(format!("cannot read it: {e}")))?;
            cfg = cfg.with_overrides_toml(&text).map_err(|e| match e {
                EngineError::InvalidConfig(why) => in_file(why),
                other => other,
            })?;
        }
        if !flags.is_empty() {
            cfg = cfg.with_overrides(flags)?;
        }
        overrides(&mut cfg);
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_toml() {
        let c = EngineConfig::default();
        let s = c.to_toml_string();
        assert_eq!(EngineConfig::from_toml_str(&s).unwrap(), c);
        assert_eq!(EngineConfig::from_toml_str("").unwrap(), c);
    }

    #[test]
    fn overrides_replace_only_given_keys() {
        let base = EngineConfig {
            num_kv_blocks: Some(100),
            ..Default::default()
        };
        let c = base
            .with_overrides_toml("max_num_seqs = 3\n[admission.batch]\nmax_waiting_requests = 5\n")
            .unwrap();
        assert_eq!(c.max_num_seqs, 3);
        assert_eq!(c.num_kv_blocks, Some(100));
        assert_eq!(c.admission.batch.max_waiting_requests, 5);
        assert_eq!(
            c.admission.batch.max_waiting_prompt_tokens,
            base.admission.batch.max_waiting_prompt_tokens
        );
        assert!(base.with_overrides_toml("max_num_sqes = 3").is_err());
        assert!(base.with_overrides_toml("max_num_seqs = 0").is_err());
    }

    #[test]
    fn blocks_from_memory_budget() {
        let c = EngineConfig {
            kv_cache_memory: Some(1 << 20),
            ..Default::default()
        };
        assert_eq!(c.num_kv_blocks_for(1024), 64);
        // Unset: the runner's pool stands.
        assert_eq!(EngineConfig::default().num_kv_blocks_for(1024), usize::MAX);
    }

    #[test]
    fn load_lays_profile_then_file_then_overrides() {
        let dir = std::env::temp_dir().join(format!("sloserve-config-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "max_num_seqs = 7\nmax_prefill_chunk = 99\n").unwrap();
        let c = EngineConfig::load("mixed", Some(&file), Default::default(), |c| {
            c.max_prefill_chunk = 64
        })
        .unwrap();
        assert_eq!(c.max_num_seqs, 7, "from the file");
        assert_eq!(c.max_prefill_chunk, 64, "the override wins");
        let mixed = crate::profile::Profile::load("mixed").unwrap();
        assert_eq!(c.batch_aging_ms, mixed.batch_aging_ms, "from the profile");
        assert_eq!(
            EngineConfig::load("mixed", None, Default::default(), |_| {}).unwrap(),
            mixed
        );

        let err = |r: Result<EngineConfig, EngineError>| r.unwrap_err().to_string();
        assert!(
            err(EngineConfig::load("nope", None, Default::default(), |_| {}))
                .contains("unknown profile 'nope'")
        );
        let missing = dir.join("missing.toml");
        let e = err(EngineConfig::load(
            "mixed",
            Some(&missing),
            Default::default(),
            |_| {},
        ));
        assert!(e.contains("missing.toml: cannot read it"), "{e}");
        std::fs::write(&file, "max_num_sqes = 7\n").unwrap();
        let e = err(EngineConfig::load(
            "mixed",
            Some(&file),
            Default::default(),
            |_| {},
        ));
        assert!(e.contains("c.toml: ") && e.contains("max_num_sqes"), "{e}");
        assert_eq!(e.matches("invalid engine configuration").count(), 1, "{e}");
        std::fs::write(&file, "max_num_seqs = 0\n").unwrap();
        let e = err(EngineConfig::load(
            "mixed",
            Some(&file),
            Default::default(),
            |_| {},
        ));
        assert!(e.contains("c.toml: max_num_seqs must be > 0"), "{e}");
        let e = err(EngineConfig::load("mixed", None, Default::default(), |c| {
            c.max_num_seqs = 0
        }));
        assert!(e.contains("max_num_seqs must be > 0"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
