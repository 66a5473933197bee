//! The router against fake backends (fault cases and exact bytes): retry before the
//! first byte, passive ejection and active re-admission, an error event when a
//! stream breaks, byte-exact pass-through, client disconnect cancelling upstream,
//! class routing and spill-over, `/v1/models`, and the Batch API's id ownership.

mod common;

use std::time::Duration;

use common::fake::{FakeServer, CHUNKS};
use common::*;
use serde_json::{json, Value};
use sloserve_router::RouterConfig;

fn router(fleets: &[(&str, &[String])]) -> TestRouter {
    let mut cfg = RouterConfig::with_fleets(fleets).unwrap();
    cfg.health_interval = Duration::from_millis(100);
    cfg.objectives
        .insert("offline".into(), sloserve_slo::SloClass::Batch);
    TestRouter::start(cfg)
}

fn stream_body() -> Value {
    json!({"prompt": "hi", "stream": true, "max_tokens": 4})
}

fn set(flag: &std::sync::atomic::AtomicBool, v: bool) {
    flag.store(v, std::sync::atomic::Ordering::Release);
}

#[test]
fn failure_before_the_first_byte_is_retried_elsewhere_and_ejects_the_replica() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    // A closed port: connection refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    set(&a.fake.fail, true);
    // Active checks only at start: what follows is passive.
    let mut cfg = RouterConfig::with_fleets(&[
        ("interactive", &[a.url(), b.url()]),
        ("batch", &[dead.clone(), b.url()]),
    ])
    .unwrap();
    cfg.health_interval = Duration::from_secs(600);
    let r = TestRouter::start(cfg);
    // The first round of checks (at start) done, so it cannot re-admit a later.
    let checked = || {
        a.fake
            .health_checks
            .load(std::sync::atomic::Ordering::Acquire)
            >= 2
    };
    assert!(wait_until(5.0, checked));
    std::thread::sleep(Duration::from_millis(100));
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "b", "a answered 500: retried on b");
    assert_eq!(
        a.fake
            .completions
            .load(std::sync::atomic::Ordering::Acquire),
        1
    );
    assert_eq!(
        metric(
            &r.metrics(),
            "sloserve_router:retries_total{fleet=\"interactive\"}"
        ),
        Some(1.0)
    );
    assert_eq!(r.backend_metric("backend_healthy", &a.url()), 0.0);
    assert_eq!(r.backend_metric("backend_ejections_total", &a.url()), 1.0);
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.json()["backend"], "b");
    assert_eq!(
        a.fake
            .completions
            .load(std::sync::atomic::Ordering::Acquire),
        1,
        "ejected: not tried"
    );
    let resp = post(
        r.addr,
        "/v1/completions",
        &json!({"prompt": "hi", "slo_class": "batch"}),
    );
    assert_eq!(
        resp.json()["backend"],
        "b",
        "connection refused: retried on b"
    );
    assert_eq!(r.backend_metric("backend_healthy", &dead), 0.0);
    // Every replica failing: the last failure is the answer.
    set(&b.fake.fail, true);
    let resp = post(
        r.addr,
        "/v1/completions",
        &json!({"prompt": "hi", "slo_class": "batch"}),
    );
    assert_eq!(resp.status, 500, "{}", resp.text());
    // b is in both fleets, as two entries: the interactive one fails now too.
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 500, "{}", resp.text());
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 503, "no healthy replica left: {}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "no_healthy_replica");
    assert_eq!(get(r.addr, "/ready").status, 503);
}

#[test]
fn active_checks_eject_and_readmit() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    let r = router(&[("interactive", &[a.url(), b.url()])]);
    set(&a.fake.down, true);
    assert!(wait_until(5.0, || r
        .backend_metric("backend_healthy", &a.url())
        == 0.0));
    assert_eq!(
        post(r.addr, "/v1/completions", &json!({"prompt": "hi"})).json()["backend"],
        "b"
    );
    set(&a.fake.down, false);
    assert!(wait_until(5.0, || r
        .backend_metric("backend_healthy", &a.url())
        == 1.0));
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(
        resp.json()["backend"],
        "a",
        "least work, first in the fleet"
    );
    assert_eq!(r.backend_metric("backend_ejections_total", &a.url()), 1.0);
}

