//! What the router reads from a generation request: its class (body `slo_class`,
//! `X-SLO-Class`, or the gateway's objective header through `[objectives]`), the
//! prefix key (hash of the prompt's first aligned chunk) and its work estimate; the
//! caller's key may cap the class at batch.

use axum::http::HeaderMap;
use serde_json::Value;
use sloserve_api::ApiError;
use sloserve_slo::{resolve, Asked, Policy, SloClass};

use crate::backend::hash_str;
use crate::config::RouterConfig;
use crate::keys::Caller;
use crate::picker::Demand;

/// Work assumed for a request that gives no `max_tokens`.
const DEFAULT_MAX_TOKENS: u64 = 256;
/// Characters per token assumed for the work estimate.
const CHARS_PER_TOKEN: u64 = 4;

/// A parsed generation request, as far as routing needs it.
#[derive(Debug)]
pub struct Routed {
    pub demand: Demand,
    pub stream: bool,
}

/// Reads class (capped by the caller's key), prefix key and work from a
/// completions or chat body.
pub fn classify(
    cfg: &RouterConfig,
    caller: Caller,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Routed, ApiError> {
    classify_as(cfg, cfg.default_class, caller, headers, body)
}

/// [`classify`] with `default_class` for a request that names no class (a
/// pooled request's is batch, as on the replica).
pub fn classify_as(
    cfg: &RouterConfig,
    default_class: SloClass,
    caller: Caller,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Routed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let class = class_of(cfg, default_class, caller, headers, &v)?;
    let text = prompt_text(&v);
    let aligned = aligned_prefix(&text, cfg.prefix_chars, cfg.prefix_align);
    let key = (!aligned.is_empty()).then(|| hash_str(aligned));
    let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let work = (text.chars().count() as u64).div_ceil(CHARS_PER_TOKEN) + max_tokens;
    Ok(Routed {
        demand: Demand { class, key, work },
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// The class the request is routed as: the SLO contract's rule
/// (`sloserve_slo::resolve`) over the body's `slo_class` and the headers, with the
/// router's `[objectives]` and default class, capped by the caller's key.
fn class_of(
    cfg: &RouterConfig,
    default_class: SloClass,
    caller: Caller,
    headers: &HeaderMap,
    v: &Value,
) -> Result<SloClass, ApiError> {
    let class = match v.get("slo_class").filter(|c| !c.is_null()) {
        None => None,
        Some(c) => Some(
            c.as_str()
                .ok_or_else(|| "must be a string".to_string())
                .and_then(str::parse)
                .map_err(|e| ApiError::invalid("slo_class", format!("slo_class: {e}")))?,
        ),
    };
    let body = Asked {
        class,
        ..Asked::default()
    };
    let asked = Asked::read(body, |n| headers.get(n).map(|h| h.as_bytes()))?.cap(caller.ceiling)?;
    let policy = Policy {
        classes: true,
        default_class,
        objectives: &cfg.objectives,
        default_ttft_ms: None,
        default_tpot_ms: None,
    };
    Ok(resolve(&asked, &policy).0)
}

/// The text a prefix cache would see first: a completion's prompt, or a chat's
/// messages (a response's `instructions` and `input` items) in order (role and
/// content).
fn prompt_text(v: &Value) -> String {
    let mut out = String::new();
    if let Some(i) = v.get("instructions").and_then(Value::as_str) {
        out.push_str("system\n");
        out.push_str(i);
        out.push('\n');
    }
    if let Some(Value::String(s)) = v.get("input") {
        out.push_str("user\n");
        out.push_str(s);
        return out;
    }
    let msgs = v.get("messages").or_else(|| v.get("input"));
    if let Some(msgs) = msgs.and_then(Value::as_array) {
        for m in msgs {
            out.push_str(m.get("role").and_then(Value::as_str).unwrap_or(""));
            out.push('\n');
            match m.get("content") {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .for_each(|t| out.push_str(t)),
                _ => {}
            }
            out.push('\n');
        }
        return out;
    }
    match v.get("prompt") {
        Some(Value::String(s)) => out.push_str(s),
        // A batch of prompts or token ids: the first prompt decides.
        Some(Value::Array(a)) => match a.first() {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(ids)) => ids.iter().for_each(|i| out.push_str(&format!("{i},"))),
            Some(Value::Number(_)) => a.iter().for_each(|i| out.push_str(&format!("{i},"))),
            _ => {}
        },
        _ => {}
    }
    out
}

/// The first `min(max_chars, whole chunks of align chars)` characters; empty when
/// the text is shorter than one chunk.
fn aligned_prefix(text: &str, max_chars: usize, align: usize) -> &str {
    let n = text.chars().count().min(max_chars);
    let n = n - n % align.max(1);
    let end = text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> RouterConfig {
        let mut c = RouterConfig::with_fleets(&[("interactive", &["http://a:1".into()])]).unwrap();
        c.objectives.insert("offline".into(), SloClass::Batch);
        c
    }

    fn route(h: &[(&str, &str)], body: Value) -> Result<Routed, ApiError> {
        let mut headers = HeaderMap::new();
        for (k, v) in h {
            let name = axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap();
            headers.insert(name, v.parse().unwrap());
        }
        classify(&cfg(), Caller::OPEN, &headers, body.to_string().as_bytes())
    }

    #[test]
    fn class_comes_from_body_then_header_then_objective() {
        let b = json!({"prompt": "hi"});
        assert_eq!(
            route(&[], b.clone()).unwrap().demand.class,
            SloClass::Interactive
        );
        let r = route(&[("x-llm-d-inference-objective", "offline")], b.clone()).unwrap();
        assert_eq!(r.demand.class, SloClass::Batch);
        let r = route(&[("x-gateway-inference-objective", "offline")], b.clone()).unwrap();
        assert_eq!(r.demand.class, SloClass::Batch);
        let r = route(
            &[
                ("X-SLO-Class", "interactive"),
                ("x-llm-d-inference-objective", "offline"),
            ],
            b,
        );
        assert_eq!(r.unwrap().demand.class, SloClass::Interactive);
        let b = json!({"prompt": "hi", "slo_class": "batch"});
        assert_eq!(
            route(&[("X-SLO-Class", "interactive")], b)
                .unwrap()
                .demand
                .class,
            SloClass::Batch
        );
        let e = route(&[], json!({"prompt": "hi", "slo_class": "bulk"})).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("slo_class")));
        let e = route(&[("X-SLO-Class", "x")], json!({"prompt": "hi"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("X-SLO-Class"));
        assert_eq!(
            classify(&cfg(), Caller::OPEN, &HeaderMap::new(), b"{")
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn a_batch_key_is_routed_as_batch() {
        let c = Caller {
            ceiling: Some(SloClass::Batch),
            key_index: Some(0),
        };
        let h = HeaderMap::new();
        let r = classify(&cfg(), c, &h, br#"{"prompt": "hi"}"#).unwrap();
        assert_eq!(r.demand.class, SloClass::Batch);
        let e = classify(
            &cfg(),
            c,
            &h,
            br#"{"prompt": "hi", "slo_class": "interactive"}"#,
        );
        assert_eq!(e.unwrap_err().status, 403);
    }

    #[test]
    fn prefix_key_covers_the_first_aligned_chunk_only() {
        let shared = "s".repeat(300);
        let a = route(
            &[],
            json!({"prompt": format!("{shared} question one"), "max_tokens": 8}),
        )
        .unwrap();
        let b = route(
            &[],
            json!({"prompt": format!("{shared} another"), "stream": true}),
        )
        .unwrap();
        assert_eq!(a.demand.key, b.demand.key);
        assert!(a.demand.key.is_some() && b.stream && !a.stream);
        assert_eq!(a.demand.work, 313usize.div_ceil(4) as u64 + 8);
        assert!(route(&[], json!({"prompt": "short"}))
            .unwrap()
            .demand
            .key
            .is_none());
        let chat = |sys: &str| {
            route(&[], json!({"messages": [{"role": "system", "content": sys}, {"role": "user", "content": "q"}]}))
                .unwrap()
                .demand
                .key
        };
        assert_eq!(
            chat(&"x".repeat(200)),
            chat(&format!("{}y", "x".repeat(199)))
        );
        assert_ne!(chat(&"x".repeat(200)), chat(&"z".repeat(200)));
        // A response's input keys like the chat it becomes.
        let long = "r".repeat(300);
        let resp = route(&[], json!({"input": long.clone(), "max_output_tokens": 4})).unwrap();
        let items = route(&[], json!({"input": [{"role": "user", "content": long}]})).unwrap();
        assert!(resp.demand.key.is_some());
        assert_eq!(resp.demand.key, items.demand.key);
        assert_eq!(resp.demand.work, 305usize.div_ceil(4) as u64 + 4);
        assert_eq!(aligned_prefix("héllo wörld", 100, 4), "héllo wö");
    }
}
