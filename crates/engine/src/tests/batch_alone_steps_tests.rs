//! A step without interactive work (and none lately) carries every running batch
//! decode row, as a step of the interactive class alone does, so the batch class
//! alone gets the same throughput; `max_step_ms` bounds only the batch prefill
//! added on top of those rows.

use super::*;
use crate::config::StepBudgetPolicy;
use crate::step_cost::StepShape;

/// 10 ms a step, 5 ms a decode row, 2 ms a prefill token.
fn cost(s: &StepShape) -> f64 {
    0.010 + 0.005 * s.decode_rows as f64 + 0.002 * s.prefill_tokens as f64
}

#[test]
fn batch_alone_decodes_every_row_and_max_step_ms_bounds_only_its_prefill() {
    let c = EngineConfig {
        step_budget: StepBudgetPolicy::Time,
        max_step_ms: Some(30.0),
        slo_margin: 0.0,
        batch_max_skip_steps: 1000,
        max_num_batched_tokens: 512,
        max_prefill_chunk: 64,
        ..cfg(2000)
    };
    let (mut core, log) = new_core(c);
    core.set_synthetic_cost(cost);
    let mut flood: Vec<Client> = (0..8)
        .map(|i| submit(&mut core, i, greedy(prompt(i, 4), 40, SloClass::Batch)))
        .collect();
    for _ in 0..8 {
        core.step();
    }
    assert!(core.sched().running().iter().all(|s| s.is_decoding()));
    // 8 rows are 50 ms predicted, past 30 ms: all of them run all the same.
    let at = log.lock().unwrap().len();
    core.step();
    assert_eq!(log.lock().unwrap()[at].seqs.len(), 8, "every decode row");
    assert_eq!(core.sched().counters().batch_rows_deferred, 0);
    // A new arrival's prefill gets max_step_ms on top of the rows: 30 ms, at
    // most 15 tokens (2 ms each; its row and KV cost some of it), not its 60.
    let mut late = submit(&mut core, 50, greedy(prompt(50, 60), 4, SloClass::Batch));
    core.step();
    let b = log.lock().unwrap()[at + 1].clone();
    let chunks: Vec<usize> = b.seqs.iter().map(|s| s.num_tokens).collect();
    assert_eq!(chunks.len(), 9, "{chunks:?}");
    assert_eq!(chunks.iter().filter(|&&n| n == 1).count(), 8, "{chunks:?}");
    let prefill = *chunks.iter().max().unwrap();
    assert!((8..=15).contains(&prefill), "{chunks:?}");
    run_to_idle(&mut core, 400);
    for (i, cl) in flood.iter_mut().enumerate() {
        assert!(cl.done());
        assert_eq!(
            cl.tokens,
            MockRunner::reference(&prompt(i as u64, 4), 40, VOCAB)
        );
    }
    assert!(late.done());
    assert_all_blocks_return(&mut core);
}
