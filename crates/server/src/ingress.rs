//! Ingress: the one place a generation request's headers are read and its engine
//! [`Request`] is built from the validated body ([`GenParams`]): the SLO contract
//! (body, then headers, capped by the caller's key: `sloserve_slo::Asked`), the
//! sampling parameters (one conversion from the wire's `Sampling`), the stop
//! conditions, the prefix-cache salt, the client's deadline
//! (`x-request-timeout-ms`) and the output constraint compiled from
//! `response_format` ([`crate::structured`]).

use std::hash::{Hash, Hasher};
use std::time::Duration;

use axum::http::HeaderMap;
use sloserve_api::{ApiError, GenParams, Sampling};
use sloserve_engine::sampler::constraint::SharedConstraint;
use sloserve_engine::{Request, SamplingParams, StopConditions};
use sloserve_slo::Asked;

use crate::auth::Caller;
use crate::error::ServerError;
use crate::guard_args::PrefixCacheScope;
use crate::state::AppState;

/// The client's own deadline for one request, in milliseconds.
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// A request ready for the engine, with the deadline its response runs under.
pub struct Ingress {
    pub request: Request,
    /// The client's deadline, at most the server's `--request-timeout`.
    pub timeout: Option<Duration>,
}

/// The engine's sampling parameters from the validated wire fields.
pub fn sampling_params(s: &Sampling, logprobs: Option<usize>) -> SamplingParams {
    SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        seed: s.seed,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        repetition_penalty: s.repetition_penalty,
        logit_bias: s.logit_bias.clone(),
        logprobs,
    }
}

/// Builds the engine request from the parsed body and the headers. The engine
/// checks it against the context and resolves class and targets at submit.
pub fn build(
    state: &AppState,
    prompt: Vec<u32>,
    params: &GenParams,
    headers: &HeaderMap,
    caller: &Caller,
    constraint: Option<SharedConstraint>,
) -> Result<Ingress, ServerError> {
    let slo = Asked::read(params.slo.clone(), |name| {
        headers.get(name).map(|v| v.as_bytes())
    })
    .and_then(|a| a.cap(caller.ceiling))
    .map_err(ApiError::from)?;
    let biased: Vec<u32> = params.sampling.logit_bias.iter().map(|b| b.0).collect();
    state.check_ids(&biased, "logit_bias")?;
    // The client's own deadline (the header alone, not the server's
    // `--request-timeout`): the only latency a batch request is refused for.
    let deadline = client_deadline(headers)?;
    let request = Request {
        prompt,
        sampling: sampling_params(&params.sampling, params.logprobs),
        stop: StopConditions {
            max_tokens: params.max_tokens.map(|m| m as usize),
            stop_token_ids: Vec::new(),
            eos_token_ids: state.tokenizer.stop_token_ids(),
            ignore_eos: params.sampling.ignore_eos,
        },
        slo,
        cache_salt: cache_salt(state.cache_scope, params.cache_salt.as_deref(), caller),
        deadline,
        constraint,
    };
    let timeout = match (deadline, state.request_timeout) {
        (Some(own), Some(server)) => Some(own.min(server)),
        (own, server) => own.or(server),
    };
    Ok(Ingress { request, timeout })
}

/// `x-request-timeout-ms`, a positive number of milliseconds, when given.
pub fn client_deadline(headers: &HeaderMap) -> Result<Option<Duration>, ServerError> {
    let Some(v) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let ms = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms > 0.0)
        .ok_or_else(|| {
            ApiError::invalid(
                TIMEOUT_HEADER,
                format!(
                    "{TIMEOUT_HEADER} header: expected a positive number of milliseconds, got {v:?}"
                ),
            )
        })?;
    Ok(Some(Duration::from_secs_f64(ms / 1e3)))
}

/// The prefix-cache salt of a request: its `cache_salt`, and under the per-key
/// scope its API key; 0 (the shared cache) when neither applies.
pub fn cache_salt(scope: PrefixCacheScope, salt: Option<&str>, caller: &Caller) -> u64 {
    let key = match scope {
        PrefixCacheScope::PerKey => caller.key_index,
        PrefixCacheScope::Global => None,
    };
    if salt.is_none() && key.is_none() {
        return 0;
    }
    let mut h = std::hash::DefaultHasher::new();
    (salt, key).hash(&mut h);
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_deadlines() {
        let mut h = HeaderMap::new();
        assert_eq!(client_deadline(&h).unwrap(), None);
        h.insert(TIMEOUT_HEADER, "250".parse().unwrap());
        assert_eq!(
            client_deadline(&h).unwrap(),
            Some(Duration::from_millis(250))
        );
        for bad in ["0", "-1", "abc", "inf", "NaN"] {
            h.insert(TIMEOUT_HEADER, bad.parse().unwrap());
            assert!(client_deadline(&h).is_err(), "{bad}");
        }
    }

    #[test]
    fn salts_isolate_keys_only_under_the_per_key_scope() {
        let open = Caller::OPEN;
        assert_eq!(cache_salt(PrefixCacheScope::PerKey, None, &open), 0);
        assert_ne!(cache_salt(PrefixCacheScope::Global, Some("s"), &open), 0);
    }
}
