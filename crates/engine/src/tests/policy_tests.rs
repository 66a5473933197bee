//! Scheduling policy: token budget and sequence cap, decodes first, chunked
//! prefill, interactive before batch, FCFS without classes, prefix reuse, stops.

use super::*;
use crate::config::StepBudgetPolicy;
use crate::event::FinishReason;
use crate::mock::MockRunner;
use crate::request::StopConditions;

#[test]
fn budget_and_max_num_seqs_are_never_exceeded() {
    let mut c = cfg(200);
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = 64;
    c.max_prefill_chunk = 24;
    let (mut core, log) = new_core(c);
    let mut rng = Rng::new(7);
    let mut clients = Vec::new();
    let mut prompts = Vec::new();
    for step in 0..400 {
        if clients.len() < 60 && rng.chance(0.4) {
            let id = clients.len() as u64;
            let p = prompt(id, 1 + rng.below(150));
            let class = if rng.chance(0.5) {
                SloClass::Interactive
            } else {
                SloClass::Batch
            };
            let max = 1 + rng.below(40);
            clients.push(submit(&mut core, id, greedy(p.clone(), max, class)));
            prompts.push((p, max));
        }
        core.step();
        assert!(
            core.sched().running().len() <= 6,
            "step {step}: too many running"
        );
    }
    run_to_idle(&mut core, 10_000);
    for b in log.lock().unwrap().iter() {
        assert!(b.num_tokens() <= 64, "batch of {} tokens", b.num_tokens());
        assert!(b.seqs.len() <= 6, "batch of {} sequences", b.seqs.len());
        assert!(
            b.seqs.iter().all(|s| s.num_tokens <= 24),
            "prefill chunk over 24"
        );
    }
    for (cl, (p, max)) in clients.iter_mut().zip(&prompts) {
        cl.poll();
        assert_eq!(
            cl.tokens,
            MockRunner::reference(p, *max, VOCAB),
            "request {}",
            cl.id
        );
        assert_eq!(cl.finish.as_ref().unwrap().reason, FinishReason::Length);
    }
    assert_all_blocks_return(&mut core);
}

#[test]
fn decodes_run_every_step_while_a_long_prompt_is_chunked() {
    let mut c = cfg(100);
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.max_prefill_chunk = 64; // the budget left after decodes (36) is the limit
    let (mut core, log) = new_core(c);
    let mut short: Vec<_> = (0..4)
        .map(|i| {
            submit(
                &mut core,
                i,
                greedy(prompt(i, 5), 60, SloClass::Interactive),
            )
        })
        .collect();
    core.step();
    short.iter_mut().for_each(|c| c.poll());
    assert!(short.iter().all(|c| c.tokens.len() == 1));
    let long_prompt = prompt(99, 200);
    let mut long = submit(
        &mut core,
        99,
        greedy(long_prompt.clone(), 3, SloClass::Interactive),
    );
    let start = log.lock().unwrap().len();
    let mut steps = 0;
    while !long.done() && long.tokens.is_empty() {
        core.step();
        steps += 1;
        for (k, c) in short.iter_mut().enumerate() {
            c.poll();
            assert_eq!(
                c.tokens.len(),
                1 + steps,
                "decoder {k} stalled at step {steps}"
            );
        }
    }
    assert_eq!(
        steps,
        200usize.div_ceil(36),
        "prompt split into 36-token chunks"
    );
    for b in &log.lock().unwrap()[start..] {
        let decodes = b.seqs.iter().filter(|s| s.num_tokens == 1).count();
        let chunks: Vec<_> = b.seqs.iter().filter(|s| s.num_tokens > 1).collect();
        assert_eq!(decodes, 4);
        assert!(chunks.len() <= 1 && chunks.iter().all(|s| s.num_tokens <= 36));
        assert!(b.num_tokens() <= 40);
        // Only the chunk reaching the prompt's end asks for logits.
        assert!(chunks
            .iter()
            .all(|s| s.want_logits() == (s.context_len() == 200)));
    }
    run_to_idle(&mut core, 1000);
    long.poll();
    assert_eq!(long.tokens, MockRunner::reference(&long_prompt, 3, VOCAB));
    assert_all_blocks_return(&mut core);
}

