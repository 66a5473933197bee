//! Server lifecycle with the real model, each test on its own server: a flood is
//! refused with 429 + Retry-After at once, a client that disconnects mid-stream
//! frees its KV blocks, and shutdown drains (503 for new work, in-flight requests
//! finish) or, past its deadline, aborts and exits.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

fn metrics(s: &TestServer) -> String {
    get(s.addr, "/metrics").text()
}

#[test]
fn flood_is_refused_with_429_and_retry_after() {
    let mut a = test_args();
    a.engine.set("max-num-seqs", "1").unwrap();
    a.engine.set("max-num-batched-tokens", "64").unwrap();
    a.engine.set("max-waiting-requests", "2").unwrap();
    let s = TestServer::start(a);
    let addr = s.addr;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("Request {i}: tell a story"), "max_tokens": 16,
                    "ignore_eos": true, "slo_class": "batch"});
                let t = Instant::now();
                (
                    request(
                        addr,
                        "POST",
                        "/v1/completions",
                        &[],
                        body.to_string().as_bytes(),
                    ),
                    t.elapsed(),
                )
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|(r, _)| r.status == 200).count();
    let refused: Vec<_> = results.iter().filter(|(r, _)| r.status == 429).collect();
    assert_eq!(ok + refused.len(), 12, "only 200s and 429s");
    assert!(ok >= 1, "some requests are served");
    assert!(!refused.is_empty(), "a flood beyond the queue is refused");
    for (r, took) in &refused {
        let e = r.openai_error(429);
        assert_eq!(e["code"], "rate_limit_exceeded");
        let retry: u64 = r
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry));
        assert!(
            *took < Duration::from_secs(5),
            "refused at once, not queued ({took:?})"
        );
    }
    let m = metrics(&s);
    let rejected = metric_sum(&m, "sloserve:requests_rejected_total{");
    assert_eq!(rejected as usize, refused.len());
    eprintln!(
        "flood: {ok} served, {} refused in {:?}",
        refused.len(),
        t0.elapsed()
    );
}

#[test]
fn disconnect_mid_stream_frees_kv_blocks() {
    let s = TestServer::start(test_args());
    let body = json!({"prompt": "Write a very long essay about the sea.", "max_tokens": 500,
        "ignore_eos": true, "stream": true});
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    for _ in 0..3 {
        st.next_json().expect("a chunk");
    }
    let m = metrics(&s);
    assert_eq!(metric_sum(&m, "sloserve:num_requests_running{"), 1.0);
    assert!(metric(&m, "vllm:kv_cache_usage_perc{").unwrap() > 0.0);
    drop(st);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(&s);
        let running = metric_sum(&m, "sloserve:num_requests_running{");
        let kv = metric(&m, "sloserve:kv_cache_usage_perc{").unwrap();
        let vkv = metric(&m, "vllm:kv_cache_usage_perc{").unwrap();
        if running == 0.0 && kv == 0.0 && vkv == 0.0 {
            let generated = metric(&m, "sloserve:generation_tokens_total{").unwrap();
            assert!(
                generated < 500.0,
                "the request was cancelled, not run to the end ({generated})"
            );
            assert_eq!(
                metric(&m, "sloserve:request_success_total{model_name=\"smol\",slo_class=\"interactive\",finished_reason=\"abort\"}"),
                Some(1.0)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks not freed: running {running}, kv {kv}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.state.inflight(), 0);

    // A non-streaming request whose client goes away is cancelled too.
    let before = metric(&metrics(&s), "sloserve:generation_tokens_total{").unwrap();
    let mut body = body.clone();
    body["stream"] = json!(false);
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    let b = body.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    std::io::Write::write_all(&mut c, head.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric_sum(&metrics(&s), "sloserve:num_requests_running{") == 0.0 {
        assert!(Instant::now() < deadline, "request never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(&s);
        if metric_sum(&m, "sloserve:num_requests_running{") == 0.0 && s.state.inflight() == 0 {
            let generated = metric(&m, "sloserve:generation_tokens_total{").unwrap() - before;
            assert!(
                generated < 500.0,
                "cancelled, not run to the end ({generated})"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "non-streaming request not cancelled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn shutdown_drains_in_flight_requests_then_exits() {
    let s = TestServer::start(test_args());
    let addr = s.addr;
    let body = json!({"messages": [{"role": "user", "content": "Tell me about the moon."}],
        "max_tokens": 48, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}});
    let mut st = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    st.next_json().expect("role chunk");
    st.next_json().expect("first token");
    s.shutdown();
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(addr, "/ready").status == 200 {
        assert!(Instant::now() < deadline, "/ready never turned 503");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(get(addr, "/ready").status, 503);
    assert_eq!(get(addr, "/health").status, 200);
    let e = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    )
    .openai_error(503);
    assert_eq!(e["code"], "service_unavailable");
    // The in-flight request runs to its end.
    let mut usage = None;
    let mut finish = None;
    while let Some(v) = st.next_json() {
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
    }
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(usage.unwrap()["completion_tokens"], 48);
    s.wait(Duration::from_secs(20)).expect("clean exit");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed"
    );
}

#[test]
fn shutdown_past_its_deadline_aborts_and_exits() {
    let mut a = test_args();
    a.shutdown_timeout = 0.3;
    let s = TestServer::start(a);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": true, "stream": true});
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    st.next_json().expect("first token");
    let t0 = Instant::now();
    s.shutdown();
    s.wait(Duration::from_secs(20)).expect("clean exit");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // The stream ended with an error event (aborted) and [DONE], not a hang.
    let rest = String::from_utf8(st.read_all()).unwrap();
    assert!(
        rest.contains("\"error\"") && rest.ends_with("data: [DONE]\n\n"),
        "{rest}"
    );
}
