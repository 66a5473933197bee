//! The supervised engine through the real server: the model's runner wrapped so
//! that it panics on a marked token. The requests in flight fail (500, OpenAI's
//! shape, a generic message), the engine restarts with its KV blocks free and the
//! next request succeeds; when it cannot restart, `/health` and `/ready` say 503
//! and the server stops with an error (the process exits non-zero).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sloserve_engine::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};
use sloserve_model::LoadedModel;
use sloserve_server::{AppState, ServeArgs};

/// A token id the tests put in a prompt to make the runner panic.
const MARK: u32 = 4242;

struct PanicOnMark {
    inner: Box<dyn ModelRunner>,
    reset_fails: bool,
    resets: Arc<AtomicBool>,
}

impl ModelRunner for PanicOnMark {
    fn info(&self) -> &RunnerInfo {
        self.inner.info()
    }
    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> Result<(), RunnerError> {
        assert!(
            !batch.tokens.contains(&MARK),
            "test runner: marked token {MARK}"
        );
        self.inner.execute(batch, out)
    }
    fn reset(&mut self) -> Result<(), RunnerError> {
        self.resets.store(true, Ordering::Release);
        if self.reset_fails {
            return Err(RunnerError("test runner cannot reset".into()));
        }
        self.inner.reset()
    }
}

fn start(reset_fails: bool) -> (TestServer, Arc<AtomicBool>) {
    let resets = Arc::new(AtomicBool::new(false));
    let r = resets.clone();
    let s = TestServer::start_with(test_args(), move |args: &ServeArgs| {
        let cfg = args.engine_config().unwrap();
        let m = LoadedModel::load(&args.model, &args.runner_options(&cfg)).unwrap();
        let runner = PanicOnMark {
            inner: Box::new(m.runner),
            reset_fails,
            resets: r,
        };
        AppState::from_parts(args, m.tokenizer, m.chat_template, Box::new(runner), cfg).unwrap()
    });
    (s, resets)
}

fn marked() -> serde_json::Value {
    json!({"prompt": [1, 2, 3, MARK, 5], "max_tokens": 4})
}

#[test]
fn a_panic_fails_the_requests_in_flight_and_the_next_one_succeeds() {
    let (s, resets) = start(false);
    let long = json!({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true, "stream": true});
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[],
        long.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    assert!(st.next_json().is_some());
    let r = post(s.addr, "/v1/completions", &marked());
    let e = r.openai_error(500);
    let msg = e["message"].as_str().unwrap();
    assert!(!msg.contains("marked") && !msg.contains("panic"), "{msg}");
    // The stream in flight ends with an error event (then [DONE]).
    let mut events = Vec::new();
    while let Some(ev) = st.next_event() {
        events.push(ev);
    }
    assert!(events.iter().any(|e| e.contains("\"error\"")), "{events:?}");
    assert!(!events.iter().any(|e| e.contains("marked")), "{events:?}");
    // The engine fails the requests in flight first, then resets the runner.
    let t0 = Instant::now();
    while !resets.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(resets.load(Ordering::Acquire));
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(s.addr, "/health").status, 200);
    assert_eq!(get(s.addr, "/ready").status, 200);
    let m = get(s.addr, "/metrics").text();
    assert_eq!(metric(&m, "sloserve:engine_restarts_total"), Some(1.0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(
        &get(s.addr, "/metrics").text(),
        "sloserve:kv_cache_blocks_used",
    ) != Some(0.0)
    {
        assert!(Instant::now() < deadline, "KV blocks still held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_engine_that_cannot_restart_makes_health_503_and_the_server_exit_with_an_error() {
    let (s, _) = start(true);
    post(s.addr, "/v1/completions", &marked()).openai_error(500);
    let deadline = Instant::now() + Duration::from_secs(10);
    // The server shuts itself down; /health says 503 until the listener closes.
    let r = s.wait(Duration::from_secs(30));
    let e = r.expect_err("the server must stop with an error");
    assert!(e.contains("engine failed"), "{e}");
    assert!(Instant::now() < deadline + Duration::from_secs(30));
    assert!(s.state.engine.has_failed());
}

#[test]
fn health_says_503_once_the_engine_failed() {
    // Checked on the handler directly: the listener may already be closing.
    let (s, _) = start(true);
    post(s.addr, "/v1/completions", &marked()).openai_error(500);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.state.engine.has_failed() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let st = axum::extract::State(s.state.clone());
        assert_eq!(
            sloserve_server::routes::health(st.clone()).await.status(),
            503
        );
        assert_eq!(sloserve_server::routes::ready(st).await.status(), 503);
    });
}
