//! Batch work is queued, not refused, for latency (issue #33 item 1): through the
//! threaded engine, a batch request whose predicted wait is far past any bound is
//! admitted and runs; it is refused only past its queue bound or its own
//! deadline, while interactive admission refuses for predicted latency as before.

use std::time::Duration;

use super::{prompt, VOCAB};
use crate::config::{AdmissionConfig, ClassLimits, EngineConfig};
use crate::engine::{Engine, EngineHandle};
use crate::error::EngineError;
use crate::event::{Event, FinishReason, RequestStream};
use crate::mock::MockRunner;
use crate::request::{Request, SloClass};

fn batch(seed: u64, len: usize) -> Request {
    Request::greedy(prompt(seed, len), 2).with_class(SloClass::Batch)
}

/// A threaded engine with one sequence slot (no preemption) whose prefill rate
/// is measured (about 2000 tokens/s: every 300-token prompt waiting ahead is
/// ~0.15 s of wait), and a long batch request holding the slot, already started
/// (two tokens: the step that started it released it from the queue), so every
/// request after it waits. `admission` adjusts the limits.
pub(super) fn one_slot_held(
    admission: impl FnOnce(&mut AdmissionConfig),
) -> (EngineHandle, RequestStream) {
    let mut cfg = EngineConfig {
        max_num_seqs: 1,
        enable_preemption: false,
        ..Default::default()
    };
    admission(&mut cfg.admission);
    let runner =
        MockRunner::new(256, 16, VOCAB, 512).with_delay_per_token(Duration::from_micros(500));
    let engine = Engine::start(Box::new(runner), cfg).unwrap();
    engine
        .submit(Request::greedy(prompt(0, 100), 2))
        .unwrap()
        .collect_blocking();
    assert!(engine.stats().prefill_tokens_per_s > 0.0);
    let mut occupant = engine
        .submit(Request::greedy(prompt(1, 8), 480).with_class(SloClass::Batch))
        .unwrap();
    for _ in 0..2 {
        assert!(matches!(
            occupant.blocking_recv(),
            Some(Event::Token { .. })
        ));
    }
    (engine, occupant)
}

#[test]
fn batch_requests_queue_past_any_latency_bound_and_are_refused_only_by_bound_or_deadline() {
    let (engine, occupant) = one_slot_held(|a| {
        a.max_queue_wait_s = 0.05;
        a.ttft_reject_factor = 1.0;
        a.batch = ClassLimits {
            max_waiting_requests: 11,
            max_waiting_prompt_tokens: 1 << 20,
        };
    });

    // Interactive admission as before: the second one would wait > 0.05 s.
    let first = engine.submit(Request::greedy(prompt(2, 300), 2)).unwrap();
    match engine.submit(Request::greedy(prompt(3, 300), 2)) {
        Err(EngineError::QueueWaitTooLong {
            class: SloClass::Interactive,
            predicted_s,
            ..
        }) => assert!(predicted_s > 0.05, "{predicted_s}"),
        other => panic!("{:?}", other.map(|s| s.id())),
    }
    // Batch: predicted waits of 0.15 s to 1.6 s, far past 0.05 s, all queued.
    let mut queued: Vec<_> = (0..10)
        .map(|i| {
            engine
                .submit(batch(10 + i, 300))
                .unwrap_or_else(|e| panic!("batch request {i} refused: {e}"))
        })
        .collect();
    // Its own deadline, shorter than the predicted wait: refused, and said so.
    let own = batch(30, 300).with_deadline(Duration::from_millis(10));
    match engine.submit(own) {
        Err(e @ EngineError::DeadlineUnreachable { .. }) => {
            let EngineError::DeadlineUnreachable {
                class,
                predicted_s,
                deadline_s,
                retry_after_s,
            } = e
            else {
                unreachable!()
            };
            assert_eq!(class, SloClass::Batch);
            assert!(predicted_s > 1.0 && deadline_s == 0.01, "{predicted_s}");
            assert!(retry_after_s >= 2);
        }
        other => panic!("{:?}", other.map(|s| s.id())),
    }
    // A deadline it can meet: queued.
    queued.push(
        engine
            .submit(batch(31, 300).with_deadline(Duration::from_secs(600)))
            .unwrap(),
    );
    // The queue bound (11 waiting) is the one limit on how much may wait.
    assert!(matches!(
        engine.submit(batch(32, 300)),
        Err(EngineError::QueueFull {
            class: SloClass::Batch,
            ..
        })
    ));

    // The interactive one is shed after twice `max_queue_wait_s` behind the
    // occupant (~0.24 s); the batch ones, waiting far longer, all run.
    assert_eq!(first.collect_blocking().finish.reason, FinishReason::Shed);
    for s in queued {
        let c = s.collect_blocking();
        assert_eq!((c.finish.reason, c.tokens.len()), (FinishReason::Length, 2));
    }
    assert_eq!(
        occupant.collect_blocking().finish.reason,
        FinishReason::Length
    );
    let rejected = engine.stats().rejected;
    assert_eq!((rejected.interactive, rejected.batch), (1, 2));
}
