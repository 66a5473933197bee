//! Preemption and resumption, cancellation, aging against starvation, and a
//! randomized mixed workload (paused sequences among it) checked for invariants
//! at every step.

use std::time::Duration;

use super::*;
use crate::event::FinishReason;
use crate::mock::MockRunner;

/// Three batch sequences (ids 0-2, 30-token prompts, 40 tokens) fill the slots
/// of a core with `c` (`max_num_seqs` set to 3) and run 10 steps; then an
/// interactive request (id 9) arrives and one step runs.
pub(super) fn full_slots_then_interactive(
    mut c: EngineConfig,
) -> (EngineCore, Vec<Client>, Client) {
    c.max_num_seqs = 3;
    let (mut core, _) = new_core(c);
    let batch: Vec<_> = (0..3)
        .map(|i| submit(&mut core, i, greedy(prompt(i, 30), 40, SloClass::Batch)))
        .collect();
    for _ in 0..10 {
        core.step();
    }
    let inter = submit(
        &mut core,
        9,
        greedy(prompt(9, 20), 5, SloClass::Interactive),
    );
    core.step();
    (core, batch, inter)
}

#[test]
fn interactive_preempts_newest_batch_when_sequences_are_full() {
    let (mut core, mut batch, mut inter) = full_slots_then_interactive(cfg(100));
    inter.poll();
    assert_eq!(inter.tokens.len(), 1, "interactive started at once");
    let running: Vec<u64> = core.sched().running().iter().map(|s| s.id()).collect();
    assert_eq!(
        running,
        vec![0, 1, 9],
        "the most recently started batch sequence yielded"
    );
    run_to_idle(&mut core, 500);
    for (i, cl) in batch.iter_mut().enumerate() {
        cl.poll();
        assert_eq!(
            cl.tokens,
            MockRunner::reference(&prompt(i as u64, 30), 40, VOCAB),
            "request {i}"
        );
        let f = cl.finish.as_ref().unwrap();
        assert_eq!(f.reason, FinishReason::Length);
        assert_eq!(f.timings.preemptions, (i == 2) as u32);
    }
    let c = core.sched().counters();
    assert_eq!(c.preemptions, 1);
    // The preempted sequence kept its KV while it waited: nothing recomputed.
    assert_eq!((c.preemptions_kept, c.recomputed_tokens), (1, 0));
    assert_all_blocks_return(&mut core);
}

#[test]
fn interactive_preempts_batch_when_kv_blocks_are_full() {
    // 12 blocks: two batch sequences of 30 + 60 tokens fill 12 blocks.
    let (mut core, _) = new_core(cfg(12));
    let mut batch: Vec<_> = (0..2)
        .map(|i| submit(&mut core, i, greedy(prompt(i, 30), 60, SloClass::Batch)))
        .collect();
    for _ in 0..40 {
        core.step();
    }
    let mut inter = submit(
        &mut core,
        5,
        greedy(prompt(5, 40), 4, SloClass::Interactive),
    );
    core.step();
    inter.poll();
    assert_eq!(inter.tokens.len(), 1);
    run_to_idle(&mut core, 500);
    inter.poll();
    assert_eq!(
        inter.tokens,
        MockRunner::reference(&prompt(5, 40), 4, VOCAB)
    );
    for (i, cl) in batch.iter_mut().enumerate() {
        cl.poll();
        assert_eq!(
            cl.tokens,
            MockRunner::reference(&prompt(i as u64, 30), 60, VOCAB)
        );
    }
    assert!(core.sched().counters().preemptions >= 1);
    assert_all_blocks_return(&mut core);
}

#[test]
fn kv_pressure_preempts_and_output_matches_unpreempted_runs() {
    for cache in [true, false] {
        let mut c = cfg(14);
        c.enable_prefix_cache = cache;
        let (mut core, _) = new_core(c);
        let mut clients: Vec<_> = (0..6)
            .map(|i| {
                submit(
                    &mut core,
                    i,
                    greedy(prompt(i, 20), 60, SloClass::Interactive),
                )
            })
            .collect();
        run_to_idle(&mut core, 2000);
        for (i, cl) in clients.iter_mut().enumerate() {
            cl.poll();
            assert_eq!(
                cl.tokens,
                MockRunner::reference(&prompt(i as u64, 20), 60, VOCAB)
            );
        }
        let preempted: u32 = clients
            .iter()
            .map(|c| c.finish.as_ref().unwrap().timings.preemptions)
            .sum();
        assert!(preempted > 0, "no preemption happened");
        assert_eq!(preempted as u64, core.sched().counters().preemptions);
        assert!(core.sched().counters().recomputed_tokens > 0);
        assert_all_blocks_return(&mut core);
    }
}

