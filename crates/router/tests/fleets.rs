//! The router in front of real replicas of the default model: each class reaches
//! only its fleet (the replicas' own `/metrics` say so), a stream through the
//! router carries the same events as from the replica directly, and a client that
//! disconnects cancels the replica's request.

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use common::*;
use serde_json::{json, Value};
use sloserve_router::RouterConfig;
use sloserve_slo::SloClass;

struct Setup {
    interactive: Replica,
    batch: Replica,
    router: TestRouter,
}

/// The shared replicas, one test at a time (the tests read their metrics).
fn setup() -> (MutexGuard<'static, ()>, &'static Setup) {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    (guard, setup_once())
}

fn setup_once() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        // Both replicas honour the class they are sent (the `batch` profile would
        // label everything batch), so their metrics show what the router sent.
        // Exact precision: a greedy answer does not depend on whether its prompt
        // came from the prefix cache (fast mode's kernels differ by row count).
        let args = || {
            let mut a = replica_args("interactive");
            a.precision = sloserve_model::Precision::Exact;
            a
        };
        let interactive = Replica::start(args(), 0);
        let batch = Replica::start(args(), 0);
        let mut cfg = RouterConfig::with_fleets(&[
            ("interactive", &[interactive.url()]),
            ("batch", &[batch.url()]),
        ])
        .unwrap();
        cfg.objectives.insert("offline".into(), SloClass::Batch);
        cfg.objectives.insert("chat".into(), SloClass::Interactive);
        let router = TestRouter::start(cfg);
        Setup {
            interactive,
            batch,
            router,
        }
    })
}

fn finished(text: &str, class: &str) -> f64 {
    metric_sum(
        text,
        &format!("sloserve:request_success_total{{model_name=\"smol\",slo_class=\"{class}\""),
    )
}

#[test]
fn each_class_reaches_only_its_fleet() {
    let (_one_at_a_time, s) = setup();
    let before = (s.interactive.metrics(), s.batch.metrics());
    let body = json!({"prompt": "The capital of France is", "max_tokens": 2});
    let with = |class: Option<&str>| {
        let mut b = body.clone();
        if let Some(c) = class {
            b["slo_class"] = json!(c);
        }
        b
    };
    for (headers, b) in [
        (vec![], with(None)),
        (vec![], with(Some("interactive"))),
        (vec![("X-SLO-Class", "interactive")], with(None)),
        (vec![("x-llm-d-inference-objective", "chat")], with(None)),
        (vec![], with(Some("batch"))),
        (vec![("X-SLO-Class", "batch")], with(None)),
        (vec![("x-llm-d-inference-objective", "offline")], with(None)),
        (
            vec![("x-gateway-inference-objective", "offline")],
            with(None),
        ),
    ] {
        let r = post_with(s.router.addr, "/v1/completions", &headers, &b);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let after = (s.interactive.metrics(), s.batch.metrics());
    let delta = |a: &str, b: &str, class| finished(a, class) - finished(b, class);
    assert_eq!(
        delta(&after.0, &before.0, "interactive"),
        4.0,
        "{}",
        after.0
    );
    assert_eq!(delta(&after.0, &before.0, "batch"), 0.0);
    assert_eq!(
        delta(&after.1, &before.1, "interactive"),
        0.0,
        "no interactive request on the batch fleet"
    );
    assert_eq!(delta(&after.1, &before.1, "batch"), 4.0);
    // The router's own view: TTFT observed per fleet.
    let m = s.router.metrics();
    for fleet in ["interactive", "batch"] {
        let n = metric(
            &m,
            &format!("sloserve_router:time_to_first_token_seconds_count{{fleet=\"{fleet}\"}}"),
        );
        assert!(n.unwrap() >= 4.0, "{m}");
    }
}

/// The SSE events with the per-request fields (`id`, `created`) blanked.
fn events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8(body.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap_or(e);
            match serde_json::from_str::<Value>(data) {
                Ok(mut v) => {
                    v["id"] = json!("");
                    v["created"] = json!(0);
                    v.to_string()
                }
                Err(_) => data.to_owned(),
            }
        })
        .collect()
}

#[test]
fn a_stream_through_the_router_equals_the_direct_one() {
    let (_one_at_a_time, s) = setup();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let mut b = json!({"max_tokens": 8, "temperature": 0, "stream": true, "ignore_eos": true});
        if path.contains("chat") {
            b["messages"] = json!([{"role": "user", "content": "Name a colour."}]);
        } else {
            b["prompt"] = json!("Once upon a time");
        }
        let direct = post(s.interactive.addr, path, &b);
        let routed = post(s.router.addr, path, &b);
        assert_eq!(routed.status, 200);
        assert_eq!(routed.header("content-type"), direct.header("content-type"));
        let (d, r) = (events(&direct.body), events(&routed.body));
        assert!(d.len() >= 8, "{d:?}");
        assert_eq!(r, d);
    }
}

#[test]
fn a_client_disconnect_cancels_the_replica_request() {
    let (_one_at_a_time, s) = setup();
    let b =
        json!({"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "ignore_eos": true, "stream": true});
    let gen_before =
        metric(&s.interactive.metrics(), "sloserve:generation_tokens_total").unwrap_or(0.0);
    let mut st = send(
        s.router.addr,
        "POST",
        "/v1/completions",
        &[],
        b.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    assert!(st.next_json().is_some());
    assert!(st.next_json().is_some());
    drop(st);
    let running = |m: &str| metric(m, "sloserve:num_requests_running").unwrap_or(1.0);
    assert!(
        wait_until(20.0, || running(&s.interactive.metrics()) == 0.0),
        "the replica still runs the request"
    );
    let generated =
        metric(&s.interactive.metrics(), "sloserve:generation_tokens_total").unwrap() - gen_before;
    assert!(generated < 400.0, "cancelled early: {generated} tokens");
    let url = s.interactive.url();
    assert!(wait_until(5.0, || s
        .router
        .backend_metric("backend_in_flight", &url)
        == 0.0));
}