#[test]
fn short_prompt_is_not_stuck_behind_a_long_one() {
    let mut c = cfg(100);
    c.max_num_batched_tokens = 64;
    c.max_prefill_chunk = 32;
    let (mut core, log) = new_core(c);
    let mut long = submit(
        &mut core,
        0,
        greedy(prompt(0, 600), 2, SloClass::Interactive),
    );
    core.step();
    core.step();
    let mut short = submit(&mut core, 1, greedy(prompt(1, 8), 2, SloClass::Interactive));
    let before = log.lock().unwrap().len();
    core.step();
    let chunks: Vec<usize> = log.lock().unwrap()[before]
        .seqs
        .iter()
        .map(|s| s.num_tokens)
        .collect();
    assert_eq!(
        chunks,
        vec![32, 8],
        "the long prompt's chunk is capped at max_prefill_chunk"
    );
    short.poll();
    long.poll();
    assert_eq!(
        short.tokens.len(),
        1,
        "short prompt got its first token in one step"
    );
    assert!(long.tokens.is_empty(), "long prompt still prefilling");
    run_to_idle(&mut core, 100);
    assert_all_blocks_return(&mut core);
}

#[test]
fn interactive_requests_are_admitted_before_batch() {
    let mut c = cfg(100);
    c.max_num_seqs = 2;
    let (mut core, _) = new_core(c);
    let mut batch: Vec<_> = (0..3)
        .map(|i| submit(&mut core, i, greedy(prompt(i, 20), 4, SloClass::Batch)))
        .collect();
    let mut inter: Vec<_> = (3..5)
        .map(|i| {
            submit(
                &mut core,
                i,
                greedy(prompt(i, 20), 4, SloClass::Interactive),
            )
        })
        .collect();
    core.step();
    let running: Vec<u64> = core.sched().running().iter().map(|s| s.id()).collect();
    assert_eq!(running, vec![3, 4]);
    run_to_idle(&mut core, 100);
    let last_inter = inter
        .iter_mut()
        .map(|c| {
            c.poll();
            c.finish.as_ref().unwrap().timings.first_token.unwrap()
        })
        .max()
        .unwrap();
    for c in &mut batch {
        c.poll();
        assert!(c.finish.as_ref().unwrap().timings.first_token.unwrap() > last_inter);
    }
    assert_all_blocks_return(&mut core);
}

#[test]
fn first_come_first_served_without_slo_classes() {
    let mut c = cfg(100);
    c.max_num_seqs = 1;
    c.slo_classes = false;
    let (mut core, _) = new_core(c);
    let classes = [
        SloClass::Batch,
        SloClass::Interactive,
        SloClass::Batch,
        SloClass::Interactive,
    ];
    let mut clients: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, &cl)| submit(&mut core, i as u64, greedy(prompt(i as u64, 10), 3, cl)))
        .collect();
    run_to_idle(&mut core, 100);
    let finish: Vec<_> = clients
        .iter_mut()
        .map(|c| {
            c.poll();
            c.finish.as_ref().unwrap().timings.finish.unwrap()
        })
        .collect();
    assert!(finish.windows(2).all(|w| w[0] < w[1]), "not FCFS");
    assert_eq!(core.sched().counters().preemptions, 0);
}

#[test]
fn prefix_cache_reuses_shared_prompt_prefixes() {
    let (mut core, _) = new_core(cfg(100));
    let sys = prompt(42, 64);
    let with = |tail: &[u32]| [sys.as_slice(), tail].concat();
    let a = with(&prompt(1, 10));
    let b = with(&prompt(2, 7));
    let run = |core: &mut EngineCore, id, p: &Vec<u32>| {
        let mut cl = submit(core, id, greedy(p.clone(), 10, SloClass::Interactive));
        run_to_idle(core, 100);
        cl.poll();
        assert_eq!(cl.tokens, MockRunner::reference(p, 10, VOCAB));
        cl.finish.unwrap().cached_prompt_tokens
    };
    assert_eq!(run(&mut core, 0, &a), 0);
    assert_eq!(run(&mut core, 1, &b), 64, "system prompt reused");
    assert_eq!(
        run(&mut core, 2, &a),
        64,
        "4 full blocks of the 74-token prompt"
    );
    assert_eq!(
        run(&mut core, 3, &sys),
        48,
        "the last token is always computed"
    );
    // Generated tokens are cached too: a follow-up turn reuses prompt + answer.
    let mut turn = a.clone();
    turn.extend(MockRunner::reference(&a, 10, VOCAB));
    turn.extend(prompt(3, 20));
    assert_eq!(run(&mut core, 4, &turn), 64 + 16);
    let cnt = *core.sched().counters();
    assert_eq!(cnt.prompt_tokens_cached, 64 + 64 + 48 + 80);
    assert_eq!(
        cnt.prompt_tokens_cached + cnt.prompt_tokens_computed,
        (74 + 71 + 74 + 64 + 104) as u64
    );
    assert_all_blocks_return(&mut core);

    let mut off = cfg(100);
    off.enable_prefix_cache = false;
    let (mut core, _) = new_core(off);
    run(&mut core, 0, &a);
    assert_eq!(run(&mut core, 1, &a), 0);
    assert_all_blocks_return(&mut core);
}

