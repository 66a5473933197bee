//! Connections and time against the real server: the connection limit (probes
//! still answer), the in-flight limit (503 + Retry-After at once), a slowloris
//! client dropped after the header timeout, idle keep-alive connections closed, a
//! request deadline that frees its blocks, a stalled SSE reader cancelled, and
//! 4 MiB `/tokenize` bodies that leave `/health` answering.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sloserve_server::ServeArgs;

fn args(f: impl FnOnce(&mut ServeArgs)) -> ServeArgs {
    let mut a = test_args();
    f(&mut a);
    a
}

fn metrics(addr: SocketAddr) -> String {
    get(addr, "/metrics").text()
}

/// No request is running and no KV block is held.
fn engine_idle(addr: SocketAddr) -> bool {
    let m = metrics(addr);
    metric_sum(&m, "sloserve:num_requests_running") == 0.0
        && metric(&m, "sloserve:kv_cache_blocks_used").unwrap_or(1.0) == 0.0
}

/// True once the peer has closed `s` (a read returns 0 or fails), within `secs`.
fn closed_within(s: &mut TcpStream, secs: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. a 408 before the close
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn each_choice_counts_in_flight_and_all_are_admitted_together() {
    let s = TestServer::start(args(|a| {
        a.guard.max_inflight_requests = 4;
        a.engine.set("max-waiting-requests", "3").unwrap();
    }));
    let body = |n: u32| json!({"prompt": "Count: one, two,", "max_tokens": 2, "n": n});
    // Five choices are five requests in flight: past the limit of 4, refused at
    // once (it used to count once and hold five sequences).
    let r = post(s.addr, "/v1/completions", &body(5));
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("5 choices"), "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    // Four fit the in-flight limit but never the three waiting places: 429 at
    // once, before any choice ran (it used to run the first, then queue the rest).
    let before = s.state.engine.stats().counters.generation_tokens;
    let r = post(s.addr, "/v1/completions", &body(4));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(s.state.engine.stats().counters.generation_tokens, before);
    // Three fit both.
    let r = post(s.addr, "/v1/completions", &body(3));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 3);
    wait_for("the in-flight count back to 0", 10, || {
        s.state.inflight_limit.current() == 0
    });
}

#[test]
fn past_the_connection_limit_only_probes_answer() {
    let s = TestServer::start(args(|a| a.guard.max_connections = 3));
    let idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    // The server counts a connection once it accepted it.
    std::thread::sleep(Duration::from_millis(200));
    let r = get(s.addr, "/v1/models");
    r.openai_error(503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(get(s.addr, "/health").status, 200);
    assert_eq!(get(s.addr, "/ready").status, 200);
    drop(idle);
    wait_for("connections to close", 10, || {
        get(s.addr, "/v1/models").status == 200
    });
}

#[test]
fn past_the_inflight_limit_requests_get_503_at_once() {
    let s = TestServer::start(args(|a| a.guard.max_inflight_requests = 1));
    let body = json!({"prompt": "Tell a long story", "max_tokens": 300, "ignore_eos": true, "stream": true});
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    assert!(st.next_json().is_some());
    let t0 = Instant::now();
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    );
    let e = r.openai_error(503);
    assert!(e["message"].as_str().unwrap().contains("in flight"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(get(s.addr, "/health").status, 200);
    assert_eq!(get(s.addr, "/metrics").status, 200);
    drop(st);
    wait_for("the slot to free", 20, || {
        post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2}),
        )
        .status
            == 200
    });
}

#[test]
fn slowloris_and_idle_connections_are_closed() {
    let s = TestServer::start(args(|a| {
        a.guard.header_read_timeout = 1.0;
        a.guard.keep_alive_timeout = 1.0;
    }));
    // Headers never finished.
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let t0 = Instant::now();
    let probe = get(s.addr, "/health");
    assert_eq!(probe.status, 200);
    assert!(
        closed_within(&mut slow, 10),
        "slowloris connection still open"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
    // A keep-alive connection that goes idle after one request.
    let mut ka = TcpStream::connect(s.addr).unwrap();
    ka.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = ka.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut ka, 10),
        "idle keep-alive connection still open"
    );
}