#[test]
fn a_sequence_alone_larger_than_the_pool_stops_with_length() {
    let (mut core, _) = new_core(cfg(4));
    let p = prompt(1, 30);
    let mut cl = submit(&mut core, 0, greedy(p.clone(), 200, SloClass::Interactive));
    run_to_idle(&mut core, 500);
    cl.poll();
    assert_eq!(cl.finish.as_ref().unwrap().reason, FinishReason::Length);
    assert_eq!(cl.tokens, MockRunner::reference(&p, 64 - 30 + 1, VOCAB));
    assert_all_blocks_return(&mut core);
}

#[test]
fn cancellation_frees_blocks_at_the_next_step() {
    let (mut core, _) = new_core(cfg(100));
    let mut a = submit(
        &mut core,
        0,
        greedy(prompt(0, 40), 50, SloClass::Interactive),
    );
    let b = submit(
        &mut core,
        1,
        greedy(prompt(1, 40), 50, SloClass::Interactive),
    );
    for _ in 0..5 {
        core.step();
    }
    let used = core.sched().pool().num_used();
    let b_blocks = core.sched().running()[1].blocks().len();
    drop(b);
    core.step();
    assert_eq!(core.sched().running().len(), 1);
    assert_eq!(core.sched().pool().num_used(), used - b_blocks);
    assert_eq!(core.sched().counters().requests_cancelled, 1);
    // A waiting request cancelled before it started releases its admission slot.
    let mut c = cfg(100);
    c.max_num_seqs = 1;
    let (mut core2, _) = new_core(c);
    let _x = submit(
        &mut core2,
        0,
        greedy(prompt(0, 40), 50, SloClass::Interactive),
    );
    let y = submit(
        &mut core2,
        1,
        greedy(prompt(1, 40), 50, SloClass::Interactive),
    );
    let first = core2.step().released.interactive;
    drop(y);
    let second = core2.step().released.interactive;
    assert_eq!(
        (
            first.requests + second.requests,
            first.prompt_tokens + second.prompt_tokens
        ),
        (2, 80)
    );
    assert_eq!(core2.sched().waiting(SloClass::Interactive).len(), 0);
    run_to_idle(&mut core, 500);
    a.poll();
    assert_eq!(a.tokens.len(), 50);
    assert_all_blocks_return(&mut core);
}

/// A batch request under a steady interactive stream that alone would keep the
/// engine full forever: with aging it finishes; without, it would not.
fn batch_finishes_under_interactive_stream(aging_ms: u64) -> Option<usize> {
    let mut c = cfg(200);
    c.max_num_seqs = 2;
    c.batch_aging_ms = aging_ms;
    let (mut core, _) = new_core(c);
    let mut batch = submit(&mut core, 0, greedy(prompt(0, 10), 5, SloClass::Batch));
    let mut inter = Vec::new();
    for step in 1..400u64 {
        inter.push(submit(
            &mut core,
            step,
            greedy(prompt(step, 10), 8, SloClass::Interactive),
        ));
        core.step();
        core.advance_clock(Duration::from_millis(10));
        if batch.done() {
            assert_eq!(
                batch.tokens,
                MockRunner::reference(&prompt(0, 10), 5, VOCAB)
            );
            return Some(step as usize);
        }
    }
    None
}

#[test]
fn no_starvation_under_a_steady_interactive_stream() {
    let steps = batch_finishes_under_interactive_stream(200).expect("batch request starved");
    assert!(steps < 60, "took {steps} steps");
    assert_eq!(
        batch_finishes_under_interactive_stream(1_000_000),
        None,
        "the stream is not saturating"
    );
}

/// Checks every block reference is held by exactly the tables that list it.
fn assert_ref_counts(core: &EngineCore) {
    let pool = &core.sched().pool();
    let mut counts = vec![0u32; pool.num_blocks()];
    for s in core.sched().running() {
        for &b in s.blocks().ids() {
            counts[b as usize] += 1;
        }
    }
    for q in SloClass::ALL.map(|c| core.sched().waiting(c)) {
        for s in q {
            // Only a paused sequence waits with KV: its computed tokens' blocks.
            let blocks = core.sched().pool().blocks_for(s.num_computed());
            assert_eq!(s.blocks().len(), blocks, "seq {}", s.id());
            assert!(s.num_computed() == 0 || s.is_paused());
            for &b in s.blocks().ids() {
                counts[b as usize] += 1;
            }
        }
    }
    for (b, &n) in counts.iter().enumerate() {
        assert_eq!(pool.ref_count(b as u32), n, "block {b}");
    }
    pool.check_invariants().unwrap();
    if let Some(cache) = core.sched().cache() {
        cache.check_invariants().unwrap();
    }
}

