//! API keys against the real server: 401 (OpenAI's shape) without or with a wrong
//! key on every closed route (also ones that do not exist), 200 with the right one
//! (Bearer or x-api-key), open probes, `--metrics-require-key`, the per-key SLO
//! class ceiling, and isolated prefix caches (per-key scope and `cache_salt`).

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

const FULL: &str = "sk-full-0123456789";
const BATCH: &str = "sk-batch-9876543210";

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.guard.api_keys = vec![
            FULL.parse().unwrap(),
            format!("{BATCH}:batch").parse().unwrap(),
        ];
        a.guard.metrics_require_key = true;
        TestServer::start(a)
    })
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn complete(key: &str, body: &Value) -> Resp {
    let auth = bearer(key);
    request(
        server().addr,
        "POST",
        "/v1/completions",
        &[("Authorization", &auth)],
        body.to_string().as_bytes(),
    )
}

#[test]
fn missing_or_wrong_keys_get_401_and_the_right_key_200() {
    let s = server();
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/v1/no-such-route"),
        ("GET", "/metrics"),
    ] {
        let r = request(s.addr, method, path, &[], b"{}");
        let e = r.openai_error(401);
        assert_eq!(e["code"], "invalid_api_key", "{path}");
        assert!(e["message"].as_str().unwrap().contains("Missing API key"));
        let wrong = bearer("sk-full-0123456788");
        let r = request(s.addr, method, path, &[("Authorization", &wrong)], b"{}");
        let e = r.openai_error(401);
        assert!(e["message"].as_str().unwrap().contains("Incorrect API key"));
        // The key is never echoed.
        assert!(!r.text().contains("sk-full"), "{}", r.text());
    }
    let auth = bearer(FULL);
    assert_eq!(
        request(
            s.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &auth)],
            b""
        )
        .status,
        200
    );
    assert_eq!(
        request(s.addr, "GET", "/v1/models", &[("x-api-key", BATCH)], b"").status,
        200
    );
    assert_eq!(
        request(s.addr, "GET", "/metrics", &[("x-api-key", FULL)], b"").status,
        200
    );
    let r = request(
        s.addr,
        "GET",
        "/v1/no-such-route",
        &[("Authorization", &auth)],
        b"",
    );
    r.openai_error(404);
    // Probes stay open.
    assert_eq!(get(s.addr, "/health").status, 200);
    assert_eq!(get(s.addr, "/ready").status, 200);
    let r = complete(FULL, &json!({"prompt": "Hello", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_batch_key_cannot_claim_interactive() {
    let r = complete(
        BATCH,
        &json!({"prompt": "Hi", "max_tokens": 2, "slo_class": "interactive"}),
    );
    let e = r.openai_error(403);
    assert_eq!(e["param"], "slo_class");
    assert_eq!(e["type"], "permission_error");
    let auth = bearer(BATCH);
    let r = request(
        server().addr,
        "POST",
        "/v1/completions",
        &[("Authorization", &auth), ("X-SLO-Class", "interactive")],
        json!({"prompt": "Hi", "max_tokens": 2})
            .to_string()
            .as_bytes(),
    );
    r.openai_error(403);
    // Naming no class, a batch key's request runs as batch.
    let r = complete(BATCH, &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["sloserve"]["slo_class"], "batch");
    let r = complete(
        FULL,
        &json!({"prompt": "Hi", "max_tokens": 2, "slo_class": "interactive"}),
    );
    assert_eq!(r.json()["usage"]["sloserve"]["slo_class"], "interactive");
}

fn cached(key: &str, prompt: &str, salt: Option<&str>) -> u64 {
    let mut body = json!({"prompt": prompt, "max_tokens": 1});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let r = complete(key, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// A prompt of several KV blocks, distinct per test.
fn long_prompt(tag: &str) -> String {
    format!(
        "{tag}: {}",
        "the quick brown fox jumps over the lazy dog. ".repeat(12)
    )
}

#[test]
fn prefix_caches_are_per_key_by_default() {
    let p = long_prompt("per-key");
    assert_eq!(cached(FULL, &p, None), 0);
    assert!(cached(FULL, &p, None) > 0, "the same key reuses its blocks");
    assert_eq!(cached(BATCH, &p, None), 0, "another key's identical prompt");
    assert!(cached(BATCH, &p, None) > 0);
}

#[test]
fn cache_salt_isolates_requests_of_one_key() {
    let p = long_prompt("salted");
    assert_eq!(cached(FULL, &p, Some("alice")), 0);
    assert!(cached(FULL, &p, Some("alice")) > 0);
    assert_eq!(cached(FULL, &p, Some("bob")), 0);
    assert_eq!(cached(FULL, &p, None), 0);
    let e = complete(FULL, &json!({"prompt": "x", "cache_salt": ""})).openai_error(400);
    assert_eq!(e["param"], "cache_salt");
}
