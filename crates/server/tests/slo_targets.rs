//! SLO classes and per-request latency targets against the real server: the class
//! from the body, `X-SLO-Class` or the gateway's objective header; body fields and the
//! gateway's headers become the request's TTFT / TPOT targets (reported in
//! `usage.sloserve` with whether they were met), bad targets are 400s naming the
//! field or header, and attainment, deferred batch rows and the step-time model
//! are in `/metrics`.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::json;

/// Behind a trusted hop (`--trust-gateway-headers`): the fairness id is read.
fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.guard.trust_gateway_headers = true;
        TestServer::start(a)
    })
}

fn body() -> serde_json::Value {
    json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "ignore_eos": true})
}

#[test]
fn slo_class_from_body_or_header() {
    let s = server();
    let body = json!({"prompt": "Hi", "max_tokens": 1});
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("X-SLO-Class", "batch")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.json()["usage"]["sloserve"]["slo_class"], "batch");
    let mut b = body.clone();
    b["slo_class"] = json!("interactive");
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("X-SLO-Class", "batch")],
        b.to_string().as_bytes(),
    );
    assert_eq!(r.json()["usage"]["sloserve"]["slo_class"], "interactive");
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("X-SLO-Class", "bulk")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.openai_error(400)["param"], "X-SLO-Class");
    b["ttft_slo_ms"] = json!(60000);
    assert_eq!(post(s.addr, "/v1/completions", &b).status, 200);
}

#[test]
fn body_and_header_targets_are_reported_with_attainment() {
    let s = server();
    // Body fields.
    let mut b = body();
    b["ttft_slo_ms"] = json!(60000);
    b["tpot_slo_ms"] = json!(0.001);
    let r = post(s.addr, "/v1/completions", &b);
    assert_eq!(r.status, 200, "{}", r.text());
    let slo = &r.json()["usage"]["sloserve"];
    assert_eq!(slo["ttft_target_ms"], 60000.0);
    assert_eq!(slo["tpot_target_ms"], 0.001);
    assert_eq!(slo["ttft_met"], true, "{slo}");
    assert_eq!(
        slo["tpot_met"], false,
        "no CPU decodes a token in 1 us: {slo}"
    );
    // The gateway's headers (llm-d's names, then the older ones).
    for (ttft, tpot) in [
        ("x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"),
        ("x-slo-ttft-ms", "x-slo-tpot-ms"),
    ] {
        let r = request(
            s.addr,
            "POST",
            "/v1/completions",
            &[(ttft, "45000"), (tpot, "30000")],
            body().to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let slo = &r.json()["usage"]["sloserve"];
        assert_eq!(slo["ttft_target_ms"], 45000.0, "{ttft}");
        assert_eq!(slo["tpot_target_ms"], 30000.0, "{tpot}");
        assert_eq!(
            (slo["ttft_met"].clone(), slo["tpot_met"].clone()),
            (json!(true), json!(true))
        );
    }
    // The body wins over a header.
    let mut b = body();
    b["ttft_slo_ms"] = json!(50000);
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-slo-ttft-ms", "1")],
        b.to_string().as_bytes(),
    );
    assert_eq!(r.json()["usage"]["sloserve"]["ttft_target_ms"], 50000.0);
    // Batch requests have no targets.
    let mut b = body();
    b["slo_class"] = json!("batch");
    b["tpot_slo_ms"] = json!(10);
    let slo = post(s.addr, "/v1/completions", &b).json()["usage"]["sloserve"].clone();
    assert_eq!(slo["slo_class"], "batch");
    assert!(slo.get("tpot_target_ms").is_none(), "{slo}");

    // Attainment is counted in the engine's snapshot, published after the step
    // whose last token the client may already hold.
    let interactive = "sloserve:slo_attainment_total{model_name=\"smol\",slo_class=\"interactive\"";
    let met = format!("{interactive},slo=\"ttft\",result=\"met\"}}");
    let missed = format!("{interactive},slo=\"tpot\",result=\"missed\"}}");
    wait_for("4 TTFT met and 1 TPOT missed", 10, || {
        let m = get(s.addr, "/metrics").text();
        metric(&m, &met).unwrap_or(0.0) >= 4.0 && metric(&m, &missed).unwrap_or(0.0) >= 1.0
    });
    let m = get(s.addr, "/metrics").text();
    assert!(m.contains("sloserve:batch_rows_deferred_total"));
    for term in [
        "fixed",
        "prefill_token",
        "decode_row",
        "context_ktoken",
        "large_batch",
    ] {
        let v = metric(
            &m,
            &format!("sloserve:step_cost_seconds{{model_name=\"smol\",term=\"{term}\"}}"),
        )
        .unwrap_or_else(|| panic!("no step cost term {term}"));
        assert!(v >= 0.0);
    }
}