#[test]
fn identical_prompts_in_flight_together_share_blocks_after_insert() {
    let (mut core, _) = new_core(cfg(100));
    let p = prompt(5, 100);
    let mut cl: Vec<_> = (0..3)
        .map(|i| submit(&mut core, i, greedy(p.clone(), 20, SloClass::Interactive)))
        .collect();
    core.step();
    // All three prefilled the same 6 full blocks; the cache kept one copy.
    assert_eq!(core.sched().pool().num_used(), 6 + 3);
    run_to_idle(&mut core, 100);
    for c in &mut cl {
        c.poll();
        assert_eq!(c.tokens, MockRunner::reference(&p, 20, VOCAB));
    }
    assert_all_blocks_return(&mut core);
}

#[test]
fn stop_tokens_eos_and_length() {
    let (mut core, _) = new_core(cfg(100));
    let p = prompt(8, 30);
    let r = MockRunner::reference(&p, 30, VOCAB);
    let k = (3..30).find(|&k| !r[..k].contains(&r[k])).unwrap();
    let mut stop = StopConditions::max_tokens(30);
    stop.stop_token_ids = vec![r[k]];
    let mut eos = StopConditions::max_tokens(30);
    eos.eos_token_ids = vec![r[k]];
    let mut ignored = eos.clone();
    ignored.ignore_eos = true;
    let mut clients: Vec<_> = [stop, eos, ignored]
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut req = greedy(p.clone(), 30, SloClass::Interactive);
            req.stop = s;
            submit(&mut core, i as u64, req)
        })
        .collect();
    run_to_idle(&mut core, 100);
    for (i, c) in clients.iter_mut().enumerate() {
        c.poll();
        let f = c.finish.as_ref().unwrap();
        if i < 2 {
            assert_eq!(
                (f.reason.clone(), c.tokens.as_slice()),
                (FinishReason::Stop, &r[..=k])
            );
        } else {
            assert_eq!(
                (f.reason.clone(), c.tokens.as_slice()),
                (FinishReason::Length, &r[..])
            );
        }
        assert_eq!((f.prompt_tokens, f.completion_tokens), (30, c.tokens.len()));
    }
    assert_all_blocks_return(&mut core);
}

#[test]
fn logprobs_are_sent_only_when_asked() {
    let (mut core, _) = new_core(cfg(100));
    let mut req = greedy(prompt(1, 10), 3, SloClass::Interactive);
    req.sampling.logprobs = Some(2);
    let mut with = submit(&mut core, 0, req);
    let mut without = submit(
        &mut core,
        1,
        greedy(prompt(1, 10), 3, SloClass::Interactive),
    );
    run_to_idle(&mut core, 100);
    let mut n = 0;
    while let Ok(ev) = with.rx.try_recv() {
        if let Event::Token {
            id,
            logprob,
            top_logprobs,
            ..
        } = ev
        {
            assert!(logprob.unwrap() > -0.1);
            assert_eq!(top_logprobs.len(), 2);
            assert_eq!(top_logprobs[0].0, id);
            n += 1;
        }
    }
    assert_eq!(n, 3);
    while let Ok(ev) = without.rx.try_recv() {
        if let Event::Token {
            logprob,
            top_logprobs,
            ..
        } = ev
        {
            assert!(logprob.is_none() && top_logprobs.is_empty());
        }
    }
}

#[test]
fn runner_error_fails_the_batch_and_frees_its_blocks() {
    let runner = MockRunner::new(50, 16, VOCAB, 4096).with_failure_at_call(2);
    let mut core = EngineCore::new(Box::new(runner), cfg(50)).unwrap();
    let mut a = submit(
        &mut core,
        0,
        greedy(prompt(0, 10), 10, SloClass::Interactive),
    );
    core.step();
    core.step();
    let mut b = submit(
        &mut core,
        1,
        greedy(prompt(1, 10), 10, SloClass::Interactive),
    );
    run_to_idle(&mut core, 100);
    assert!(a.done() && b.done());
    for c in [&a, &b] {
        assert!(matches!(
            c.finish.as_ref().unwrap().reason,
            FinishReason::Error(_)
        ));
    }
    assert_eq!(a.tokens.len(), 2);
    assert_eq!(core.sched().counters().requests_failed, 2);
    assert_all_blocks_return(&mut core);
}

#[test]
fn timings_are_ordered_and_counted() {
    let (mut core, _) = new_core(cfg(100));
    let mut c = submit(
        &mut core,
        0,
        greedy(prompt(0, 40), 6, SloClass::Interactive),
    );
    run_to_idle(&mut core, 100);
    c.poll();
    let f = c.finish.unwrap();
    let t = &f.timings;
    assert!(t.arrival <= t.first_scheduled.unwrap());
    assert!(t.first_scheduled.unwrap() <= t.first_token.unwrap());
    assert!(t.first_token.unwrap() <= t.last_token.unwrap());
    assert!(t.last_token.unwrap() <= t.finish.unwrap());
    assert!(t.ttft().is_some() && t.e2e().unwrap() >= t.ttft().unwrap());
    assert_eq!((t.preemptions, f.completion_tokens), (0, 6));
}

