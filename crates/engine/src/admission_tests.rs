//! Admission's unit tests: queue bounds, interactive latency refusals, batch
//! requests queued whatever their predicted wait, refused only past the bound or
//! their own deadline.

use super::*;
use crate::config::{ClassLimits, EngineConfig};
use crate::request::SloTargets;

#[test]
fn validation_errors_are_specific() {
    let l = RequestLimits::new(100, 4, 16, 50);
    assert_eq!(l.max_prompt_len, 64);
    let ok = Request::greedy(vec![1; 10], 5);
    assert_eq!(l.validate(&ok), Ok(5));
    let mut fill = ok.clone();
    fill.stop.max_tokens = None;
    assert_eq!(l.validate(&fill), Ok(90), "None: what the context leaves");
    assert_eq!(
        l.validate(&Request::greedy(vec![1; 65], 1)),
        Err(EngineError::PromptTooLong { len: 65, max: 64 })
    );
    for (bad, want) in [
        (Request::greedy(vec![], 5), EngineError::EmptyPrompt),
        (Request::greedy(vec![1; 10], 0), EngineError::ZeroMaxTokens),
        (
            Request::greedy(vec![1; 60], 41),
            EngineError::ContextLengthExceeded {
                prompt: 60,
                max_tokens: 41,
                max_model_len: 100,
                room: 40,
            },
        ),
        (
            Request::greedy(vec![50], 1),
            EngineError::TokenOutOfVocab {
                id: 50,
                vocab_size: 50,
            },
        ),
        (
            Request::greedy(vec![1], 1).with_ttft_slo_ms(0.0),
            EngineError::InvalidTarget {
                field: "ttft_slo_ms",
            },
        ),
        (
            Request::greedy(vec![1], 1).with_tpot_slo_ms(f64::NAN),
            EngineError::InvalidTarget {
                field: "tpot_slo_ms",
            },
        ),
    ] {
        assert_eq!(l.validate(&bad), Err(want));
    }
}

#[test]
fn decide_resolves_class_and_targets_once() {
    let l = RequestLimits::new(100, 8, 16, 50);
    let mut cfg = EngineConfig {
        default_ttft_slo_ms: Some(500.0),
        ..EngineConfig::default()
    };
    let r = Request::greedy(vec![1; 4], 3).with_tpot_slo_ms(40.0);
    let a = l.decide(&cfg, &r).unwrap();
    assert_eq!(a.class, SloClass::Interactive);
    assert_eq!(a.targets.ttft_ms, Some(500.0));
    assert_eq!(a.targets.tpot_ms, Some(40.0));
    assert_eq!(
        a.refuse_ttft_ms, None,
        "a profile's default target never refuses"
    );
    let own = l.decide(&cfg, &r.clone().with_ttft_slo_ms(300.0)).unwrap();
    assert_eq!(own.refuse_ttft_ms, Some(300.0));
    assert_eq!(a.max_tokens, 3);
    let b = l
        .decide(&cfg, &r.clone().with_class(SloClass::Batch))
        .unwrap();
    assert_eq!(b.class, SloClass::Batch);
    assert_eq!(b.targets, SloTargets::default(), "batch has no targets");
    // The gateway's objective maps to a class; a class named outright wins.
    cfg.objectives.insert("offline".into(), SloClass::Batch);
    let mut o = Request::greedy(vec![1; 4], 3);
    o.slo.objective = Some("offline".into());
    assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Batch);
    o.slo.objective = Some("unknown".into());
    assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Interactive);
    o.slo.objective = Some("offline".into());
    o.slo.class = Some(SloClass::Interactive);
    assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Interactive);
    cfg.slo_classes = false;
    cfg.default_slo_class = SloClass::Batch;
    let c = l
        .decide(&cfg, &r.with_class(SloClass::Interactive))
        .unwrap();
    assert_eq!(c.class, SloClass::Batch, "classes off: the default class");
}

