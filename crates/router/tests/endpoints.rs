//! Every endpoint of a replica that takes a prompt reaches one through the router
//! (issue #55): `/v1/responses` and the render endpoints routed by class like
//! chat and completions, with keys on; the fairness id a replica gets is the
//! caller's key digest, never one the client sent.

mod common;

use std::time::Duration;

use common::fake::FakeServer;
use common::*;
use serde_json::json;
use sloserve_router::RouterConfig;

#[test]
fn responses_and_render_are_routed_by_class_with_keys_on() {
    let i = FakeServer::start("i");
    let b = FakeServer::start("b");
    for f in [&i, &b] {
        *f.fake.key.lock().unwrap() = Some("k1".into());
    }
    let mut cfg =
        RouterConfig::with_fleets(&[("interactive", &[i.url()]), ("batch", &[b.url()])]).unwrap();
    cfg.health_interval = Duration::from_secs(600);
    cfg.guard.keys.keys = vec!["k1".parse().unwrap()];
    let r = TestRouter::start(cfg);
    let auth = [("authorization", "Bearer k1")];
    let bodies = [
        ("/v1/completions", json!({"prompt": "hi"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/responses", json!({"input": "hi"})),
        ("/v1/completions/render", json!({"prompt": "hi"})),
        (
            "/v1/chat/completions/render",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
    ];
    let flow = sloserve_slo::key_digest("k1");
    for (path, body) in &bodies {
        let resp = post_with(r.addr, path, &[], body);
        assert_eq!(resp.status, 401, "{path} without a key: {}", resp.text());
        let resp = post_with(r.addr, path, &auth, body);
        assert_eq!(resp.status, 200, "{path}: {}", resp.text());
        let v = resp.json();
        assert_eq!(
            (v["path"].as_str(), v["backend"].as_str()),
            (Some(*path), Some("i"))
        );
        assert_eq!(v["class"], "interactive");
        assert_eq!(v["fairness"], flow.as_str(), "{path}");
        let mut batch = body.clone();
        batch["slo_class"] = json!("batch");
        let spoof = [auth[0], ("x-llm-d-inference-fairness-id", "someone-else")];
        let v = post_with(r.addr, path, &spoof, &batch).json();
        assert_eq!(
            (v["backend"].as_str(), v["class"].as_str()),
            (Some("b"), Some("batch"))
        );
        assert_eq!(v["fairness"], flow.as_str(), "the client's id is replaced");
    }
    // A keyless router passes no fairness id on.
    let open = RouterConfig::with_fleets(&[("interactive", &[i.url()])]).unwrap();
    *i.fake.key.lock().unwrap() = None;
    let r = TestRouter::start(open);
    let spoof = [("x-gateway-inference-fairness-id", "someone-else")];
    let v = post_with(r.addr, "/v1/responses", &spoof, &json!({"input": "hi"})).json();
    assert_eq!(v["fairness"], "");
}