#[test]
fn stream_is_passed_through_byte_for_byte_and_a_broken_one_ends_with_an_error_event() {
    let a = FakeServer::start("a");
    let r = router(&[("interactive", &[a.url()])]);
    let direct = request(
        a.addr,
        "POST",
        "/v1/completions",
        &[],
        stream_body().to_string().as_bytes(),
    );
    let routed = request(
        r.addr,
        "POST",
        "/v1/completions",
        &[],
        stream_body().to_string().as_bytes(),
    );
    assert_eq!(direct.body, CHUNKS.concat());
    assert_eq!(routed.body, direct.body);
    assert_eq!(routed.header("content-type"), Some("text/event-stream"));
    assert_eq!(routed.header("x-sloserve-backend"), Some(a.url().as_str()));

    let mut b = stream_body();
    b["fake_die_after"] = json!(2);
    let mut s = send(
        r.addr,
        "POST",
        "/v1/completions",
        &[],
        b.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200);
    let body = String::from_utf8_lossy(&s.read_all()).into_owned();
    assert!(
        body.starts_with("data: {\"choices\":[{\"text\":\"Hel\"}]}"),
        "{body}"
    );
    assert!(body.contains("data: {\"error\":"), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(
        metric(
            &r.metrics(),
            "sloserve_router:retries_total{fleet=\"interactive\"}"
        ),
        Some(0.0),
        "bytes had left: no retry"
    );
    assert!(r.backend_metric("backend_errors_total", &a.url()) >= 1.0);
}

#[test]
fn client_disconnect_drops_the_upstream_stream() {
    let a = FakeServer::start("a");
    let r = router(&[("interactive", &[a.url()])]);
    let mut b = stream_body();
    b["fake_delay_ms"] = json!(50);
    b["fake_repeat"] = json!(200);
    let mut s = send(
        r.addr,
        "POST",
        "/v1/completions",
        &[],
        b.to_string().as_bytes(),
    );
    assert!(s.next_event().is_some());
    assert_eq!(r.backend_metric("backend_in_flight", &a.url()), 1.0);
    drop(s);
    assert!(
        wait_until(5.0, || a
            .fake
            .dropped_streams
            .load(std::sync::atomic::Ordering::Acquire)
            == 1),
        "upstream stream not dropped"
    );
    assert!(wait_until(2.0, || r
        .backend_metric("backend_in_flight", &a.url())
        == 0.0));
}

#[test]
fn classes_reach_their_fleets_and_batch_spills_onto_an_idle_interactive_replica() {
    let i = FakeServer::start("i");
    let bt = FakeServer::start("b");
    let r = router(&[("interactive", &[i.url()]), ("batch", &[bt.url()])]);
    let go =
        |h: &[(&str, &str)], body: Value| post_with(r.addr, "/v1/completions", h, &body).json();
    let v = go(&[], json!({"prompt": "x"}));
    assert_eq!(
        (v["backend"].as_str(), v["class"].as_str()),
        (Some("i"), Some("interactive"))
    );
    let v = go(
        &[("x-llm-d-inference-objective", "offline")],
        json!({"prompt": "x"}),
    );
    assert_eq!(
        (v["backend"].as_str(), v["class"].as_str()),
        (Some("b"), Some("batch"))
    );
    let v = go(&[("X-SLO-Class", "batch")], json!({"prompt": "x"}));
    assert_eq!(v["backend"], "b");
    let v = go(
        &[("X-SLO-Class", "batch")],
        json!({"prompt": "x", "slo_class": "interactive"}),
    );
    assert_eq!(v["backend"], "i");
    let e = post(
        r.addr,
        "/v1/completions",
        &json!({"prompt": "x", "slo_class": "bulk"}),
    );
    assert_eq!(e.status, 400);
    assert_eq!(e.json()["error"]["param"], "slo_class");
    // Spill-over is off: a busy batch fleet does not spill.
    drop(r);
    let mut cfg =
        RouterConfig::with_fleets(&[("interactive", &[i.url()]), ("batch", &[bt.url()])]).unwrap();
    cfg.spill_over = true;
    let r = TestRouter::start(cfg);
    let mut long = stream_body();
    long["slo_class"] = json!("batch");
    long["fake_delay_ms"] = json!(50);
    long["fake_repeat"] = json!(100);
    let mut s = send(
        r.addr,
        "POST",
        "/v1/completions",
        &[],
        long.to_string().as_bytes(),
    );
    assert_eq!(s.header("x-sloserve-backend"), Some(bt.url().as_str()));
    assert!(s.next_event().is_some());
    let v = post_with(
        r.addr,
        "/v1/completions",
        &[("X-SLO-Class", "batch")],
        &json!({"prompt": "x"}),
    )
    .json();
    assert_eq!(
        (v["backend"].as_str(), v["class"].as_str()),
        (Some("i"), Some("batch")),
        "spilled, in the batch class"
    );
    assert_eq!(
        metric(&r.metrics(), "sloserve_router:spilled_total"),
        Some(1.0)
    );
    drop(s);
}

#[test]
fn models_are_the_union_and_batch_ids_stay_with_their_replica() {
    let f1 = FakeServer::start("f1");
    let f2 = FakeServer::start("f2");
    let fleets = [("batch", &[f1.url(), f2.url()][..])];
    let r = router(&fleets);
    let m = get(r.addr, "/v1/models").json();
    let mut ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["model-f1", "model-f2", "shared"]);
    assert_eq!(get(r.addr, "/ready").status, 200);

    // A file uploaded to f2 directly, then a batch on it through the router: the
    // router finds its owner (f1 answers 404) and remembers the new ids.
    f2.add_file("file-upload");
    let b = post(
        r.addr,
        "/v1/batches",
        &json!({"input_file_id": "file-upload", "endpoint": "/v1/completions"}),
    );
    assert_eq!(b.status, 200, "{}", b.text());
    assert_eq!(b.header("x-sloserve-backend"), Some(f2.url().as_str()));
    let id = b.json()["id"].as_str().unwrap().to_owned();
    let out = b.json()["output_file_id"].as_str().unwrap().to_owned();
    for path in [
        format!("/v1/batches/{id}"),
        format!("/v1/files/{out}/content"),
    ] {
        let g = get(r.addr, &path);
        assert_eq!(g.status, 200, "{path}: {}", g.text());
        assert_eq!(g.header("x-sloserve-backend"), Some(f2.url().as_str()));
    }
    // Uploads through the router; the batch on it lands where the file is.
    let up = request(
        r.addr,
        "POST",
        "/v1/files",
        &[("content-type", "application/octet-stream")],
        b"{}\n",
    );
    let file = up.json()["id"].as_str().unwrap().to_owned();
    let owner = up.header("x-sloserve-backend").unwrap().to_owned();
    let b2 = post(r.addr, "/v1/batches", &json!({"input_file_id": file}));
    assert_eq!(b2.status, 200);
    assert_eq!(b2.header("x-sloserve-backend"), Some(owner.as_str()));
    // A router that never saw the id finds it by asking each replica.
    let fresh = router(&fleets);
    assert_eq!(get(fresh.addr, &format!("/v1/batches/{id}")).status, 200);
    let list = get(fresh.addr, "/v1/batches").json();
    assert_eq!(list["data"].as_array().unwrap().len(), 2, "{list}");
    let missing = get(fresh.addr, "/v1/batches/batch-nope");
    assert_eq!(missing.status, 404);
    assert!(missing.json()["error"]["message"].is_string());
}
