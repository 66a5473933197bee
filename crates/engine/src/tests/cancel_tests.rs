//! Ending one request with a reason (`cancel`, as the server does on a stop string):
//! running or waiting, step-driven and through the threaded engine.

use std::time::Duration;

use super::*;
use crate::engine::Engine;
use crate::event::FinishReason;
use crate::mock::MockRunner;

#[test]
fn cancelling_a_running_request_finishes_it_with_the_reason_and_timings() {
    let (mut core, _) = new_core(cfg(64));
    let p = prompt(1, 20);
    let mut a = submit(&mut core, 1, greedy(p.clone(), 50, SloClass::Interactive));
    let mut b = submit(
        &mut core,
        2,
        greedy(prompt(2, 10), 8, SloClass::Interactive),
    );
    for _ in 0..4 {
        core.step();
    }
    a.poll();
    let got = a.tokens.len();
    assert!(got > 0 && a.finish.is_none());
    core.cancel(1, FinishReason::StopString);
    // `Finished` comes at once, not at the next step.
    assert!(a.done());
    let f = a.finish.clone().unwrap();
    assert_eq!(f.reason, FinishReason::StopString);
    assert_eq!((f.prompt_tokens, f.completion_tokens), (20, got));
    let t = &f.timings;
    assert!(t.queue_time().is_some() && t.prefill_time().is_some() && t.e2e().is_some());
    assert_eq!(a.tokens, MockRunner::reference(&p, got, VOCAB));
    assert_eq!(core.sched().counters().requests_finished_stop, 1);
    // The other request is untouched; a late cancel of a finished one does nothing.
    run_to_idle(&mut core, 100);
    assert!(b.done());
    assert_eq!(b.finish.as_ref().unwrap().reason, FinishReason::Length);
    core.cancel(1, FinishReason::StopString);
    core.cancel(2, FinishReason::StopString);
    a.poll();
    b.poll();
    assert_eq!(b.tokens.len(), 8);
    assert_all_blocks_return(&mut core);
}

#[test]
fn cancelling_a_waiting_request_removes_it_from_its_queue() {
    let mut c = cfg(64);
    c.max_num_seqs = 1;
    let (mut core, _) = new_core(c);
    let mut a = submit(&mut core, 1, greedy(prompt(1, 10), 30, SloClass::Batch));
    let mut b = submit(&mut core, 2, greedy(prompt(2, 12), 30, SloClass::Batch));
    let released = core.step().released;
    assert_eq!(core.sched().waiting(SloClass::Batch).len(), 1);
    // `a` left the not-yet-started queue when it started; now `b` leaves it too.
    assert_eq!(released.batch, (1, 10));
    core.cancel(2, FinishReason::Aborted);
    assert!(b.done());
    let f = b.finish.as_ref().unwrap();
    assert_eq!(
        (f.reason.clone(), f.completion_tokens),
        (FinishReason::Aborted, 0)
    );
    assert!(f.timings.first_scheduled.is_none());
    assert!(b.tokens.is_empty());
    assert_eq!(core.sched().released().batch, (1, 12));
    assert_eq!(core.sched().counters().requests_cancelled, 1);
    run_to_idle(&mut core, 100);
    assert!(a.done());
    assert_eq!(a.tokens.len(), 30);
    assert_all_blocks_return(&mut core);
}

#[test]
fn handle_cancel_ends_the_stream_promptly_with_engine_counts() {
    let runner =
        MockRunner::new(64, 16, VOCAB, 512).with_delay_per_token(Duration::from_micros(300));
    let engine = Engine::start(Box::new(runner), EngineConfig::default()).unwrap();
    let mut s = engine.submit(Request::greedy(prompt(5, 40), 400)).unwrap();
    let mut seen = 0;
    while seen < 3 {
        if let Some(Event::Token { .. }) = s.blocking_recv() {
            seen += 1;
        }
    }
    engine.cancel(s.id(), FinishReason::StopString);
    let c = s.collect_blocking();
    assert_eq!(c.finish.reason, FinishReason::StopString);
    assert_eq!(c.finish.completion_tokens, seen + c.tokens.len());
    assert!(c.finish.completion_tokens < 400);
    assert!(c.finish.timings.queue_time().is_some());
}