#[test]
fn randomized_mixed_workload_keeps_invariants_and_outputs() {
    let mut kept = 0;
    for seed in 0..6u64 {
        let mut rng = Rng::new(seed);
        let mut c = cfg(24 + rng.below(40));
        c.max_num_seqs = 2 + rng.below(8);
        c.max_num_batched_tokens = 16 + rng.below(200);
        c.max_prefill_chunk = 4 + rng.below(64);
        c.enable_prefix_cache = rng.chance(0.7);
        c.slo_classes = rng.chance(0.7);
        c.batch_aging_ms = 50 + rng.below(500) as u64;
        c.interactive_max_batched_tokens = rng.chance(0.5).then(|| 1 + rng.below(128));
        c.preemption_keeps_kv = rng.chance(0.7);
        let (mut core, _) = new_core(c);
        let systems: Vec<Vec<u32>> = (0..3)
            .map(|i| prompt(1000 + i, 16 + rng.below(60)))
            .collect();
        let mut clients: Vec<(Client, Vec<u32>, usize, bool)> = Vec::new();
        for step in 0..3000 {
            if clients.len() < 80 && rng.chance(0.15) {
                let id = clients.len() as u64;
                let mut p = if rng.chance(0.6) {
                    systems[rng.below(3)].clone()
                } else {
                    Vec::new()
                };
                p.extend(prompt(id + 77 * seed, 1 + rng.below(80)));
                let max = 1 + rng.below(60);
                let class = if rng.chance(0.5) {
                    SloClass::Interactive
                } else {
                    SloClass::Batch
                };
                let cl = submit(&mut core, id, greedy(p.clone(), max, class));
                clients.push((cl, p, max, false));
            }
            if rng.chance(0.01) && !clients.is_empty() {
                let k = rng.below(clients.len());
                clients[k].0.rx.close(); // cancel
                clients[k].3 = true;
            }
            core.step();
            core.advance_clock(Duration::from_millis(5));
            assert_ref_counts(&core);
            if step > 2000 && clients.len() >= 80 && !core.has_work() {
                break;
            }
        }
        run_to_idle(&mut core, 20_000);
        let k = core.sched().counters();
        let resumed = k.preemptions_kept + k.preemptions_spilled + k.preemptions_recomputed;
        assert!(resumed <= k.preemptions, "seed {seed}: {k:?}");
        assert!(k.recomputed_prompt_tokens <= k.recomputed_tokens);
        kept += k.preemptions_kept;
        for (cl, p, max, cancelled) in &mut clients {
            cl.poll();
            let reference = MockRunner::reference(p, *max, VOCAB);
            match cl.finish.as_ref().map(|f| &f.reason) {
                Some(FinishReason::Length) => {
                    assert_eq!(cl.tokens, reference, "seed {seed} request {}", cl.id)
                }
                // A cancelled stream is closed: its Finished cannot arrive.
                None if *cancelled => assert_eq!(cl.tokens, reference[..cl.tokens.len()]),
                r => panic!("unexpected finish {r:?}"),
            }
        }
        assert_all_blocks_return(&mut core);
    }
    assert!(kept > 0, "no preempted sequence kept its KV");
}

#[test]
fn a_served_batch_backlog_does_not_age_past_interactive_arrivals() {
    // A long batch backlog is being served (batch sequences run) while its queue
    // waits far past `batch_aging_ms`: it is not starving, so an interactive arrival
    // is still admitted and prefilled first, and the backlog's waiting head stays a
    // preemptable batch request.
    let mut c = cfg(400);
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.max_prefill_chunk = 32;
    c.batch_aging_ms = 100;
    let (mut core, _) = new_core(c);
    let _batch: Vec<_> = (0..12)
        .map(|i| submit(&mut core, i, greedy(prompt(i, 200), 4, SloClass::Batch)))
        .collect();
    for _ in 0..4 {
        core.step();
        core.advance_clock(Duration::from_millis(500));
    }
    assert!(!core.sched().waiting(SloClass::Batch).is_empty());
    let mut inter = submit(
        &mut core,
        99,
        greedy(prompt(99, 20), 1, SloClass::Interactive),
    );
    core.step();
    inter.poll();
    assert!(
        inter.finish.is_some(),
        "interactive served in its first step"
    );
    assert!(
        core.sched().running().iter().all(|s| !s.is_promoted()),
        "nothing was promoted while batch work ran"
    );
    run_to_idle(&mut core, 2000);
    assert_all_blocks_return(&mut core);
}
