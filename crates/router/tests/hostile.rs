//! The router against hostile clients and misbehaving replicas (issue #30), with
//! fake replicas: bodies over the limit refused before any replica sees them and a
//! replica's own refusal not counted as sickness; 4xx passed through (lists too);
//! the owner map pinned only by a 2xx; API keys checked (and passed on); the
//! upstream timeout failing over and ending stalled streams; slowloris, idle and
//! slow-body connections cut by their timeouts; the connection cap's probe reserve.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
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
fn oversize_bodies_are_refused_first_and_a_replica_refusing_one_is_not_sick() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    let urls = [a.url(), b.url()];
    let r = TestRouter::start(config(&[("interactive", &urls)]));
    let big = vec![b'x'; 5 << 20];
    let resp = request(r.addr, "POST", "/v1/completions", &[], &big);
    assert_eq!(resp.status, 413, "{}", resp.text());
    assert_eq!(resp.json()["error"]["type"], "invalid_request_error");
    assert_eq!(a.fake.completions.load(Ordering::Acquire), 0);

    // A router whose limit is above the replicas' (the fakes take 2 MiB): the
    // replica's refusal is passed on, not retried, and ejects nobody.
    let mut cfg = config(&[("interactive", &urls)]);
    cfg.max_body_bytes = 64 << 20;
    let r = TestRouter::start(cfg);
    let body = format!("{{\"prompt\": \"{}\"}}", "x".repeat(6 << 20));
    for _ in 0..3 {
        let resp = request(r.addr, "POST", "/v1/completions", &[], body.as_bytes());
        assert!(matches!(resp.status, 413 | 502), "{}", resp.status);
    }
    for u in &urls {
        assert_eq!(r.backend_metric("backend_healthy", u), 1.0, "{u} ejected");
        assert_eq!(r.backend_metric("backend_ejections_total", u), 0.0);
    }
    let retries = metric(
        &r.metrics(),
        "sloserve_router:retries_total{fleet=\"interactive\"}",
    );
    assert_eq!(retries, Some(0.0), "a refused body is not retried");
    assert_eq!(
        post(r.addr, "/v1/completions", &json!({"prompt": "hi"})).status,
        200
    );
}

/// A replica that answers `GET`s (its probes) with 200 and closes the connection
/// on anything else after reading 64 KiB of it, as a replica does on a body over
/// its limit.
fn closer() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = vec![0u8; 64 << 10];
            let n = c.read(&mut buf).unwrap_or(0);
            if buf[..n].starts_with(b"GET") {
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            }
        }
    });
    url
}

#[test]
fn a_replica_closing_on_a_body_is_not_ejected_nor_retried() {
    let c = closer();
    let b = FakeServer::start("b");
    let mut cfg = config(&[("interactive", &[c.clone(), b.url()])]);
    cfg.max_body_bytes = 64 << 20;
    let r = TestRouter::start(cfg);
    let body = format!("{{\"prompt\": \"{}\"}}", "x".repeat(8 << 20));
    // The picker may choose either replica; the fake one refuses the body with its
    // own 413 (a 4xx, passed through), the closer must give the 502. Try until the
    // closer has been picked.
    let mut closed = false;
    for _ in 0..20 {
        let resp = request(r.addr, "POST", "/v1/completions", &[], body.as_bytes());
        match resp.status {
            502 => {
                assert!(resp
                    .text()
                    .contains("closed the connection on the request body"));
                closed = true;
                break;
            }
            413 => continue,
            s => panic!("{s}: {}", resp.text()),
        }
    }
    assert!(closed, "the closer was never picked in 20 tries");
    assert_eq!(r.backend_metric("backend_healthy", &c), 1.0);
    assert_eq!(r.backend_metric("backend_errors_total", &c), 0.0);
    assert_eq!(b.fake.completions.load(Ordering::Acquire), 0, "not retried");
    let retries = metric(
        &r.metrics(),
        "sloserve_router:retries_total{fleet=\"interactive\"}",
    );
    assert_eq!(retries, Some(0.0), "not retried");
}

