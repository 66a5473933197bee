//! API keys against the real server: 401 (OpenAI's shape) without or with a wrong
//! key on every closed route (also ones that do not exist), 200 with the right one
//! (Bearer or x-api-key), open probes, `--metrics-require-key`, the per-key SLO
//! class ceiling, isolated prefix caches (per-key scope and `cache_salt`), and the
//! SLO page: its static files open, its data (`/slo/status`) behind the key.

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

#[test]
fn the_slo_page_is_open_and_its_data_needs_the_key() {
    let s = server();
    for (path, ty) in [
        ("/slo", "text/html"),
        ("/slo/app.js", "text/javascript"),
        ("/slo/style.css", "text/css"),
    ] {
        let r = get(s.addr, path);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").unwrap().starts_with(ty), "{path}");
        let csp = r.header("content-security-policy").unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    }
    assert!(get(s.addr, "/slo").text().contains("/slo/app.js"));
    assert_eq!(
        get(s.addr, "/slo/status").openai_error(401)["code"],
        "invalid_api_key"
    );
    let auth = bearer(FULL);
    let status = || {
        let r = request(
            s.addr,
            "GET",
            "/slo/status",
            &[("Authorization", &auth)],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let st = status();
    assert_eq!(st["model"], "smol");
    let classes: Vec<&str> = st["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["interactive", "batch"]);
    // The same figures /metrics renders.
    let m = request(s.addr, "GET", "/metrics", &[("Authorization", &auth)], b"").text();
    let total = metric(&m, "sloserve:kv_cache_blocks_total").unwrap();
    assert!(total > 0.0 && st["kv"]["blocks_total"].as_f64() == Some(total));
    assert!(st["batch"]["running"].is_array() && st["batch"]["jobs"].is_object());
    let r = complete(FULL, &json!({"prompt": "The sky is", "max_tokens": 4}));
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for("the status to count the request", 10, || {
        let c = &status()["classes"][0];
        c["ttft"]["count"].as_u64() >= Some(1)
            && c["ttft"]["p50_s"].as_f64() > Some(0.0)
            && c["tokens_after_first"].as_u64() >= Some(1)
            && c["finished"]["length"].as_u64() >= Some(1)
    });
    let c = &status()["classes"][0];
    assert!(c["predicted_wait_s"].as_f64().unwrap() >= 0.0 && c["waiting"].is_u64());
}
