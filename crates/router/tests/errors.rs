//! Whose fault an error is (issue #55), with fake replicas: a 5xx the replica calls
//! the request's own is passed on, not retried, and ejects nobody, however many
//! come; one it calls its own (or does not mark) is retried and counted; a
//! non-stream answer that fails mid-way is a JSON error with its status, never a
//! 200; a trickling replica is cut at the request's deadline, streamed or not.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::fake::FakeServer;
use common::*;
use serde_json::json;
use sloserve_router::RouterConfig;

fn set(flag: &AtomicBool, v: bool) {
    flag.store(v, Ordering::Release);
}

/// Passive health only (no active check re-admits a replica during a test).
fn config(fleets: &[(&str, &[String])]) -> RouterConfig {
    let mut cfg = RouterConfig::with_fleets(fleets).unwrap();
    cfg.health_interval = Duration::from_secs(600);
    cfg
}

#[test]
fn a_request_own_failure_is_passed_on_and_ejects_no_replica() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    let urls = [a.url(), b.url()];
    let r = TestRouter::start(config(&[("interactive", &urls)]));
    for f in [&a, &b] {
        set(&f.fake.fail, true);
        *f.fake.fail_origin.lock().unwrap() = Some("request");
    }
    for _ in 0..5 {
        let resp = post(r.addr, "/v1/completions", &json!({"prompt": "bad"}));
        assert_eq!(resp.status, 500, "{}", resp.text());
        assert_eq!(resp.json()["error"]["message"], "fake failure");
    }
    for u in &urls {
        assert_eq!(r.backend_metric("backend_healthy", u), 1.0, "{u} ejected");
        assert_eq!(r.backend_metric("backend_errors_total", u), 0.0);
    }
    let tried =
        a.fake.completions.load(Ordering::Acquire) + b.fake.completions.load(Ordering::Acquire);
    assert_eq!(tried, 5, "the request's own failure is not retried");
    let retries = metric(
        &r.metrics(),
        "sloserve_router:retries_total{fleet=\"interactive\"}",
    );
    assert_eq!(retries, Some(0.0));
    // Other requests still get answers.
    set(&a.fake.fail, false);
    set(&b.fake.fail, false);
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "good"}));
    assert_eq!(resp.status, 200, "{}", resp.text());

    // Load (a 503 marked so) is retried elsewhere and counted against nobody.
    set(&a.fake.fail, true);
    *a.fake.fail_origin.lock().unwrap() = Some("load");
    for _ in 0..4 {
        let resp = post(r.addr, "/v1/completions", &json!({"prompt": "x"}));
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json()["backend"], "b");
    }
    assert_eq!(r.backend_metric("backend_healthy", &a.url()), 1.0);

    // The replica's own fault (said, or not said) is retried and counted.
    *a.fake.fail_origin.lock().unwrap() = Some("replica");
    let ejected = wait_until(5.0, || {
        let resp = post(r.addr, "/v1/completions", &json!({"prompt": "x"}));
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json()["backend"], "b");
        r.backend_metric("backend_healthy", &a.url()) == 0.0
    });
    assert!(ejected, "a's own fault ejects it");
    assert_eq!(r.backend_metric("backend_healthy", &b.url()), 1.0);
}

#[test]
fn a_non_stream_answer_failing_mid_way_is_a_json_error() {
    let a = FakeServer::start("a");
    let mut cfg = config(&[("interactive", &[a.url()])]);
    cfg.eject_after = 2;
    let r = TestRouter::start(cfg);
    let resp = post(
        r.addr,
        "/v1/completions",
        &json!({"prompt": "hi", "fake_die_after": 1}),
    );
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(resp.json()["error"]["code"], "bad_gateway");
    assert_eq!(r.backend_metric("backend_errors_total", &a.url()), 1.0);
    // A whole answer still comes through whole.
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "a");
}

#[test]
fn a_trickling_replica_is_cut_at_the_deadline() {
    let a = FakeServer::start("a");
    let mut cfg = config(&[("interactive", &[a.url()])]);
    cfg.guard.upstream_timeout = Some(Duration::from_secs(5));
    cfg.guard.upstream_deadline = Some(Duration::from_millis(1500));
    cfg.eject_after = 100;
    let r = TestRouter::start(cfg);
    // One byte every 200 ms: never a gap of the upstream timeout.
    let t0 = Instant::now();
    let body = json!({"prompt": "hi", "fake_trickle_ms": 200});
    let resp = post(r.addr, "/v1/completions", &body);
    let took = t0.elapsed();
    assert_eq!(resp.status, 504, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "upstream_deadline");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Streamed: the stream ends with an error event.
    let body = json!({"prompt": "hi", "stream": true, "fake_trickle_ms": 200}).to_string();
    let t0 = Instant::now();
    let mut s = send(r.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(s.status, 200);
    let all = String::from_utf8_lossy(&s.read_all()).into_owned();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        all.contains("upstream_deadline") && all.ends_with("data: [DONE]\n\n"),
        "{all}"
    );
    // The client's own deadline is shorter: it wins (plus the replica's grace).
    let mut cfg = config(&[("interactive", &[a.url()])]);
    cfg.guard.upstream_deadline = Some(Duration::from_secs(60));
    let r = TestRouter::start(cfg);
    let t0 = Instant::now();
    let resp = post_with(
        r.addr,
        "/v1/completions",
        &[("x-request-timeout-ms", "100")],
        &json!({"prompt": "hi", "fake_trickle_ms": 200}),
    );
    assert_eq!(resp.status, 504, "{}", resp.text());
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}