#[test]
fn bad_targets_are_400s_naming_the_field() {
    let s = server();
    for field in ["ttft_slo_ms", "tpot_slo_ms"] {
        let mut b = body();
        b[field] = json!(-5);
        let e = post(s.addr, "/v1/completions", &b).openai_error(400);
        assert_eq!(e["param"], field);
    }
    for header in ["x-llm-d-slo-tpot-ms", "x-slo-ttft-ms"] {
        let r = request(
            s.addr,
            "POST",
            "/v1/completions",
            &[(header, "soon")],
            body().to_string().as_bytes(),
        );
        assert_eq!(r.openai_error(400)["param"], header);
    }
}

/// From a trusted hop, the gateway's fairness id (llm-d's name or the older one)
/// is accepted; one over 128 bytes or with a character that is not visible ASCII
/// is a 400 naming the header.
#[test]
fn fairness_id_header_is_read_and_a_bad_one_is_a_400() {
    let s = server();
    let send = |header: &str, value: &str| {
        request(
            s.addr,
            "POST",
            "/v1/completions",
            &[(header, value)],
            body().to_string().as_bytes(),
        )
    };
    for header in [
        "x-llm-d-inference-fairness-id",
        "x-gateway-inference-fairness-id",
    ] {
        let r = send(header, "tenant-a");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(send(header, &"t".repeat(128)).status, 200);
        for bad in ["t".repeat(129), "tenant a".to_string()] {
            let e = send(header, &bad).openai_error(400);
            assert_eq!(e["param"], header, "{bad:?}");
            assert!(e["message"].as_str().unwrap().contains(header), "{e}");
        }
    }
}

/// What an inference gateway's endpoint picker reads and sends: vLLM's
/// `cache_config_info` and the integer request field `priority`.
#[test]
fn gateway_metrics_and_priority() {
    let s = server();
    let mut b = body();
    b["priority"] = json!(-1);
    assert_eq!(post(s.addr, "/v1/completions", &b).status, 200);
    b["priority"] = json!("high");
    assert_eq!(post(s.addr, "/v1/completions", &b).status, 400);
    let m = get(s.addr, "/metrics").text();
    let line = m
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .expect("vllm:cache_config_info");
    assert!(
        line.contains("block_size=\"16\"") && line.contains("num_gpu_blocks=\""),
        "{line}"
    );
    assert!(line.ends_with(" 1"), "{line}");
}

/// The gateway's objective header maps to a class through the config's
/// `[objectives]`; a class named in the request wins; unknown objectives get the
/// default class.
#[test]
fn objective_header_maps_to_a_class() {
    let dir = std::env::temp_dir().join(format!("sloserve-objectives-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("objectives.toml");
    std::fs::write(
        &cfg,
        "[objectives]\nchat = \"interactive\"\noffline = \"batch\"\n",
    )
    .unwrap();
    let mut args = test_args();
    args.config = Some(cfg);
    let s = TestServer::start(args);
    let class = |headers: &[(&str, &str)], b: &serde_json::Value| {
        let r = request(
            s.addr,
            "POST",
            "/v1/completions",
            headers,
            b.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["sloserve"]["slo_class"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        class(&[("x-llm-d-inference-objective", "offline")], &body()),
        "batch"
    );
    assert_eq!(
        class(&[("x-gateway-inference-objective", "offline")], &body()),
        "batch"
    );
    assert_eq!(
        class(&[("x-llm-d-inference-objective", "chat")], &body()),
        "interactive"
    );
    assert_eq!(
        class(&[("x-llm-d-inference-objective", "other")], &body()),
        "interactive"
    );
    let mut b = body();
    b["slo_class"] = json!("interactive");
    assert_eq!(
        class(&[("x-llm-d-inference-objective", "offline")], &b),
        "interactive"
    );
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
