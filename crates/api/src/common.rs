//! Pieces shared by completions and chat: `stop`, `stream_options`, `Usage` with
//! sloserve's per-request timings, and [`GenParams`], the validated generation
//! parameters both request kinds reduce to.

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ApiError;

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Most alternatives per token (`logprobs` / `top_logprobs`), as vLLM allows.
pub const MAX_LOGPROBS: i64 = 20;

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StopSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(StopSpec::One(s)),
            serde_json::Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => Ok(s),
                    _ => Err(D::Error::custom("expected a string or an array of strings")),
                })
                .collect::<Result<_, _>>()
                .map(StopSpec::Many),
            _ => Err(D::Error::custom("expected a string or an array of strings")),
        }
    }
}

impl StopSpec {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s.clone()],
            StopSpec::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

/// Where one request's latency went (milliseconds on the engine's clock), returned in
/// `usage.sloserve`. A duration is `null` when the request never reached that point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SloTimings {
    pub slo_class: String,
    /// Arrival to the first engine step that ran its tokens.
    pub queue_ms: Option<f64>,
    /// Arrival to its first token.
    pub ttft_ms: Option<f64>,
    /// First scheduled step to first token (the possibly chunked prefill).
    pub prefill_ms: Option<f64>,
    /// First token to last token.
    pub decode_ms: Option<f64>,
    /// Arrival to finish.
    pub e2e_ms: Option<f64>,
    /// Mean time per output token after the first.
    pub tpot_ms: Option<f64>,
    pub cached_prompt_tokens: u32,
    pub preemptions: u32,
    /// Its share of the engine steps it ran in (machine time, for pricing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_ms: Option<f64>,
    /// The TTFT target the request ran under (given or the server's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_target_ms: Option<f64>,
    /// The TPOT target the request ran under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_target_ms: Option<f64>,
    /// Whether it met them (`null` without a target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_met: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_met: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sloserve: Option<SloTimings>,
}

/// Validated generation parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// `None`: as many as the context leaves.
    pub max_tokens: Option<u32>,
    pub temperature: f32,
    pub top_p: f32,
    /// 0: disabled.
    pub top_k: usize,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `Some(n)`: return each token's logprob and its `n` best alternatives.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// "interactive" or "batch" when given.
    pub slo_class: Option<String>,
    pub ttft_slo_ms: Option<f64>,
    pub tpot_slo_ms: Option<f64>,
    pub stream: bool,
    pub include_usage: bool,
    pub user: Option<String>,
    /// vLLM's `cache_salt`: cached prompt blocks are shared only with requests
    /// giving the same salt.
    pub cache_salt: Option<String>,
}

/// The sampling fields common to both request kinds, before validation.
pub(crate) struct RawCommon<'a> {
    pub max_tokens: Option<i64>,
    pub max_tokens_param: &'static str,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<&'a StopSpec>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub slo_class: Option<&'a String>,
    pub ttft_slo_ms: Option<f64>,
    pub tpot_slo_ms: Option<f64>,
    pub stream: Option<bool>,
    pub stream_options: Option<&'a StreamOptions>,
    pub user: Option<&'a String>,
    pub logit_bias: Option<&'a serde_json::Map<String, serde_json::Value>>,
    pub cache_salt: Option<&'a String>,
}

/// A latency target must be a positive, finite number of milliseconds.
pub fn check_target_ms(param: &str, t: f64) -> Result<(), ApiError> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be a positive number of milliseconds, got {t}"),
        ))
    }
}

fn in_range(param: &str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {x}"),
        )),
    }
}

impl RawCommon<'_> {
    pub(crate) fn validate(&self, logprobs: Option<usize>) -> Result<GenParams, ApiError> {
        let max_tokens = match self.max_tokens {
            None => None,
            Some(m) if m >= 1 && m <= u32::MAX as i64 => Some(m as u32),
            Some(m) => {
                let p = self.max_tokens_param;
                return Err(ApiError::invalid(
                    p,
                    format!("{p} must be at least 1, got {m}"),
                ));
            }
        };
        let temperature = in_range("temperature", self.temperature, 0.0, 2.0, 1.0)?;
        let top_p = in_range("top_p", self.top_p, 0.0, 1.0, 1.0)?;
        if top_p <= 0.0 {
            return Err(ApiError::invalid("top_p", "top_p must be in (0, 1], got 0"));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k must be -1 (disabled) or at least 1, got {k}"),
                ))
            }
        };
        let min_p = in_range("min_p", self.min_p, 0.0, 1.0, 0.0)?;
        let presence_penalty = in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        let frequency_penalty =
            in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    "n",
                    format!("n must be 1 (several choices per request are not supported), got {n}"),
                ));
            }
        }
        if let Some(b) = self.best_of {
            if b != 1 {
                return Err(ApiError::invalid(
                    "best_of",
                    format!("best_of must be 1 (not supported), got {b}"),
                ));
            }
        }
        let stop = self.stop.map(StopSpec::to_vec).unwrap_or_default();
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop: at most {MAX_STOP_STRINGS} stop strings, got {}",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "stop: stop strings must not be empty",
            ));
        }
        let slo_class = match self.slo_class {
            None => None,
            Some(c) => {
                let l = c.trim().to_ascii_lowercase();
                if l != "interactive" && l != "batch" {
                    return Err(ApiError::invalid(
                        "slo_class",
                        format!("slo_class must be 'interactive' or 'batch', got '{c}'"),
                    ));
                }
                Some(l)
            }
        };
        for (param, v) in [
            ("ttft_slo_ms", self.ttft_slo_ms),
            ("tpot_slo_ms", self.tpot_slo_ms),
        ] {
            if let Some(t) = v {
                check_target_ms(param, t)?;
            }
        }
        if self.logit_bias.is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias is not supported",
            ));
        }
        if self.cache_salt.is_some_and(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                "cache_salt",
                "cache_salt must be a non-empty string",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(GenParams {
            max_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            seed: self.seed.map(|s| s as u64),
            stop,
            presence_penalty,
            frequency_penalty,
            logprobs,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            slo_class,
            ttft_slo_ms: self.ttft_slo_ms,
            tpot_slo_ms: self.tpot_slo_ms,
            stream,
            include_usage: stream
                && self
                    .stream_options
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            user: self.user.cloned(),
            cache_salt: self.cache_salt.cloned(),
        })
    }
}

/// Checks a logprobs count (`logprobs` of completions, `top_logprobs` of chat).
pub(crate) fn check_logprobs(param: &str, n: i64) -> Result<usize, ApiError> {
    if (0..=MAX_LOGPROBS).contains(&n) {
        Ok(n as usize)
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be between 0 and {MAX_LOGPROBS}, got {n}"),
        ))
    }
}
