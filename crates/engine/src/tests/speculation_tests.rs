//! N-gram speculation against the mock runner: outputs equal to plain decoding
//! (greedy and seeded sampling), fewer steps where drafts are right, KV and the
//! prefix cache consistent after rejected drafts, never on batch-class rows, off in
//! a large batch where the step-time model says drafts cost more than they add.

use super::*;
use crate::config::StepBudgetPolicy;
use crate::runner::Batch;
use crate::sampler::SamplingParams;
use crate::step_cost::StepShape;

/// 30 ms a step, 0.5 ms a decode row: a small model's step, where verifying a few
/// more tokens costs little next to the step itself.
fn cheap_rows(s: &StepShape) -> f64 {
    0.030 + 0.0005 * s.decode_rows as f64 + 0.001 * s.prefill_tokens as f64
}

/// 10 ms a step, 5 ms a decode row: rows dominate a large batch.
fn dear_rows(s: &StepShape) -> f64 {
    0.010 + 0.005 * s.decode_rows as f64 + 0.001 * s.prefill_tokens as f64
}

fn spec_cfg(max_draft: usize) -> EngineConfig {
    EngineConfig {
        spec_max_draft: max_draft,
        max_num_batched_tokens: 512,
        max_prefill_chunk: 64,
        ..cfg(400)
    }
}

/// A core over a recording mock whose text repeats with `period` (drafts from the
/// context are right once it does) except after one prefix in `noise`, blocks of
/// 4 (drafts cross block boundaries).
fn noisy_core(
    c: EngineConfig,
    period: usize,
    noise: u64,
    cost: fn(&StepShape) -> f64,
) -> (EngineCore, BatchLog, MockRunner) {
    let n = c.num_kv_blocks.unwrap();
    let mock = || MockRunner::new(n, 4, VOCAB, 4096).with_period(period, noise);
    let (runner, log) = mock().with_log();
    let mut core = EngineCore::new(Box::new(runner), c).unwrap();
    core.set_synthetic_cost(cost);
    (core, log, mock())
}

fn periodic_core(
    c: EngineConfig,
    period: usize,
    cost: fn(&StepShape) -> f64,
) -> (EngineCore, BatchLog, MockRunner) {
    noisy_core(c, period, 0, cost)
}

/// A prompt over a small alphabet (n-grams recur, drafts are often wrong early).
fn small_alphabet_prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| 1 + r.below(4) as u32).collect()
}

fn verify_rows(log: &BatchLog) -> Vec<(usize, usize)> {
    let log = log.lock().unwrap();
    log.iter()
        .flat_map(|b: &Batch| b.seqs.iter().filter(|s| s.num_logits > 1))
        .map(|s| (s.num_tokens, s.num_logits))
        .collect()
}

fn run_clients(core: &mut EngineCore, clients: &mut [Client]) {
    let mut steps = 0;
    while core.has_work() {
        core.step();
        core.sched().pool().check_invariants().unwrap();
        for c in clients.iter_mut() {
            c.poll();
        }
        steps += 1;
        assert!(steps < 10_000, "engine not idle");
    }
    assert!(clients.iter_mut().all(|c| c.done()));
}

#[test]
fn greedy_outputs_equal_plain_decoding_with_fewer_steps() {
    let (mut core, log, truth) = periodic_core(spec_cfg(8), 6, cheap_rows);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(40 + i, 13 + i as usize)).collect();
    let mut clients: Vec<Client> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            submit(
                &mut core,
                i as u64,
                greedy(p.clone(), 60, SloClass::Interactive),
            )
        })
        .collect();
    run_clients(&mut core, &mut clients);
    for (c, p) in clients.iter().zip(&prompts) {
        assert_eq!(c.tokens, truth.greedy(p, 60), "request {}", c.id);
    }
    let spec = core.snapshot().counters.spec[SloClass::Interactive];
    assert!(spec.verify_rows > 0 && spec.accepted_tokens > 0, "{spec:?}");
    assert_eq!(
        spec.emitted_tokens,
        spec.accepted_tokens + spec.verify_rows,
        "each verification emits its accepted tokens and one more"
    );
    // Each verification row carries a logits row per position.
    assert!(verify_rows(&log).iter().all(|&(t, l)| t == l && t > 1));
    let steps = log.lock().unwrap().len();
    assert!(steps < 60, "{steps} steps for 60 tokens a request");
    assert_all_blocks_return(&mut core);
}

/// Drafts that are often wrong: every output still equals plain decoding, the
/// pool and cache invariants hold after every step, and nothing leaks.
#[test]
fn rejected_drafts_leave_kv_and_the_prefix_cache_consistent() {
    let mut total = crate::stats::SpecCounters::default();
    for seed in 0..8u64 {
        let period = 5 + seed as usize % 3;
        let (mut core, _log, truth) = noisy_core(spec_cfg(6), period, 8, cheap_rows);
        let mut prompts = Vec::new();
        let mut clients = Vec::new();
        for i in 0..3u64 {
            // Shared prefixes: later requests reuse cached blocks written by
            // sequences that verified drafts.
            let mut p = small_alphabet_prompt(seed * 10 + i % 2, 12);
            p.extend(small_alphabet_prompt(seed * 100 + i, 3 + i as usize));
            let c = submit(&mut core, i, greedy(p.clone(), 40, SloClass::Interactive));
            prompts.push(p);
            clients.push(c);
            core.step();
        }
        run_clients(&mut core, &mut clients);
        for (c, p) in clients.iter().zip(&prompts) {
            assert_eq!(
                c.tokens,
                truth.greedy(p, 40),
                "seed {seed} request {}",
                c.id
            );
        }
        let spec = core.snapshot().counters.spec[SloClass::Interactive];
        total.drafted_tokens += spec.drafted_tokens;
        total.accepted_tokens += spec.accepted_tokens;
        core.sched_mut()
            .cache_mut()
            .unwrap()
            .check_invariants()
            .unwrap();
        assert_all_blocks_return(&mut core);
    }
    let rejected = total.drafted_tokens - total.accepted_tokens;
    assert!(rejected > 10 && total.accepted_tokens > 10, "{total:?}");
}

