//! The supervised engine thread: a panic fails only the requests in flight, the
//! engine restarts with every KV block free and serves again; a failed restart
//! stops it for good (`has_failed`).

use std::time::{Duration, Instant};

use super::{prompt, VOCAB};
use crate::config::EngineConfig;
use crate::engine::{Engine, EngineHandle};
use crate::error::EngineError;
use crate::event::FinishReason;
use crate::mock::MockRunner;
use crate::request::Request;
use crate::supervisor::ENGINE_FAILURE;

/// A token no test prompt holds: a request carrying it makes the runner panic.
const MARK: u32 = VOCAB as u32 - 1;

fn unmarked(seed: u64, len: usize) -> Vec<u32> {
    prompt(seed, len).into_iter().map(|t| t % MARK).collect()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn start(runner: MockRunner) -> EngineHandle {
    Engine::start(Box::new(runner), EngineConfig::default()).unwrap()
}

#[test]
fn a_panic_fails_the_requests_in_flight_and_the_engine_restarts_clean() {
    let runner = MockRunner::new(64, 16, VOCAB, 512)
        .with_panic_on_token(MARK)
        .with_delay_per_token(Duration::from_micros(200));
    let engine = start(runner);
    // A request that finishes before the marked one arrives is untouched.
    let early = unmarked(1, 40);
    let c = engine
        .submit(Request::greedy(early.clone(), 8))
        .unwrap()
        .collect_blocking();
    assert_eq!(c.tokens, MockRunner::reference(&early, 8, VOCAB));
    // A long request in flight, then the marked one: the step holding it panics.
    let long = engine
        .submit(Request::greedy(unmarked(2, 30), 400))
        .unwrap();
    let mut marked = unmarked(3, 20);
    marked[7] = MARK;
    let bad = engine.submit(Request::greedy(marked, 4)).unwrap();
    for c in [bad.collect_blocking(), long.collect_blocking()] {
        assert_eq!(c.finish.reason, FinishReason::Error(ENGINE_FAILURE.into()));
    }
    // Served again, from an empty pool and cache (the early prompt is not cached).
    let again = engine
        .submit(Request::greedy(early.clone(), 8))
        .unwrap()
        .collect_blocking();
    assert_eq!(again.tokens, MockRunner::reference(&early, 8, VOCAB));
    assert_eq!(again.finish.cached_prompt_tokens, 0);
    wait_for("stats after the restart", || {
        let st = engine.stats();
        st.engine_restarts == 1 && st.kv_blocks_used == 0 && st.running.iter().all(|(_, n)| *n == 0)
    });
    let st = engine.stats();
    assert_eq!(st.waiting.iter().map(|(_, n)| *n).sum::<usize>(), 0);
    // Counters carried over the restart: the early requests' tokens still count.
    assert!(st.counters.generation_tokens >= 16, "{:?}", st.counters);
    assert!(engine.is_accepting() && !engine.has_failed());
    engine.shutdown();
    assert!(engine.wait_stopped(Some(Duration::from_secs(10))));
}

#[test]
fn a_failed_restart_stops_the_engine_for_good() {
    let runner = MockRunner::new(64, 16, VOCAB, 512)
        .with_panic_on_token(MARK)
        .with_reset_failure();
    let engine = start(runner);
    let c = engine
        .submit(Request::greedy(vec![1, MARK, 2], 4))
        .unwrap()
        .collect_blocking();
    assert_eq!(c.finish.reason, FinishReason::Error(ENGINE_FAILURE.into()));
    assert!(engine.wait_stopped(Some(Duration::from_secs(10))));
    assert!(engine.has_failed() && !engine.is_accepting());
    assert_eq!(
        engine.submit(Request::greedy(vec![1], 1)).unwrap_err(),
        EngineError::EngineStopped
    );
}
