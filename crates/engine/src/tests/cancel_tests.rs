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
    let started = released.batch;
    assert_eq!((started.requests, started.prompt_tokens), (1, 10));
    assert!(
        started.longest_start_wait_s > 0.0,
        "it waited from submit to start"
    );
    core.cancel(2, FinishReason::Aborted);
    assert!(b.done());
    let f = b.finish.as_ref().unwrap();
    assert_eq!(
        (f.reason.clone(), f.completion_tokens),
        (FinishReason::Aborted, 0)
    );
    assert!(f.timings.first_scheduled.is_none());
    assert!(b.tokens.is_empty());
    let ended = core.sched().released().batch.clone();
    assert_eq!((ended.requests, ended.prompt_tokens), (1, 12));
    assert_eq!(ended.longest_start_wait_s, 0.0, "it never started");
    assert_eq!(core.sched().counters().requests_cancelled, 1);
    run_to_idle(&mut core, 100);
    assert!(a.done());
    assert_eq!(a.tokens.len(), 30);
    assert_all_blocks_return(&mut core);
}

#[test]
fn an_interactive_request_waiting_past_twice_the_queue_wait_bound_is_shed() {
    let mut c = cfg(64);
    c.max_num_seqs = 1;
    c.enable_preemption = false; // the interactive request waits behind `a`
    c.admission.max_queue_wait_s = 0.001;
    let (mut core, _) = new_core(c);
    let mut a = submit(&mut core, 1, greedy(prompt(1, 10), 30, SloClass::Batch));
    core.step();
    let mut b = submit(
        &mut core,
        2,
        greedy(prompt(2, 12), 30, SloClass::Interactive),
    );
    let mut q = submit(&mut core, 3, greedy(prompt(3, 14), 30, SloClass::Batch));
    std::thread::sleep(Duration::from_millis(5));
    let left = core.step().released;
    assert!(b.done());
    let f = b.finish.as_ref().unwrap();
    assert_eq!(
        (f.reason.clone(), f.completion_tokens),
        (FinishReason::Shed, 0)
    );
    assert_eq!(
        (left.interactive.requests, left.interactive.prompt_tokens),
        (1, 12)
    );
    // A batch request is never shed for its wait: it queues until it runs.
    assert!(!q.done());
    assert_eq!(core.sched().waiting(SloClass::Batch).len(), 1);
    // A running request is never shed, however long it has been in the engine.
    run_to_idle(&mut core, 200);
    assert!(a.done() && q.done());
    assert_eq!(a.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_eq!(a.tokens.len(), 30);
    assert_eq!(q.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_eq!(core.sched().counters().requests_cancelled, 1);
}

#[test]
fn a_batch_request_still_waiting_at_its_own_deadline_times_out() {
    let mut c = cfg(64);
    c.max_num_seqs = 1;
    let (mut core, _) = new_core(c);
    let mut a = submit(&mut core, 1, greedy(prompt(1, 10), 30, SloClass::Batch));
    let own = greedy(prompt(2, 12), 30, SloClass::Batch).with_deadline(Duration::from_millis(3));
    let mut b = submit(&mut core, 2, own);
    let mut c = submit(&mut core, 3, greedy(prompt(3, 12), 30, SloClass::Batch));
    core.step();
    std::thread::sleep(Duration::from_millis(5));
    let left = core.step().released.batch;
    assert!(b.done() && !c.done());
    let f = b.finish.as_ref().unwrap();
    assert_eq!(
        (f.reason.clone(), f.completion_tokens),
        (FinishReason::TimedOut, 0)
    );
    assert_eq!((left.requests, left.prompt_tokens), (1, 12));
    run_to_idle(&mut core, 200);
    assert!(a.done() && c.done());
    assert_eq!(a.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_eq!(c.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_all_blocks_return(&mut core);
}

#[test]
fn an_interactive_request_past_its_ttft_target_in_the_queue_is_shed() {
    let mut conf = cfg(64);
    conf.max_num_seqs = 1;
    conf.admission.ttft_reject_factor = 0.5;
    let (mut core, _) = new_core(conf);
    let mut a = submit(
        &mut core,
        1,
        greedy(prompt(1, 10), 30, SloClass::Interactive),
    );
    let slow = greedy(prompt(2, 12), 30, SloClass::Interactive).with_ttft_slo_ms(60_000.0);
    let mut b = submit(&mut core, 2, slow);
    let tight = greedy(prompt(3, 12), 30, SloClass::Interactive).with_ttft_slo_ms(8.0);
    let mut c = submit(&mut core, 3, tight);
    core.step();
    std::thread::sleep(Duration::from_millis(5)); // > 8 ms x 0.5
    core.step();
    assert!(c.done());
    assert_eq!(c.finish.as_ref().unwrap().reason, FinishReason::Shed);
    assert!(!b.done(), "within its own target it keeps waiting");
    run_to_idle(&mut core, 200);
    assert!(a.done() && b.done());
    assert_eq!(b.finish.as_ref().unwrap().reason, FinishReason::Length);
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