/// Each step's time is split among its sequences by tokens: a request's
/// `engine_time` is its machine time, and the shares add up to the steps' time.
#[test]
fn step_time_is_charged_to_requests_by_tokens() {
    let (mut core, _) = new_core(cfg(100));
    // A step costs 1 ms plus 0.1 ms per token (the engine's clock, not the machine's).
    core.set_synthetic_cost(|s| 1e-3 + 1e-4 * (s.prefill_tokens + s.decode_rows) as f64);
    let mut long = submit(&mut core, 0, greedy(prompt(0, 60), 4, SloClass::Batch));
    let mut short = submit(&mut core, 1, greedy(prompt(1, 6), 4, SloClass::Batch));
    let mut total = 0.0;
    for _ in 0..100 {
        if !core.has_work() {
            break;
        }
        total += core.step().outcome.secs;
    }
    long.poll();
    short.poll();
    let (l, s) = (
        long.finish.unwrap().timings.engine_time.as_secs_f64(),
        short.finish.unwrap().timings.engine_time.as_secs_f64(),
    );
    assert!(total > 0.0 && s > 0.0);
    assert!((l + s - total).abs() < 1e-6 * 20.0, "{l} + {s} != {total}");
    // The 60-token prompt took most of the prefill steps it shared.
    assert!(l > 2.0 * s, "long {l} short {s}");
}

/// An interactive request arriving while a long batch prompt is being prefilled in
/// chunks is admitted and prefilled at the next step, ahead of the batch prompt's
/// remaining chunks; without SLO classes it waits for the budget the batch prompt
/// leaves.
#[test]
fn interactive_arrival_overtakes_running_batch_prefill() {
    for slo_classes in [true, false] {
        let mut c = cfg(200);
        c.slo_classes = slo_classes;
        c.max_num_batched_tokens = 64;
        c.max_prefill_chunk = 64;
        let (mut core, _) = new_core(c);
        let _batch = submit(&mut core, 0, greedy(prompt(0, 640), 2, SloClass::Batch));
        core.step();
        core.step();
        let mut inter = submit(
            &mut core,
            1,
            greedy(prompt(1, 48), 1, SloClass::Interactive),
        );
        core.step();
        inter.poll();
        let done = inter.finish.is_some();
        assert_eq!(
            done, slo_classes,
            "slo_classes {slo_classes}: interactive finished at once: {done}"
        );
        run_to_idle(&mut core, 200);
        assert_all_blocks_return(&mut core);
    }
}

#[test]
fn interactive_work_shortens_steps_while_batch_prefill_keeps_moving() {
    let mut c = cfg(300);
    c.max_num_batched_tokens = 512;
    c.max_prefill_chunk = 256;
    c.interactive_max_batched_tokens = Some(64);
    c.step_budget = StepBudgetPolicy::Tokens;
    let (mut core, log) = new_core(c);
    let mut batch = submit(&mut core, 0, greedy(prompt(0, 1500), 4, SloClass::Batch));
    core.step();
    let tokens = |log: &crate::mock::BatchLog, i: usize| log.lock().unwrap()[i].num_tokens();
    assert_eq!(tokens(&log, 0), 256, "alone, batch prefill fills its chunk");
    let mut inter = submit(
        &mut core,
        1,
        greedy(prompt(1, 20), 6, SloClass::Interactive),
    );
    let mut steps_with_interactive = 0;
    while !inter.done() {
        let before = log.lock().unwrap().len();
        let computed_before = core.sched().running()[0].num_computed();
        core.step();
        let n = tokens(&log, before);
        assert!(n <= 64, "a step with interactive work has {n} tokens");
        assert!(
            core.sched().running()[0].num_computed() > computed_before,
            "batch prefill still moves"
        );
        steps_with_interactive += 1;
    }
    assert_eq!(
        steps_with_interactive, 6,
        "one prefill step, then one decode per step"
    );
    assert_eq!(
        inter.tokens,
        MockRunner::reference(&prompt(1, 20), 6, VOCAB)
    );
    let before = log.lock().unwrap().len();
    core.step();
    assert_eq!(
        tokens(&log, before),
        256,
        "full chunks again once interactive is gone"
    );
    run_to_idle(&mut core, 100);
    batch.poll();
    assert_eq!(
        batch.tokens,
        MockRunner::reference(&prompt(0, 1500), 4, VOCAB)
    );
    assert_all_blocks_return(&mut core);
}