#[test]
fn bounded_queue_and_ttft_refusal() {
    let mut cfg = EngineConfig::default().admission;
    cfg.ttft_reject_factor = 1.0;
    cfg.batch = ClassLimits {
        max_waiting_requests: 2,
        max_waiting_prompt_tokens: 100,
    };
    let mut a = AdmissionState::default();
    a.try_admit(&cfg, SloClass::Batch, 10, None, None).unwrap();
    a.try_admit(&cfg, SloClass::Batch, 10, None, None).unwrap();
    assert!(matches!(
        a.try_admit(&cfg, SloClass::Batch, 10, None, None),
        Err(EngineError::QueueFull {
            class: SloClass::Batch,
            ..
        })
    ));
    a.release(SloClass::Batch, FlowKey::of(""), 1, 10);
    assert!(a.try_admit(&cfg, SloClass::Batch, 91, None, None).is_err()); // 10 + 91 > 100 tokens
    a.try_admit(&cfg, SloClass::Batch, 90, None, None).unwrap();
    assert_eq!(a.rejected.batch, 2);

    // 1000 tok/s; 900 interactive tokens waiting: +200 => 1.1 s predicted.
    a.observe_prefill(1000, 1.0);
    a.try_admit(&cfg, SloClass::Interactive, 900, None, None)
        .unwrap();
    assert!(a
        .try_admit(&cfg, SloClass::Interactive, 200, Some(500.0), None)
        .is_err()); // 1100 > 1000
    a.try_admit(&cfg, SloClass::Interactive, 200, Some(1100.0), None)
        .unwrap(); // 1100 <= 1100
    match a.try_admit(&cfg, SloClass::Interactive, 10, Some(1.0), None) {
        Err(EngineError::TtftUnreachable { retry_after_s, .. }) => assert_eq!(retry_after_s, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn queue_waits_come_from_the_measured_drain_rate() {
    let cfg = AdmissionConfig {
        max_queue_wait_s: 3.0,
        ttft_reject_factor: 1.0,
        ..EngineConfig::default().admission
    };
    let mut a = AdmissionState::default();
    // Unmeasured: only the queue bounds apply.
    for _ in 0..8 {
        a.try_admit(&cfg, SloClass::Batch, 1, None, None).unwrap();
        a.try_admit(&cfg, SloClass::Interactive, 1, Some(2000.0), None)
            .unwrap();
    }
    // Both queues drain at 2 requests per second of backlogged engine time.
    let step = PerClass {
        interactive: exits(1, 0.0),
        batch: exits(1, 0.0),
    };
    let open = AdmissionConfig {
        max_queue_wait_s: 0.0,
        ..cfg.clone()
    };
    let t0 = Instant::now();
    let at = |s: f64| t0 + std::time::Duration::from_secs_f64(s);
    for i in 0..4 {
        a.observe_step(&step, 0.5, at(0.5 * (i + 1) as f64));
        a.try_admit(&open, SloClass::Batch, 1, None, None).unwrap();
        a.try_admit(&open, SloClass::Interactive, 1, Some(60_000.0), None)
            .unwrap();
    }
    assert_eq!(a.waiting_requests.batch, 8);
    assert!((a.predicted_wait_s(SloClass::Batch) - 4.5).abs() < 1e-9);
    // 8 ahead at 2/s: it starts at the 9th departure, in 4.5 s: over 3 s, an
    // interactive request is refused for it; a batch request queues.
    assert!((a.predicted_wait_s(SloClass::Interactive) - 4.5).abs() < 1e-9);
    match a.try_admit(&cfg, SloClass::Interactive, 1, None, None) {
        Err(EngineError::QueueWaitTooLong {
            class: SloClass::Interactive,
            predicted_s,
            retry_after_s: 5,
        }) => assert!((predicted_s - 4.5).abs() < 1e-9),
        other => panic!("{other:?}"),
    }
    a.try_admit(&cfg, SloClass::Batch, 1, None, None).unwrap();
    // With a deadline of its own, a batch request is refused only when it would
    // start after it: 9 ahead, the 10th departure in 5 s.
    match a.try_admit(&cfg, SloClass::Batch, 1, None, Some(4.0)) {
        Err(EngineError::DeadlineUnreachable {
            class: SloClass::Batch,
            predicted_s,
            deadline_s,
            retry_after_s: 5,
        }) => assert!((predicted_s - 5.0).abs() < 1e-9 && deadline_s == 4.0),
        other => panic!("{other:?}"),
    }
    a.try_admit(&cfg, SloClass::Batch, 1, None, Some(5.5))
        .unwrap();
    assert_eq!(a.waiting_requests.batch, 10);
    match a.try_admit(&open, SloClass::Interactive, 1, Some(2000.0), None) {
        Err(EngineError::TtftUnreachable { predicted_ms, .. }) => {
            assert!((predicted_ms - 5000.0).abs() < 1e-6, "{predicted_ms}")
        }
        other => panic!("{other:?}"),
    }
    // Drained to 4 waiting: 2.5 s to start, 3 s to the first token.
    a.release(SloClass::Interactive, FlowKey::of(""), 4, 4);
    assert!(a
        .try_admit(&cfg, SloClass::Interactive, 1, Some(2900.0), None)
        .is_err());
    a.try_admit(&cfg, SloClass::Interactive, 1, Some(3100.0), None)
        .unwrap();
    // A queue that stops draining predicts ever longer waits.
    let none = PerClass::default();
    for i in 0..100 {
        a.observe_step(&none, 0.1, at(2.5 + 0.5 * i as f64));
    }
    assert!(a.predicted_wait_s(SloClass::Batch) > 1000.0);
    assert!(a
        .try_admit(&cfg, SloClass::Interactive, 1, None, None)
        .is_err());
    // A batch request queues however long the wait, unless past its deadline.
    a.try_admit(&cfg, SloClass::Batch, 1, None, None).unwrap();
    assert!(matches!(
        a.try_admit(&cfg, SloClass::Batch, 1, None, Some(3600.0)),
        Err(EngineError::DeadlineUnreachable { .. })
    ));
    // An empty queue is always admitted, whatever the rate or deadline.
    a.release(SloClass::Batch, FlowKey::of(""), 11, 11);
    a.try_admit(&cfg, SloClass::Batch, 1, None, Some(0.001))
        .unwrap();
    assert_eq!(a.rejected.batch, 2, "only for their own deadlines");
    // Idle time between steps is not drain time.
    a.mark_idle();
    a.observe_step(&step, 0.5, at(1000.0));
    assert!(a.predicted_wait_s(SloClass::Batch) < 1.0);
}

fn exits(requests: usize, longest_start_wait_s: f64) -> QueueExits {
    QueueExits {
        requests,
        prompt_tokens: requests,
        longest_start_wait_s,
        flows: vec![FlowKey::of(""); requests],
    }
}

#[test]
fn long_prompts_ahead_drain_at_the_measured_token_rate() {
    let cfg = EngineConfig::default().admission;
    let mut a = AdmissionState::default();
    let t0 = Instant::now();
    a.try_admit(&cfg, SloClass::Batch, 100, None, None).unwrap();
    // One request of 100 prompt tokens leaves every 0.5 s: 2/s, 200 tokens/s.
    let left = PerClass {
        interactive: exits(0, 0.0),
        batch: QueueExits {
            requests: 1,
            prompt_tokens: 100,
            longest_start_wait_s: 0.0,
            flows: vec![FlowKey::of("")],
        },
    };
    for i in 0..4 {
        a.observe_step(&left, 0.5, t0 + std::time::Duration::from_millis(500 * i));
        a.try_admit(&cfg, SloClass::Batch, 100, None, None).unwrap();
    }
    a.try_admit(&cfg, SloClass::Batch, 900, None, None).unwrap();
    // 2 ahead: the 3rd departure in 1.5 s, but 1000 tokens take 5 s.
    assert!((a.predicted_wait_s(SloClass::Batch) - 5.0).abs() < 1e-9);
}

#[test]
fn the_waits_requests_felt_lately_count_while_others_wait() {
    let cfg = EngineConfig::default().admission;
    let mut a = AdmissionState::default();
    let t0 = Instant::now();
    for _ in 0..2 {
        a.try_admit(&cfg, SloClass::Interactive, 1, None, None)
            .unwrap();
    }
    // One started after waiting 3 s: felt 1.5 s (a moving average from 0).
    let left = PerClass {
        interactive: exits(1, 3.0),
        batch: exits(0, 0.0),
    };
    a.observe_step(&left, 0.01, t0);
    assert_eq!(a.waiting_requests.interactive, 1);
    assert!((a.predicted_wait_s(SloClass::Interactive) - 1.5).abs() < 1e-9);
    assert!(a
        .try_admit(&cfg, SloClass::Interactive, 1, Some(1000.0), None)
        .is_err());
    assert_eq!(a.predicted_wait_s(SloClass::Batch), 0.0, "per class");
    // With nobody waiting, a new request starts at once.
    a.release(SloClass::Interactive, FlowKey::of(""), 1, 1);
    assert_eq!(a.predicted_wait_s(SloClass::Interactive), 0.0);
    a.try_admit(&cfg, SloClass::Interactive, 1, Some(1000.0), None)
        .unwrap();
}

/// An interactive 8k-token prompt's TTFT forecast counts attention's growth with
/// the context: with a step cost whose attention term adds ~40% at 8k, and a
/// server that has seen prompts up to 4k, the forecast from the step-time model
/// is within 5% of the truth (the prefill rate measured on those prompts is >10%
/// short), and a target between the two is refused, honestly, at once.
#[test]
fn an_8k_prompt_forecast_counts_attention() {
    use crate::step_cost::StepShape;
    // 10 ms a step, 0.5 ms a prefill token, 50 ns per token attended to (at 8k,
    // attention is ~40% on top of the weights, as for a 0.5B model on a CPU).
    let truth =
        |s: &StepShape| 0.010 + 0.0005 * s.prefill_tokens as f64 + 5e-8 * s.context_tokens as f64;
    let chunk = 512;
    // What the engine sees: chunks of prompts up to 4k tokens, and decode steps.
    let mut model = StepCostModel::default();
    let mut a = AdmissionState::default();
    let mut seed = 7u64;
    for i in 0..400 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 40 + (seed >> 33) as usize % 960;
        let shape = if i % 3 == 0 {
            StepShape::of_seq(1, len, true)
        } else {
            let at = (seed >> 17) as usize % 8 * chunk;
            StepShape::of_seq(len.min(chunk), at, false)
        };
        model.observe(&shape, truth(&shape));
        a.observe_prefill(shape.prefill_tokens, truth(&shape));
    }
    a.observe_cost_model(&model, chunk);
    let n = 8192;
    let true_s = {
        let mut t = 0.0;
        for c in 0..n / chunk {
            t += truth(&StepShape::of_seq(chunk, c * chunk, false));
        }
        t
    };
    let by_rate = n as f64 / a.prefill_rate;
    let forecast = a.own_prefill_s(0, n);
    assert!(
        (forecast - true_s).abs() / true_s < 0.05,
        "forecast {forecast:.2} s, true {true_s:.2} s"
    );
    assert!(
        by_rate < 0.9 * true_s,
        "the rate alone: {by_rate:.2} s of {true_s:.2} s"
    );
    // A target the rate would promise and the prompt cannot meet: refused now.
    let cfg = AdmissionConfig {
        ttft_reject_factor: 1.0,
        ..AdmissionConfig::default()
    };
    let target_ms = 1000.0 * (by_rate + true_s) / 2.0;
    assert!(matches!(
        a.try_admit(&cfg, SloClass::Interactive, n, Some(target_ms), None),
        Err(EngineError::TtftUnreachable { .. })
    ));
    // ... and a target it can meet is admitted.
    a.try_admit(
        &cfg,
        SloClass::Interactive,
        n,
        Some(1000.0 * true_s * 1.2),
        None,
    )
    .unwrap();
    // A cached prefix counts: the same prompt with 6k cached forecasts its last 2k.
    let tail = a.own_prefill_s(6144, 2048);
    assert!(
        tail < 0.4 * forecast,
        "2k after 6k cached: {tail:.2} s of {forecast:.2} s"
    );
}

#[test]
fn a_flows_wait_is_its_place_in_the_fair_order_not_the_whole_queue() {
    let cfg = AdmissionConfig {
        max_queue_wait_s: 3.0,
        ..EngineConfig::default().admission
    };
    let (hog, quiet) = (FlowKey::of("key-b"), FlowKey::of("key-a"));
    let open = AdmissionConfig {
        max_queue_wait_s: 0.0,
        ..cfg.clone()
    };
    let admit_with = |a: &mut AdmissionState, cfg: &AdmissionConfig, flow, count| {
        a.try_admit_choices(cfg, SloClass::Interactive, flow, 1, 0, count, None, None)
    };
    let admit = |a: &mut AdmissionState, flow, count| admit_with(a, &cfg, flow, count);
    let mut a = AdmissionState::default();
    // One flow queues 8; the queue drains 2 requests a second (one each 0.5 s),
    // and those that start had waited 4 s.
    for _ in 0..8 {
        admit_with(&mut a, &open, hog, 1).unwrap();
    }
    let t0 = Instant::now();
    for i in 0..4 {
        let left = PerClass {
            interactive: QueueExits {
                requests: 1,
                prompt_tokens: 1,
                longest_start_wait_s: 4.0,
                flows: vec![hog],
            },
            batch: QueueExits::default(),
        };
        a.observe_step(&left, 0.5, t0 + std::time::Duration::from_millis(500 * i));
        admit_with(&mut a, &open, hog, 1).unwrap();
    }
    // 8 waiting, all the hog's: its next request starts at the 9th departure,
    // 4.5 s (and requests lately waited ~4 s): refused. Another flow's starts after one of the hog's (fair order:
    // the 2nd departure, 1 s), and the hog's long felt wait counts for it only
    // in proportion to its place (2 of 9: 0.8 s).
    assert!((a.predicted_wait_s(SloClass::Interactive) - 4.5).abs() < 1e-9);
    assert!(matches!(
        admit(&mut a, hog, 1),
        Err(EngineError::QueueWaitTooLong { .. })
    ));
    admit(&mut a, quiet, 1).unwrap();
    // The quiet flow's second request is behind its first and one more of the
    // hog's: 3 ahead, the 4th departure in 2 s; n=4 more puts its own 2, 3
    // siblings and 6 of the hog's ahead of the last: 6 s, refused, all four.
    admit(&mut a, quiet, 1).unwrap();
    assert!(matches!(
        admit(&mut a, quiet, 4),
        Err(EngineError::QueueWaitTooLong { .. })
    ));
    assert_eq!(a.waiting_requests.interactive, 10);
    // The quiet flow's requests leave: its counts go with them.
    let left = PerClass {
        interactive: QueueExits {
            requests: 2,
            prompt_tokens: 2,
            longest_start_wait_s: 0.0,
            flows: vec![quiet, quiet],
        },
        batch: QueueExits::default(),
    };
    a.observe_step(&left, 0.5, t0 + std::time::Duration::from_millis(2500));
    assert_eq!(a.ahead_of(SloClass::Interactive, quiet, 1), 1);
    assert_eq!(a.ahead_of(SloClass::Interactive, hog, 1), 8);
    a.release(SloClass::Interactive, hog, 8, 8);
    assert!(a.flows.interactive.is_empty());
}

#[test]
fn with_every_slot_held_the_felt_wait_counts_with_nothing_queued() {
    let cfg = AdmissionConfig {
        max_queue_wait_s: 3.0,
        ..EngineConfig::default().admission
    };
    let mut a = AdmissionState::default();
    let t0 = Instant::now();
    // Requests lately waited 4 s to start (felt: 2 s after one step); none
    // waits now.
    a.try_admit(&cfg, SloClass::Interactive, 1, None, None)
        .unwrap();
    a.try_admit(&cfg, SloClass::Batch, 1, None, None).unwrap();
    a.observe_step(
        &PerClass {
            interactive: exits(1, 4.0),
            batch: exits(1, 4.0),
        },
        0.5,
        t0,
    );
    assert_eq!(a.waiting_requests.interactive, 0);
    // A free slot: it starts at once.
    a.observe_slots(
        &PerClass {
            interactive: 3,
            batch: 13,
        },
        16,
    );
    assert_eq!(a.predicted_wait_s(SloClass::Interactive), 0.0);
    assert!(a.predicted_wait_s(SloClass::Batch) > 1.0, "every slot held");
    // Every slot held by interactive work: it waits for one, as they did.
    a.observe_slots(
        &PerClass {
            interactive: 16,
            batch: 0,
        },
        16,
    );
    assert!((a.predicted_wait_s(SloClass::Interactive) - 2.0).abs() < 1e-9);
}