#[test]
fn replica_4xx_pass_through_and_only_a_2xx_pins_an_id() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    for f in [&a, &b] {
        *f.fake.key.lock().unwrap() = Some("k".into());
    }
    b.add_file("file-only-b");
    let urls = [a.url(), b.url()];
    let r = TestRouter::start(config(&[("interactive", &urls), ("batch", &urls)]));
    // Keyless (the router has no keys; the replicas do): their 401, untouched.
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 401, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "invalid_api_key");
    assert_eq!(
        get(r.addr, "/v1/batches").status,
        401,
        "a list's 4xx is not a 503"
    );
    assert_eq!(get(r.addr, "/v1/files/file-only-b").status, 401);
    assert!(
        r.state.owners.get("file-only-b").is_none(),
        "a 401 pinned the file"
    );
    // The 401 came from a (asked first) and must not have pinned the file there.
    let auth = [("authorization", "Bearer k")];
    let resp = request(r.addr, "GET", "/v1/files/file-only-b", &auth, b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-sloserve-backend"), Some(b.url().as_str()));
    assert_eq!(r.state.owners.get("file-only-b").unwrap().url, b.url());
    assert_eq!(
        request(r.addr, "GET", "/v1/files/file-only-b/content", &auth, b"").status,
        200
    );
    let resp = request(r.addr, "GET", "/v1/batches", &auth, b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    for u in &urls {
        assert_eq!(r.backend_metric("backend_healthy", u), 1.0);
        assert_eq!(r.backend_metric("backend_errors_total", u), 0.0);
    }
}

#[test]
fn keys_are_checked_before_the_body_and_passed_on() {
    let a = FakeServer::start("a");
    let mut cfg = config(&[("interactive", &[a.url()]), ("batch", &[a.url()])]);
    cfg.guard.keys.keys = vec!["k1".parse().unwrap(), "k2:batch".parse().unwrap()];
    let r = TestRouter::start(cfg);
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 401);
    assert_eq!(resp.json()["error"]["code"], "invalid_api_key");
    let wrong = [("authorization", "Bearer k3")];
    assert_eq!(
        request(r.addr, "GET", "/v1/models", &wrong, b"").status,
        401
    );
    assert_eq!(a.fake.completions.load(Ordering::Acquire), 0);
    assert_eq!(get(r.addr, "/health").status, 200);
    assert_eq!(get(r.addr, "/metrics").status, 200);
    let body = json!({"prompt": "hi"}).to_string();
    let resp = request(
        r.addr,
        "POST",
        "/v1/completions",
        &[("x-api-key", "k1")],
        body.as_bytes(),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["class"], "interactive");
    let auth = [("authorization", "Bearer k2")];
    let resp = request(r.addr, "POST", "/v1/completions", &auth, body.as_bytes());
    assert_eq!(
        resp.json()["class"],
        "batch",
        "a batch key is routed as batch"
    );
    assert_eq!(
        a.fake.last_auth.lock().unwrap().as_deref(),
        Some("Bearer k2")
    );
    let asks = json!({"prompt": "hi", "slo_class": "interactive"}).to_string();
    let resp = request(r.addr, "POST", "/v1/completions", &auth, asks.as_bytes());
    assert_eq!(resp.status, 403, "{}", resp.text());
}

#[test]
fn the_upstream_timeout_fails_over_and_ends_a_stalled_stream() {
    let a = FakeServer::start("a");
    let b = FakeServer::start("b");
    let mut cfg = config(&[("interactive", &[a.url(), b.url()])]);
    cfg.guard.upstream_timeout = Some(Duration::from_millis(500));
    let r = TestRouter::start(cfg);
    set(&a.fake.hang, true);
    let t0 = Instant::now();
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "b", "a hung: failed over");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert_eq!(r.backend_metric("backend_healthy", &a.url()), 0.0);
    // Every replica hung: 504 within about two timeouts.
    set(&b.fake.hang, true);
    set(&a.fake.hang, false);
    let resp = post(r.addr, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(resp.status, 504, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "upstream_timeout");
    // A stream that stalls after its first chunk ends with an error event.
    let c = FakeServer::start("c");
    let mut cfg = config(&[("interactive", &[c.url()])]);
    cfg.guard.upstream_timeout = Some(Duration::from_millis(500));
    let r = TestRouter::start(cfg);
    // (Bounds below are loose for a busy machine, and still under the fakes' stalls.)
    let body = json!({"prompt": "hi", "stream": true, "fake_stall_ms": 8000}).to_string();
    let t0 = Instant::now();
    let mut s = send(r.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(s.status, 200);
    let all = String::from_utf8_lossy(&s.read_all()).into_owned();
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(
        all.starts_with("data: {\"choices\":[{\"text\":\"Hel\"}]}"),
        "{all}"
    );
    assert!(
        all.contains("upstream_timeout") && all.ends_with("data: [DONE]\n\n"),
        "{all}"
    );
}

/// Reads until the peer closes; how long that took.
fn time_to_close(s: &mut TcpStream) -> Duration {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    t0.elapsed()
}

#[test]
fn slowloris_idle_and_slow_body_connections_are_cut() {
    let a = FakeServer::start("a");
    let mut cfg = config(&[("interactive", &[a.url()])]);
    cfg.guard.header_read_timeout = Some(Duration::from_millis(300));
    cfg.guard.keep_alive_timeout = Some(Duration::from_millis(300));
    cfg.guard.body_read_timeout = Some(Duration::from_millis(300));
    cfg.guard.max_connections = 2;
    let r = TestRouter::start(cfg);
    let mut slow = TcpStream::connect(r.addr).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let mut idle = TcpStream::connect(r.addr).unwrap();
    // Past the cap: probes only.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(get(r.addr, "/health").status, 200);
    assert_eq!(get(r.addr, "/v1/models").status, 503);
    assert!(time_to_close(&mut slow) < Duration::from_secs(4));
    assert!(time_to_close(&mut idle) < Duration::from_secs(4));
    // A body that never arrives: 408, not a slot held forever.
    let mut body = TcpStream::connect(r.addr).unwrap();
    body.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"pro",
    )
    .unwrap();
    body.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = [0u8; 12];
    body.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 408");
    // A keep-alive connection is closed once idle.
    let mut ka = TcpStream::connect(r.addr).unwrap();
    ka.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert!(time_to_close(&mut ka) < Duration::from_secs(4));
    assert_eq!(a.fake.completions.load(Ordering::Acquire), 0);
}
