//! The threaded engine through its public API: concurrent requests, submit-time
//! rejections, admission (429-style), shutdown/drain, cancellation by dropping the
//! stream, abort, and failures.

use std::time::{Duration, Instant};

use super::{prompt, VOCAB};
use crate::config::{ClassLimits, EngineConfig};
use crate::engine::{Engine, EngineHandle};
use crate::error::EngineError;
use crate::event::{Event, FinishReason};
use crate::mock::MockRunner;
use crate::request::{Request, SloClass};
use crate::runner::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};

fn start(blocks: usize, delay: Duration, cfg: EngineConfig) -> EngineHandle {
    let runner = MockRunner::new(blocks, 16, VOCAB, 512).with_delay_per_token(delay);
    Engine::start(Box::new(runner), cfg).unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn concurrent_greedy_requests_match_their_solo_outputs() {
    let engine = start(64, Duration::ZERO, EngineConfig::default());
    let reqs: Vec<(Vec<u32>, usize)> = (0..16u64)
        .map(|i| (prompt(i, 5 + 13 * i as usize), 4 + 3 * i as usize))
        .collect();
    let streams: Vec<_> = reqs
        .iter()
        .map(|(p, m)| engine.submit(Request::greedy(p.clone(), *m)).unwrap())
        .collect();
    let mut total = 0;
    for (s, (p, m)) in streams.into_iter().zip(&reqs) {
        let c = s.collect_blocking();
        assert_eq!(c.tokens, MockRunner::reference(p, *m, VOCAB));
        assert_eq!(c.finish.reason, FinishReason::Length);
        assert_eq!(
            (c.finish.prompt_tokens, c.finish.completion_tokens),
            (p.len(), *m)
        );
        total += m;
    }
    // Stats are published after the step that sent the last Finished.
    wait_for("final stats", || {
        let st = engine.stats();
        st.counters.generation_tokens == total as u64 && st.kv_blocks_used == 0
    });
    assert_eq!(engine.stats().kv_blocks_total, 64);
    assert!(engine.info().num_kv_blocks == 64 && engine.limits().max_prompt_len == 511);
}

#[test]
fn bad_requests_are_rejected_at_submit() {
    let engine = start(8, Duration::ZERO, EngineConfig::default());
    assert_eq!(
        engine.submit(Request::greedy(vec![1; 200], 1)).unwrap_err(),
        EngineError::PromptTooLong { len: 200, max: 128 }
    );
    for req in [
        Request::greedy(vec![1; 100], 500),
        Request::greedy(vec![], 5),
    ] {
        assert!(matches!(
            engine.submit(req),
            Err(EngineError::ContextLengthExceeded { .. } | EngineError::EmptyPrompt)
        ));
    }
    let cfg = EngineConfig {
        max_num_seqs: 0,
        ..Default::default()
    };
    let runner = MockRunner::new(8, 16, VOCAB, 512);
    assert!(matches!(
        Engine::start(Box::new(runner), cfg),
        Err(EngineError::InvalidConfig(_))
    ));
}

#[test]
fn a_full_waiting_queue_refuses_at_once() {
    let mut cfg = EngineConfig {
        max_num_seqs: 1,
        ..Default::default()
    };
    cfg.admission.batch = ClassLimits {
        max_waiting_requests: 2,
        max_waiting_prompt_tokens: 10_000,
    };
    let engine = start(64, Duration::from_micros(500), cfg);
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..10 {
        let req = Request::greedy(prompt(i, 20), 20).with_class(SloClass::Batch);
        match engine.submit(req) {
            Ok(s) => accepted.push(s),
            Err(EngineError::QueueFull {
                class,
                retry_after_s,
            }) => {
                assert_eq!(class, SloClass::Batch);
                assert!(retry_after_s >= 1);
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // A submit that waited for room instead of refusing would end up accepted.
    assert!(refused >= 5, "only {refused} refused");
    // Interactive requests have their own queue.
    accepted.push(engine.submit(Request::greedy(prompt(99, 5), 2)).unwrap());
    for s in accepted {
        assert_eq!(s.collect_blocking().finish.reason, FinishReason::Length);
    }
    assert_eq!(engine.stats().rejected.batch, refused);
}

#[test]
fn a_request_s_choices_are_admitted_together() {
    let mut cfg = EngineConfig {
        max_num_seqs: 1,
        ..Default::default()
    };
    cfg.admission.batch = ClassLimits {
        max_waiting_requests: 4,
        max_waiting_prompt_tokens: 10_000,
    };
    let engine = start(64, Duration::from_micros(200), cfg);
    let req = || Request::greedy(prompt(1, 20), 5).with_class(SloClass::Batch);
    let full = |r| matches!(r, Err(EngineError::QueueFull { .. }));
    // Five choices never fit a queue of four: refused at once, none queued.
    assert!(full(engine.submit_choices(req(), 5).map(|_| ())));
    // Four fit: the first is queued, three held; however far the first got, the
    // held three leave room for one more waiting request, not two.
    let (first, mut rest) = engine.submit_choices(req(), 4).unwrap();
    assert_eq!(rest.left(), 3);
    assert!(full(engine.submit_choices(req(), 2).map(|_| ())));
    let mut streams = vec![first];
    for _ in 0..3 {
        streams.push(engine.submit_reserved(&mut rest, req()).unwrap());
    }
    assert_eq!(rest.left(), 0);
    for s in streams {
        assert_eq!(s.collect_blocking().finish.reason, FinishReason::Length);
    }
    // Held admission never used is released when dropped: four fit again.
    let (s, rest) = engine.submit_choices(req(), 4).unwrap();
    drop(rest);
    s.collect_blocking();
    let (s, _rest) = engine.submit_choices(req(), 4).unwrap();
    s.collect_blocking();
}

#[test]
fn predicted_ttft_over_the_slo_is_refused() {
    // At most ~5000 prefill tokens/s: 400 tokens take >= 80 ms, far over 2 x 1 ms.
    let engine = start(256, Duration::from_micros(200), EngineConfig::default());
    engine
        .submit(Request::greedy(prompt(0, 100), 2))
        .unwrap()
        .collect_blocking();
    assert!(engine.stats().prefill_tokens_per_s > 0.0);
    let long = Request::greedy(prompt(1, 400), 1).with_ttft_slo_ms(1.0);
    assert!(matches!(
        engine.submit(long),
        Err(EngineError::TtftUnreachable { .. })
    ));
    let relaxed = Request::greedy(prompt(1, 400), 1).with_ttft_slo_ms(60_000.0);
    assert!(engine.submit(relaxed).is_ok());
    assert_eq!(engine.stats().rejected.interactive, 1);
}

/// A profile's default TTFT target is a goal, not a contract: a request that gives
/// none is never refused for it (nor shed while it waits), however far over.
#[test]
fn a_default_ttft_target_never_refuses() {
    let cfg = EngineConfig {
        default_ttft_slo_ms: Some(1.0),
        ..EngineConfig::default()
    };
    let engine = start(256, Duration::from_micros(200), cfg);
    engine
        .submit(Request::greedy(prompt(0, 100), 2))
        .unwrap()
        .collect_blocking();
    let long = engine
        .submit(Request::greedy(prompt(1, 400), 1))
        .expect("admitted");
    let done = long.collect_blocking();
    assert!(
        done.finish.slo.ttft_met == Some(false),
        "judged against the default"
    );
    assert_eq!(engine.stats().rejected.interactive, 0);
}

#[test]
fn a_mostly_cached_prompt_is_admitted_where_a_cold_one_is_refused() {
    // ~5000 prefill tokens/s: 420 cold tokens take >= 84 ms, far over 2 x 25 ms;
    // with 400 of them cached (25 blocks of 16) only 20 are left to prefill.
    let engine = start(256, Duration::from_micros(200), EngineConfig::default());
    let shared = prompt(5, 400);
    // Caches the shared prompt; its 40 decode steps bring the step-time average down.
    engine
        .submit(Request::greedy(shared.clone(), 40))
        .unwrap()
        .collect_blocking();
    assert!(engine.stats().prefill_tokens_per_s > 0.0);
    let mut warm = shared.clone();
    warm.extend(prompt(6, 20));
    let cold = prompt(7, 420);
    assert!(matches!(
        engine.submit(Request::greedy(cold, 1).with_ttft_slo_ms(25.0)),
        Err(EngineError::TtftUnreachable { .. })
    ));
    let s = engine
        .submit(Request::greedy(warm, 1).with_ttft_slo_ms(25.0))
        .expect("95% cached: its predicted TTFT is its 20 uncached tokens");
    assert_eq!(s.collect_blocking().finish.cached_prompt_tokens, 400);
    assert_eq!(engine.stats().rejected.interactive, 1);
}

#[test]
fn shutdown_drains_in_flight_requests() {
    let engine = start(64, Duration::from_micros(100), EngineConfig::default());
    let streams: Vec<_> = (0..3)
        .map(|i| engine.submit(Request::greedy(prompt(i, 30), 20)).unwrap())
        .collect();
    engine.shutdown();
    assert!(!engine.is_accepting());
    assert_eq!(
        engine.submit(Request::greedy(vec![1], 1)).unwrap_err(),
        EngineError::EngineStopped
    );
    for s in streams {
        assert_eq!(s.collect_blocking().tokens.len(), 20);
    }
    assert!(engine.wait_stopped(Some(Duration::from_secs(10))));
}

#[test]
fn dropping_the_stream_cancels_and_frees_blocks() {
    let engine = start(64, Duration::from_micros(200), EngineConfig::default());
    let mut s = engine.submit(Request::greedy(prompt(3, 50), 400)).unwrap();
    for _ in 0..3 {
        assert!(matches!(s.blocking_recv(), Some(Event::Token { .. })));
    }
    drop(s);
    wait_for("cancellation", || {
        let st = engine.stats();
        st.counters.requests_cancelled == 1 && st.kv_blocks_used == 0 && st.running.interactive == 0
    });
}

#[test]
fn abort_cancels_everything() {
    let engine = start(64, Duration::from_micros(200), EngineConfig::default());
    let streams: Vec<_> = (0..3)
        .map(|i| engine.submit(Request::greedy(prompt(i, 30), 400)).unwrap())
        .collect();
    engine.abort();
    for s in streams {
        let c = s.collect_blocking();
        assert_eq!(c.finish.reason, FinishReason::Aborted);
        assert!(c.tokens.len() < 400);
    }
}

#[test]
fn handles_and_streams_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<EngineHandle>();
    send::<crate::event::RequestStream>();
    send::<Event>();
}

struct PanickingRunner(RunnerInfo);

impl ModelRunner for PanickingRunner {
    fn info(&self) -> &RunnerInfo {
        &self.0
    }
    fn execute(&mut self, _: &Batch, _: &mut Logits) -> Result<(), RunnerError> {
        panic!("kaboom")
    }
}

#[test]
fn a_runner_that_always_panics_stops_the_engine_after_a_few_restarts() {
    let info = MockRunner::new(8, 16, VOCAB, 512).info().clone();
    let engine = Engine::start(Box::new(PanickingRunner(info)), EngineConfig::default()).unwrap();
    for _ in 0..=crate::supervisor::MAX_PANICS_IN_A_ROW {
        let c = engine
            .submit(Request::greedy(vec![1, 2, 3], 2))
            .unwrap()
            .collect_blocking();
        // A generic message: the panic text is logged, never sent.
        assert_eq!(
            c.finish.reason,
            FinishReason::Error(crate::supervisor::ENGINE_FAILURE.into())
        );
    }
    assert!(engine.wait_stopped(Some(Duration::from_secs(10))));
    assert!(engine.has_failed());
    assert_eq!(
        engine.submit(Request::greedy(vec![1], 1)).unwrap_err(),
        EngineError::EngineStopped
    );
}

/// Time the engine spends idle, blocked for its next command, is not time a queue
/// took to drain: the first request after a pause, which waited only for its step,
/// must not teach admission a drain rate of one request per pause (which then
/// refused a burst of 16 as waiting over 60 s after a 34 s pause).
#[test]
fn an_idle_pause_is_not_counted_as_queue_drain_time() {
    let mut cfg = EngineConfig::default();
    cfg.admission.max_queue_wait_s = 1.0;
    let engine = start(256, Duration::from_millis(1), cfg);
    engine
        .submit(Request::greedy(prompt(0, 8), 2))
        .unwrap()
        .collect_blocking();
    std::thread::sleep(Duration::from_millis(1500));
    let mut running = engine.submit(Request::greedy(prompt(1, 8), 400)).unwrap();
    assert!(matches!(running.blocking_recv(), Some(Event::Token { .. })));
    // A burst while one request decodes: each waits a step or two.
    let burst: Vec<_> = (2..8)
        .map(|i| engine.submit(Request::greedy(prompt(i, 8), 2)))
        .collect();
    for r in burst {
        let s = r.unwrap_or_else(|e| panic!("refused after an idle pause: {e}"));
        assert_eq!(s.collect_blocking().finish.reason, FinishReason::Length);
    }
    assert_eq!(engine.stats().rejected.interactive, 0);
}
