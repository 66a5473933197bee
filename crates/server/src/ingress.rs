//! Ingress: the one place a generation request's headers are read and its engine
//! [`Request`] is built from the validated body ([`GenParams`]): the SLO contract
//! (body, then headers, capped by the caller's key: `sloserve_slo::Asked`), the
//! sampling parameters (one conversion from the wire's `Sampling`), the stop
//! conditions, the prefix-cache salt, the client's deadline
//! (`x-request-timeout-ms`), the gateway's fairness id (the request's flow) and
//! the output constraint compiled from `response_format` ([`crate::structured`]).

use std::time::Duration;

use axum::http::HeaderMap;
use sloserve_api::{ApiError, GenParams, Sampling};
use sloserve_engine::sampler::constraint::SharedConstraint;
use sloserve_engine::{Request, SamplingParams, StopConditions};
use sloserve_slo::{headers, Asked};

use crate::error::ServerError;
use crate::guard_args::PrefixCacheScope;
use crate::keys::Caller;
use crate::state::AppState;

/// The client's own deadline for one request, in milliseconds.
pub const TIMEOUT_HEADER: &str = "x-request-timeout-ms";

/// The longest fairness id accepted, in bytes (a bound on what a client's id may
/// hold in the engine's per-flow state).
pub const MAX_FAIRNESS_ID_LEN: usize = 128;

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
    let own = state.api_keys.flow_of(caller);
    let fairness = flow(state.trust_gateway_headers, headers, own)?;
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
        cache_salt: cache_salt(state.cache_scope, params.cache_salt.as_deref(), own),
        deadline,
        fairness,
        constraint,
        prompt_logprobs: params.prompt_scoring(),
        pooling: None,
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

/// The flow a request is queued fairly in, within its class: with
/// `--trust-gateway-headers` (`trusted`) the gateway's fairness id
/// ([`fairness_id`]) when it sent one; otherwise the caller's key (`key_flow`, its
/// digest), or none on a keyless request (one shared flow, first come first
/// served). An untrusted fairness header is ignored: a client cannot name
/// another tenant's flow, nor split its own work into many.
pub fn flow(
    trusted: bool,
    headers: &HeaderMap,
    key_flow: Option<&str>,
) -> Result<Option<String>, ServerError> {
    if trusted {
        if let Some(id) = fairness_id(headers)? {
            return Ok(Some(id));
        }
    }
    Ok(key_flow.map(str::to_owned))
}

/// The gateway's fairness id (`x-llm-d-inference-fairness-id`, else the older
/// `x-gateway-inference-fairness-id`), read only from a trusted hop ([`flow`]).
/// Absent or empty: no id. At most [`MAX_FAIRNESS_ID_LEN`] visible ASCII bytes,
/// else a 400 naming the header.
pub fn fairness_id(headers: &HeaderMap) -> Result<Option<String>, ServerError> {
    let Some((name, v)) = headers::first(&headers::FAIRNESS_ID, |n| headers.get(n)) else {
        return Ok(None);
    };
    let bytes = v.as_bytes();
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() > MAX_FAIRNESS_ID_LEN || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(ApiError::invalid(
            name,
            format!(
                "{name} header: expected 1 to {MAX_FAIRNESS_ID_LEN} visible ASCII characters, \
                 got {} bytes",
                bytes.len()
            ),
        )
        .into());
    }
    // Visible ASCII: valid UTF-8, one byte a character.
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// The prefix-cache salt of a request: its `cache_salt`, and under the per-key
/// scope its API key's digest (`owner`); 0 (the shared cache) when neither
/// applies ([`sloserve_slo::cache_scope_salt`]).
pub fn cache_salt(scope: PrefixCacheScope, salt: Option<&str>, owner: Option<&str>) -> u64 {
    let owner = match scope {
        PrefixCacheScope::PerKey => owner,
        PrefixCacheScope::Global => None,
    };
    sloserve_slo::cache_scope_salt(owner, salt)
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
    fn fairness_ids_llm_d_name_first_bounded_and_visible_ascii() {
        let mut h = HeaderMap::new();
        assert_eq!(fairness_id(&h).unwrap(), None);
        h.insert(headers::FAIRNESS_ID[1], "old".parse().unwrap());
        assert_eq!(fairness_id(&h).unwrap().as_deref(), Some("old"));
        h.insert(headers::FAIRNESS_ID[0], "tenant-a".parse().unwrap());
        assert_eq!(fairness_id(&h).unwrap().as_deref(), Some("tenant-a"));
        h.insert(headers::FAIRNESS_ID[0], "".parse().unwrap());
        assert_eq!(fairness_id(&h).unwrap(), None, "empty: no id");
        let longest = "x".repeat(MAX_FAIRNESS_ID_LEN);
        h.insert(headers::FAIRNESS_ID[0], longest.parse().unwrap());
        assert_eq!(fairness_id(&h).unwrap(), Some(longest));
        let too_long = "x".repeat(MAX_FAIRNESS_ID_LEN + 1);
        let bad = [too_long.as_bytes(), b"a b", b"a\tb", "caf\u{e9}".as_bytes()];
        for v in bad {
            h.insert(
                headers::FAIRNESS_ID[0],
                axum::http::HeaderValue::from_bytes(v).unwrap(),
            );
            let e = fairness_id(&h).unwrap_err();
            assert!(
                format!("{e:?}").contains(headers::FAIRNESS_ID[0]),
                "{v:?}: {e:?}"
            );
        }
    }

    #[test]
    fn the_fairness_header_names_a_flow_only_from_a_trusted_hop() {
        let mut h = HeaderMap::new();
        h.insert(headers::FAIRNESS_ID[0], "tenant-b".parse().unwrap());
        // Untrusted: the key's flow, or none; the header is not even parsed.
        assert_eq!(
            flow(false, &h, Some("key-a")).unwrap().as_deref(),
            Some("key-a")
        );
        assert_eq!(flow(false, &h, None).unwrap(), None);
        h.insert(headers::FAIRNESS_ID[0], "a b".parse().unwrap());
        assert_eq!(flow(false, &h, None).unwrap(), None);
        // Trusted: the header, else the key's flow.
        assert!(flow(true, &h, None).is_err(), "a bad id is a 400");
        h.remove(headers::FAIRNESS_ID[0]);
        assert_eq!(
            flow(true, &h, Some("key-a")).unwrap().as_deref(),
            Some("key-a")
        );
        h.insert(headers::FAIRNESS_ID[0], "tenant-b".parse().unwrap());
        assert_eq!(
            flow(true, &h, Some("key-a")).unwrap().as_deref(),
            Some("tenant-b")
        );
        assert_eq!(flow(true, &h, None).unwrap().as_deref(), Some("tenant-b"));
    }

    #[test]
    fn salts_isolate_keys_only_under_the_per_key_scope() {
        use PrefixCacheScope::{Global, PerKey};
        assert_eq!(cache_salt(PerKey, None, None), 0);
        assert_ne!(cache_salt(Global, Some("s"), None), 0);
        let (a, b) = (Some("key-a"), Some("key-b"));
        assert_ne!(cache_salt(PerKey, None, a), cache_salt(PerKey, None, b));
        assert_eq!(cache_salt(Global, None, a), 0, "one cache for all keys");
        assert_ne!(
            cache_salt(PerKey, Some("s"), a),
            cache_salt(PerKey, None, a)
        );
        assert_ne!(
            cache_salt(PerKey, Some("s"), a),
            cache_salt(Global, Some("s"), None)
        );
    }
}