/// A seeded sampled request draws the same tokens with speculation as without
/// (each emitted token is sampled once, in order, by its own sampler).
#[test]
fn seeded_sampling_is_the_same_with_and_without_speculation() {
    let run = |max_draft| {
        let (mut core, _log, _) = periodic_core(spec_cfg(max_draft), 4, cheap_rows);
        let mut req = Request::greedy(prompt(7, 9), 80);
        req.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(11),
            ..SamplingParams::default()
        };
        let mut c = vec![submit(&mut core, 1, req)];
        run_clients(&mut core, &mut c);
        let spec = core.snapshot().counters.spec[SloClass::Interactive];
        (c.pop().unwrap().tokens, spec)
    };
    let (plain, off) = run(0);
    let (spec, on) = run(8);
    assert_eq!(off.verify_rows, 0);
    assert!(
        on.accepted_tokens > 0 && on.accepted_tokens < on.drafted_tokens,
        "{on:?}"
    );
    assert_eq!(spec, plain);
}

#[test]
fn batch_class_rows_never_draft() {
    for policy in [StepBudgetPolicy::Time, StepBudgetPolicy::Tokens] {
        let c = || EngineConfig {
            step_budget: policy,
            ..spec_cfg(8)
        };
        let p = prompt(3, 14);
        // Alone: no step carries a verification row.
        let (mut core, log, truth) = periodic_core(c(), 6, cheap_rows);
        let mut clients = vec![submit(&mut core, 1, greedy(p.clone(), 40, SloClass::Batch))];
        run_clients(&mut core, &mut clients);
        assert_eq!(clients[0].tokens, truth.greedy(&p, 40));
        assert!(verify_rows(&log).is_empty(), "{policy:?}");
        // Beside an interactive request that drafts.
        let (mut core, _log, truth) = periodic_core(c(), 6, cheap_rows);
        let mut clients = vec![
            submit(&mut core, 1, greedy(p.clone(), 40, SloClass::Batch)),
            submit(&mut core, 2, greedy(p.clone(), 40, SloClass::Interactive)),
        ];
        run_clients(&mut core, &mut clients);
        assert!(clients.iter().all(|c| c.tokens == truth.greedy(&p, 40)));
        let spec = core.snapshot().counters.spec;
        assert_eq!(spec[SloClass::Batch], Default::default(), "{policy:?}");
        assert!(spec[SloClass::Interactive].verify_rows > 0, "{policy:?}");
    }
}

#[test]
fn a_large_batch_turns_drafts_off_where_rows_are_dear() {
    let run = |n: u64| {
        let (mut core, _log, _) = periodic_core(spec_cfg(8), 6, dear_rows);
        let mut clients: Vec<Client> = (0..n)
            .map(|i| {
                submit(
                    &mut core,
                    i,
                    greedy(prompt(i, 12), 40, SloClass::Interactive),
                )
            })
            .collect();
        run_clients(&mut core, &mut clients);
        core.snapshot().counters.spec[SloClass::Interactive]
    };
    assert!(run(1).verify_rows > 0, "alone, a draft pays");
    let big = run(16);
    // Only the probes (a short draft a row one step in 32) run.
    assert!(
        big.drafted_tokens <= 2 * big.verify_rows && big.verify_rows <= 16 * 45 / 32 + 16,
        "16 rows: a draft costs more than it adds: {big:?}"
    );
}

#[test]
fn drafts_stop_at_max_tokens_and_the_context_length() {
    let c = EngineConfig {
        max_model_len: Some(40),
        ..spec_cfg(8)
    };
    let (mut core, log, truth) = periodic_core(c, 3, cheap_rows);
    let (p1, p2) = (prompt(1, 9), prompt(2, 20));
    let mut clients = vec![
        submit(&mut core, 1, greedy(p1.clone(), 13, SloClass::Interactive)),
        submit(&mut core, 2, greedy(p2.clone(), 20, SloClass::Interactive)),
    ];
    run_clients(&mut core, &mut clients);
    assert_eq!(clients[0].tokens, truth.greedy(&p1, 13));
    assert_eq!(
        clients[1].tokens,
        truth.greedy(&p2, 20),
        "up to the context length"
    );
    for c in &clients {
        assert_eq!(
            c.finish.as_ref().unwrap().reason,
            crate::event::FinishReason::Length
        );
    }
    let log = log.lock().unwrap();
    assert!(log
        .iter()
        .flat_map(|b| b.seqs.iter())
        .all(|s| s.context_len() <= 40));
}
