//! Every endpoint of a replica that takes a prompt reaches one through the router
//! (issue #55): `/v1/responses` and the render endpoints routed by class like
//! chat and completions, with keys on; the fairness id a replica gets is the
//! caller's key digest, never one the client sent.

mod common;

use std::time::Duration;

use common::fake::FakeServer;
use common::*;
use serde_json::json;
use sloserve_api::endpoints::Runs;
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
    // Every endpoint of the table that generates or renders a prompt.
    let bodies: Vec<_> = sloserve_api::endpoints::TABLE
        .iter()
        .filter(|s| matches!(s.runs, Runs::Generation | Runs::Render))
        .map(|s| {
            let body = match s.body {
                Some("ChatCompletionRequest") => {
                    json!({"messages": [{"role": "user", "content": "hi"}]})
                }
                Some("ResponsesRequest") => json!({"input": "hi"}),
                _ => json!({"prompt": "hi"}),
            };
            (s.path, body)
        })
        .collect();
    assert_eq!(bodies.len(), 5);
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

/// The router answers every endpoint of the table with its methods (whatever
/// the fake replica says to an empty body), and 405 to any other method.
#[test]
fn the_routed_endpoints_are_the_endpoint_table() {
    let i = FakeServer::start("i");
    let mut cfg = RouterConfig::with_fleets(&[("interactive", &[i.url()])]).unwrap();
    cfg.health_interval = Duration::from_secs(600);
    let r = TestRouter::start(cfg);
    for spec in sloserve_api::endpoints::TABLE {
        let path = spec.path.replace("{*id}", "x").replace("{id}", "x");
        for m in ["GET", "POST", "DELETE"] {
            let resp = request(r.addr, m, &path, &[], b"{}");
            let allowed = spec.methods.iter().any(|x| x.as_str() == m);
            let text = resp.text();
            if allowed {
                assert!(
                    resp.status != 405 && !text.contains("no route for"),
                    "{m} {path}: {} {text}",
                    resp.status
                );
            } else {
                assert_eq!(resp.status, 405, "{m} {path}: {text}");
            }
        }
    }
}

/// The pooled endpoints (embeddings, rerank, score) go to the batch fleet when
/// they name no class (the replica runs them as batch too), and to the
/// interactive fleet when they ask.
#[test]
fn pooled_endpoints_go_to_the_batch_fleet_by_default() {
    let i = FakeServer::start("i");
    let b = FakeServer::start("b");
    let mut cfg =
        RouterConfig::with_fleets(&[("interactive", &[i.url()]), ("batch", &[b.url()])]).unwrap();
    cfg.health_interval = Duration::from_secs(600);
    let r = TestRouter::start(cfg);
    let pooled: Vec<_> = sloserve_api::endpoints::TABLE
        .iter()
        .filter(|s| s.runs == Runs::Pooling)
        .map(|s| s.path)
        .collect();
    assert_eq!(pooled, ["/v1/embeddings", "/v1/rerank", "/score"]);
    for path in pooled {
        let body =
            json!({"input": "hi", "query": "q", "documents": ["d"], "text_1": "a", "text_2": "b"});
        let v = post_with(r.addr, path, &[], &body).json();
        assert_eq!(
            (v["path"].as_str(), v["backend"].as_str()),
            (Some(path), Some("b"))
        );
        let mut asked = body.clone();
        asked["slo_class"] = json!("interactive");
        let v = post_with(r.addr, path, &[], &asked).json();
        assert_eq!(v["backend"], "i", "{path}");
    }
}
