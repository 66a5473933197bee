//! A real replica killed mid-load: its requests that had not started streaming
//! succeed on the other replica (retried before their first byte), the one that
//! was streaming ends with an error event, the replica is ejected, and it is
//! re-admitted once it serves again on the same port.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use serde_json::json;
use sloserve_router::{Policy, RouterConfig};

/// How a streamed request ended, and which replica answered it.
#[derive(Debug)]
struct Outcome {
    backend: String,
    events: usize,
    error: bool,
    done: bool,
}

fn stream(addr: std::net::SocketAddr, started: mpsc::Sender<String>) -> Outcome {
    // Long enough that the kill, sent once the first token arrives, always lands
    // mid-stream (with 24 tokens the stream on A sometimes finished first on CI).
    let b = json!({"prompt": "Tell me a long story about a dragon.", "max_tokens": 128,
                   "ignore_eos": true, "stream": true, "temperature": 0});
    let mut s = send(
        addr,
        "POST",
        "/v1/completions",
        &[],
        b.to_string().as_bytes(),
    );
    assert_eq!(s.status, 200, "every request gets an answer");
    let backend = s.header("x-sloserve-backend").unwrap().to_owned();
    let mut o = Outcome {
        backend: backend.clone(),
        events: 0,
        error: false,
        done: false,
    };
    let mut started = Some(started);
    while let Some(ev) = s.next_event() {
        // Streaming: its first token has arrived.
        if let Some(tx) = started.take() {
            let _ = tx.send(backend.clone());
        }
        let data = ev.strip_prefix("data: ").unwrap_or(&ev).to_owned();
        if data == "[DONE]" {
            o.done = true;
        } else if data.starts_with("{\"error\"") {
            o.error = true;
        } else {
            o.events += 1;
        }
    }
    o
}

#[test]
fn killed_replica_requests_fail_over_then_it_is_readmitted() {
    // One sequence at a time per replica: the rest of its requests wait unstarted.
    let mut args = replica_args("interactive");
    args.engine.set("max-num-seqs", "1").unwrap();
    // Every token its own step, so a stream's length in time is predictable.
    args.engine.set("spec-max-draft", "0").unwrap();
    let mut a = Replica::start(args.clone(), 0);
    let b = Replica::start(args.clone(), 0);
    let (a_url, b_url) = (a.url(), b.url());
    let mut cfg =
        RouterConfig::with_fleets(&[("interactive", &[a_url.clone(), b_url.clone()])]).unwrap();
    cfg.policy = Policy::LeastWork;
    cfg.health_interval = Duration::from_millis(200);
    let router = TestRouter::start(cfg);
    let addr = router.addr;

    // Six streams, spread three and three by least outstanding work.
    let (tx, rx) = mpsc::channel();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let tx = tx.clone();
            let c = std::thread::spawn(move || stream(addr, tx));
            std::thread::sleep(Duration::from_millis(30));
            c
        })
        .collect();
    // Kill A as soon as one of its requests has streamed a token.
    loop {
        let backend = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a stream starts");
        if backend == a_url {
            break;
        }
    }
    a.kill();
    let outcomes: Vec<Outcome> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    eprintln!("{outcomes:#?}");
    let broken: Vec<_> = outcomes.iter().filter(|o| o.error).collect();
    assert!(
        !broken.is_empty(),
        "the stream running on A ends with an error event"
    );
    for o in &broken {
        assert_eq!(o.backend, a_url);
        assert!(o.events >= 1, "it had started: {o:?}");
    }
    let ok = outcomes.iter().filter(|o| !o.error).count();
    assert_eq!(ok + broken.len(), 6);
    for o in outcomes.iter().filter(|o| !o.error) {
        assert!(o.done && o.events >= 12, "finished whole: {o:?}");
    }
    // A's queued requests (max_num_seqs 1) had not started: they finished on B.
    assert!(
        outcomes.iter().filter(|o| o.backend == b_url).count() >= 4,
        "{outcomes:#?}"
    );
    assert!(
        metric(
            &router.metrics(),
            "sloserve_router:retries_total{fleet=\"interactive\"}"
        )
        .unwrap()
            >= 1.0
    );
    assert_eq!(router.backend_metric("backend_healthy", &a_url), 0.0);
    assert!(router.backend_metric("backend_ejections_total", &a_url) >= 1.0);

    // A comes back on its port: re-admitted by the active checks, then used.
    let port = a.addr.port();
    let a2 = Replica::start(args, port);
    assert!(
        wait_until(30.0, || router.backend_metric("backend_healthy", &a_url)
            == 1.0),
        "A re-admitted"
    );
    let before = router.backend_metric("backend_requests_total", &a_url);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-sloserve-backend"),
        Some(a_url.as_str()),
        "idle A is first again"
    );
    assert_eq!(
        router.backend_metric("backend_requests_total", &a_url),
        before + 1.0
    );
    drop(a2);
}