#[test]
fn a_request_deadline_ends_it_and_frees_its_blocks() {
    let s = TestServer::start(test_args());
    let body = json!({"prompt": "Count to a thousand:", "max_tokens": 900, "ignore_eos": true});
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-request-timeout-ms", "300")],
        body.to_string().as_bytes(),
    );
    let e = r.openai_error(408);
    assert_eq!(e["code"], "request_timeout");
    wait_for("blocks to be freed", 20, || engine_idle(s.addr));
    // Streaming: the deadline ends the stream with an error event.
    let mut b = body.clone();
    b["stream"] = json!(true);
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-request-timeout-ms", "300")],
        b.to_string().as_bytes(),
    );
    let mut events = Vec::new();
    while let Some(ev) = st.next_event() {
        events.push(ev);
    }
    assert!(
        events.iter().any(|e| e.contains("\"request_timeout\"")),
        "{events:?}"
    );
    wait_for("blocks to be freed", 20, || engine_idle(s.addr));
    let e = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("x-request-timeout-ms", "soon")],
        br#"{"prompt": "Hi", "max_tokens": 1}"#,
    )
    .openai_error(400);
    assert_eq!(e["param"], "x-request-timeout-ms");
}

#[test]
fn a_stalled_stream_reader_is_cancelled_and_its_blocks_freed() {
    let s = TestServer::start(args(|a| a.guard.stream_write_timeout = 1.0));
    // A client with a tiny receive buffer that never reads.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&s.addr.into()).unwrap();
    let mut tcp: TcpStream = sock.into();
    let max_tokens = 700;
    let body = json!({
        "messages": [{"role": "user", "content": "Write a long essay."}],
        "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
        "logprobs": true, "top_logprobs": 20,
    })
    .to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.write_all(body.as_bytes()).unwrap();
    wait_for("the request to start", 20, || {
        metric_sum(&metrics(s.addr), "sloserve:num_requests_running") > 0.0
    });
    wait_for("the stalled stream to be cancelled", 60, || {
        engine_idle(s.addr)
    });
    let generated = metric(&metrics(s.addr), "sloserve:generation_tokens_total").unwrap();
    assert!(
        generated < max_tokens as f64,
        "the stream ran to its end ({generated} tokens) instead of being cancelled"
    );
    drop(tcp);
}

#[test]
fn large_tokenize_bodies_do_not_block_health() {
    let s = TestServer::start(test_args());
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut text = String::with_capacity(4 << 20);
    let mut i = 0usize;
    while text.len() < (4 << 20) - 1024 {
        text.push_str(words[i % words.len()]);
        text.push_str(if i.is_multiple_of(13) { ". " } else { " " });
        i = i.wrapping_mul(31).wrapping_add(7) % 1_000_003;
    }
    let body = json!({"prompt": text}).to_string();
    assert!(body.len() <= 4 << 20);
    let addr = s.addr;
    let t0 = Instant::now();
    let heavy: Vec<_> = (0..2)
        .map(|_| {
            let b = body.clone();
            std::thread::spawn(move || {
                let r = request(addr, "POST", "/tokenize", &[], b.as_bytes());
                (
                    r.status,
                    r.json()["count"].as_u64().unwrap_or(0),
                    Instant::now(),
                )
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while !heavy.iter().all(|h| h.is_finished()) && probes < 50 {
        let p0 = Instant::now();
        assert_eq!(get(addr, "/health").status, 200);
        worst = worst.max(p0.elapsed());
        probes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in heavy {
        let (status, count, _) = h.join().unwrap();
        assert_eq!(status, 200);
        assert!(count > 500_000, "{count}");
    }
    eprintln!(
        "two 4 MiB /tokenize: {:?}; {probes} /health probes meanwhile, worst {worst:?}",
        t0.elapsed()
    );
    // Generous: the bound the issue sets is 100 ms on a quiet machine.
    assert!(worst < Duration::from_secs(1), "/health took {worst:?}");
}

/// A constraint refused for its shape is refused before the prompt is rendered or
/// tokenized (issue #55: the hostile soak's 1,000-`patternProperties` schemas cost
/// the HTTP workers a template and a tokenization each): with a prompt that only
/// tokenizing shows too long, the answer names the schema, not the context.
#[test]
fn a_schema_refused_for_its_shape_costs_no_tokenizing() {
    let s = TestServer::start(test_args());
    let props: serde_json::Map<String, serde_json::Value> = (0..1000)
        .map(|i| (format!("^p{i}_"), json!({"type": "integer"})))
        .collect();
    let schema = json!({"type": "object", "patternProperties": props});
    let long = "hello ".repeat(3000);
    let rf = json!({"type": "json_schema", "json_schema": {"name": "pp", "schema": schema}});
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4,
                   "response_format": rf}),
        ),
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 4, "response_format": rf}),
        ),
    ] {
        let r = post(s.addr, path, &body);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], "response_format", "{path}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains("patternProperties"),
            "{path}: {e}"
        );
        // Without the schema, the same prompt is too long (found by tokenizing).
        let mut plain = body.clone();
        plain.as_object_mut().unwrap().remove("response_format");
        let r = post(s.addr, path, &plain);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(
            r.json()["error"]["code"],
            "context_length_exceeded",
            "{path}"
        );
    }
}
