//! What a client asks the engine for: prompt tokens, sampling, stop conditions and
//! the SLO class with its optional targets.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sampler::SamplingParams;

/// Service class of a request. `Interactive` requests are admitted and prefilled
/// before `Batch` ones and may preempt them; when no batch work runs at all, a batch
/// request that waited `batch_aging_ms` ages into interactive priority, so batch
/// work never starves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SloClass {
    #[default]
    Interactive,
    Batch,
}

impl SloClass {
    /// Both classes, highest priority first.
    pub const ALL: [SloClass; 2] = [SloClass::Interactive, SloClass::Batch];

    /// Dense index (0 interactive, 1 batch) for per-class arrays.
    #[inline]
    pub fn index(self) -> usize {
        match self {
            SloClass::Interactive => 0,
            SloClass::Batch => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SloClass::Interactive => "interactive",
            SloClass::Batch => "batch",
        }
    }
}

impl fmt::Display for SloClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SloClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interactive" => Ok(SloClass::Interactive),
            "batch" => Ok(SloClass::Batch),
            other => Err(format!(
                "unknown SLO class '{other}' (expected 'interactive' or 'batch')"
            )),
        }
    }
}

/// When generation stops. The first condition met wins; `Length` is also reported
/// when the sequence reaches the model's context length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopConditions {
    /// Most tokens to generate (at least 1); `None`: as many as the context
    /// leaves after the prompt (the engine decides at submit).
    pub max_tokens: Option<usize>,
    /// Tokens that always stop generation (reason `Stop`); the stop token is emitted.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence ids (filled by the caller from the tokenizer);
    /// they stop generation unless `ignore_eos`.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Keep generating through EOS (benchmarks); `stop_token_ids` still apply.
    #[serde(default)]
    pub ignore_eos: bool,
}

impl StopConditions {
    pub fn max_tokens(max_tokens: usize) -> Self {
        StopConditions {
            max_tokens: Some(max_tokens),
            stop_token_ids: Vec::new(),
            eos_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }

    /// Whether `token` ends generation with reason `Stop`.
    #[inline]
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.stop_token_ids.contains(&token)
            || (!self.ignore_eos && self.eos_token_ids.contains(&token))
    }
}

/// One generation request as the engine sees it (token ids, no text).
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    /// `None`: the engine's `default_slo_class`. Ignored (everything is the default
    /// class, served first-come first-served) when the engine runs without SLO classes.
    pub slo_class: Option<SloClass>,
    /// The inference objective the request came with (a gateway header); mapped
    /// to a class by the config's `objectives` when `slo_class` is `None`.
    pub objective: Option<String>,
    /// Target time to first token; an interactive request whose predicted TTFT
    /// exceeds it by `ttft_reject_factor` is refused at submit, and the scheduler
    /// sizes steps so that it is met. `None`: the engine's `default_ttft_slo_ms`.
    pub ttft_slo_ms: Option<f64>,
    /// Target time per output token after the first: steps that carry this
    /// request's decodes take at most this long (batch work is left out to keep
    /// it). `None`: the engine's `default_tpot_slo_ms`, else the relative bound
    /// `max_batch_interference`.
    pub tpot_slo_ms: Option<f64>,
    /// Prefix-cache isolation: the request reuses (and adds to) only blocks cached
    /// under the same salt (vLLM's `cache_salt`, mixed with the API key's scope by
    /// the server). 0: the shared cache.
    pub cache_salt: u64,
    /// The client's own deadline for this request, from its arrival (the server's
    /// `x-request-timeout-ms`). A batch request, which is never refused for its
    /// predicted latency, is refused at submit only when it is predicted to start
    /// after this (`DeadlineUnreachable`), and finishes `TimedOut` if it is still
    /// waiting when it passes. `None`: no deadline of its own.
    pub deadline: Option<Duration>,
    /// Constrained decoding: a compiled grammar; each sequence gets a fresh matcher.
    pub constraint: Option<crate::sampler::constraint::SharedConstraint>,
}

impl Request {
    /// A greedy request generating at most `max_tokens` tokens, default class.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::greedy(),
            stop: StopConditions::max_tokens(max_tokens),
            slo_class: None,
            objective: None,
            ttft_slo_ms: None,
            tpot_slo_ms: None,
            cache_salt: 0,
            deadline: None,
            constraint: None,
        }
    }

    pub fn with_class(mut self, class: SloClass) -> Self {
        self.slo_class = Some(class);
        self
    }

    pub fn with_ttft_slo_ms(mut self, ms: f64) -> Self {
        self.ttft_slo_ms = Some(ms);
        self
    }

    pub fn with_tpot_slo_ms(mut self, ms: f64) -> Self {
        self.tpot_slo_ms = Some(ms);
        self
    }

    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

/// The latency targets a request runs under, as the engine resolved them at submit
/// (interactive requests only; batch requests have none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SloTargets {
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time per output token, milliseconds. `None` for an interactive request: the
    /// relative bound (`max_batch_interference`) keeps its pace.
    pub tpot_ms: Option<f64>,
}

/// What the engine decided for an accepted request (returned on its stream).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    /// The class it runs as.
    pub class: SloClass,
    pub targets: SloTargets,
    /// Most tokens it may generate (its `max_tokens`, or what the context leaves).
    pub max_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_class_parses_and_serializes_lowercase() {
        assert_eq!(
            "interactive".parse::<SloClass>().unwrap(),
            SloClass::Interactive
        );
        assert_eq!(" Batch ".parse::<SloClass>().unwrap(), SloClass::Batch);
        assert!("bulk".parse::<SloClass>().is_err());
        #[derive(Deserialize, Serialize)]
        struct W {
            c: SloClass,
        }
        let w: W = toml::from_str("c = \"batch\"").unwrap();
        assert_eq!(w.c, SloClass::Batch);
        assert_eq!(
            toml::to_string(&W {
                c: SloClass::Interactive
            })
            .unwrap()
            .trim(),
            "c = \"interactive\""
        );
    }

    #[test]
    fn stop_tokens_respect_ignore_eos() {
        let mut s = StopConditions::max_tokens(4);
        s.stop_token_ids = vec![7];
        s.eos_token_ids = vec![2];
        assert!(s.is_stop_token(7) && s.is_stop_token(2) && !s.is_stop_token(3));
        s.ignore_eos = true;
        assert!(s.is_stop_token(7) && !s.is_stop_token(2));
    }
}
