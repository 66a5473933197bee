//! Pieces shared by completions and chat: `stop`, `stream_options`, `Usage` with
//! sloserve's per-request timings, [`RequestFields`] (the non-sampling body fields
//! both request kinds flatten in) and [`GenParams`], the validated generation
//! parameters both reduce to.

use serde::{Deserialize, Deserializer, Serialize};

use sloserve_slo::{Asked, SloClass};

use crate::error::ApiError;
use crate::sampling::{Sampling, SamplingFields};

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Most bytes of all stop strings of a request together (64 KiB): the server
/// holds back at most the longest one and builds one automaton over all of them.
pub const MAX_STOP_BYTES: usize = 64 * 1024;
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

/// OpenAI's `usage.completion_tokens_details`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionTokensDetails {
    /// Generated tokens that carried reasoning (`sloserve_model::reasoning`): the tags
    /// and harmony headers that open and close it are not counted.
    pub reasoning_tokens: u32,
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
    /// Chat answers of a model that reasons: how many of the completion tokens were
    /// its reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sloserve: Option<SloTimings>,
}

/// The body fields chat and completions share besides sampling: length,
/// streaming, the request's SLO fields and its cache isolation.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct RequestFields {
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub user: Option<String>,
    /// sloserve: "interactive" or "batch".
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub slo_class: Option<SloClass>,
    /// sloserve: this request's TTFT target.
    #[serde(default)]
    pub ttft_slo_ms: Option<f64>,
    /// sloserve: this request's TPOT target (time per output token).
    #[serde(default)]
    pub tpot_slo_ms: Option<f64>,
    /// vLLM's scheduling priority (an integer; accepted for compatibility, SLO
    /// classes decide the order here).
    #[serde(default)]
    pub priority: Option<i64>,
    /// vLLM's prefix-cache salt: cached prompt blocks are reused only by requests
    /// with the same salt.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {name,
    /// schema, strict}}`: the output is constrained to it (checked and compiled by
    /// the server's grammar engine).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<serde_json::Value>,
    /// vLLM's reasoning budget: a model that reasons (a `<think>` or harmony
    /// template) has its reasoning closed after this many reasoning tokens.
    #[serde(default)]
    pub thinking_token_budget: Option<i64>,
}

/// Validated generation parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub sampling: Sampling,
    /// `None`: as many as the context leaves.
    pub max_tokens: Option<u32>,
    /// `Some(n)`: return each token's logprob and its `n` best alternatives.
    pub logprobs: Option<usize>,
    /// Completions' `echo`: the prompt's text (with `logprobs`, its tokens'
    /// scores too) comes before the completion.
    pub echo: bool,
    /// vLLM's `prompt_logprobs`: each prompt token's logprob with this many
    /// alternatives, as a list per prompt position.
    pub prompt_logprobs: Option<usize>,
    /// The body's side of the SLO contract (class and targets, validated); the
    /// server adds the headers' side (`sloserve_slo::Asked::read`).
    pub slo: Asked,
    pub stream: bool,
    pub include_usage: bool,
    pub user: Option<String>,
    /// vLLM's `cache_salt`: cached prompt blocks are shared only with requests
    /// giving the same salt.
    pub cache_salt: Option<String>,
    /// The output format asked for (`None` or `null`: free text), as sent.
    pub response_format: Option<serde_json::Value>,
    /// Chat only: the tools the model may call and how (`None`: no tools, or
    /// `tool_choice: "none"`), from [`crate::tools::ToolFields`].
    pub tools: Option<crate::tools::ToolParams>,
    /// After this many reasoning tokens the engine forces the end of the reasoning.
    pub thinking_token_budget: Option<u32>,
}

impl GenParams {
    /// The alternatives per prompt position the engine scores the prompt with
    /// (`sloserve_engine::Request::prompt_logprobs`): the most of `echo`'s
    /// `logprobs` and `prompt_logprobs`; `Some(0)` for an echo that generates
    /// nothing (`max_tokens` 0); `None`: the prompt is not scored.
    pub fn prompt_scoring(&self) -> Option<usize> {
        let echo = self.logprobs.filter(|_| self.echo);
        let scoring_only = (self.echo && self.max_tokens == Some(0)).then_some(0);
        [echo, self.prompt_logprobs, scoring_only]
            .into_iter()
            .flatten()
            .max()
    }
}

impl RequestFields {
    /// Validates these fields with the sampling ones. `max_tokens` is the length
    /// field that applies (its value and name: the two request kinds differ).
    pub(crate) fn params(
        &self,
        sampling: &SamplingFields,
        max_tokens: (Option<i64>, &'static str),
        logprobs: Option<usize>,
    ) -> Result<GenParams, ApiError> {
        let max_tokens = match max_tokens {
            (None, _) => None,
            (Some(m), _) if m >= 1 && m <= u32::MAX as i64 => Some(m as u32),
            (Some(m), p) => {
                return Err(ApiError::invalid(
                    p,
                    format!("{p} must be at least 1, got {m}"),
                ));
            }
        };
        let sampling = sampling.validate()?;
        sampling.check_best_of()?;
        let slo = Asked {
            class: self.slo_class,
            objective: None,
            ttft_ms: self.ttft_slo_ms,
            tpot_ms: self.tpot_slo_ms,
        };
        slo.validate()?;
        if self.cache_salt.as_ref().is_some_and(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                "cache_salt",
                "cache_salt must be a non-empty string",
            ));
        }
        let thinking_token_budget = match self.thinking_token_budget {
            None => None,
            Some(b) if (0..=u32::MAX as i64).contains(&b) => Some(b as u32),
            Some(b) => {
                return Err(ApiError::invalid(
                    "thinking_token_budget",
                    format!("thinking_token_budget must be at least 0, got {b}"),
                ))
            }
        };
        let stream = self.stream.unwrap_or(false);
        Ok(GenParams {
            sampling,
            max_tokens,
            logprobs,
            echo: false,
            prompt_logprobs: None,
            slo,
            stream,
            include_usage: stream
                && self
                    .stream_options
                    .as_ref()
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            user: self.user.clone(),
            cache_salt: self.cache_salt.clone(),
            response_format: self.response_format.clone().filter(|v| !v.is_null()),
            tools: None,
            thinking_token_budget,
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
