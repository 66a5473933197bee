//! Long prompts beside interactive streams (issue #54 item 4), on the mock runner
//! with a step cost whose attention term grows with the context: a 16k-token
//! batch prompt is chunked so that an interactive stream keeps its TPOT target in
//! every step, its last chunks (where a token costs most) included.

use super::*;
use crate::config::StepBudgetPolicy;
use crate::event::FinishReason;
use crate::step_cost::StepShape;

/// 10 ms a step, 5 ms a decode row, 0.5 ms a prefill token, 50 ns per token
/// attended to (at 16k a prompt token costs 2.6x what it costs at the start).
fn cost(s: &StepShape) -> f64 {
    0.010
        + 0.005 * s.decode_rows as f64
        + 0.0005 * s.prefill_tokens as f64
        + 5e-8 * s.context_tokens as f64
}

#[test]
fn a_16k_batch_prompt_keeps_an_interactive_stream_at_its_tpot() {
    const LONG: usize = 16_384;
    const TPOT_MS: f64 = 60.0;
    let blocks = LONG / 16 + 256;
    let c = EngineConfig {
        step_budget: StepBudgetPolicy::Time,
        max_batch_interference: 0.2,
        slo_margin: 0.0,
        batch_max_skip_steps: 1000,
        max_num_batched_tokens: 2048,
        max_prefill_chunk: 512,
        ..cfg(blocks)
    };
    let (runner, log) = MockRunner::new(blocks, 16, VOCAB, LONG + 2048).with_log();
    let mut core = EngineCore::new(Box::new(runner), c).unwrap();
    core.set_synthetic_cost(cost);
    // A server that has run before: the step-time model has seen prompts of a
    // few thousand tokens (not 16k) and decode steps.
    for i in 0..3 {
        let _warm = submit(
            &mut core,
            50 + i,
            greedy(prompt(50 + i, 3000), 8, SloClass::Batch),
        );
        run_to_idle(&mut core, 1000);
    }
    let mut inter = submit(
        &mut core,
        0,
        greedy(prompt(0, 16), 4000, SloClass::Interactive).with_tpot_slo_ms(TPOT_MS),
    );
    let (mut decode_total, mut decode_steps) = (0.0f64, 0usize);
    for i in 0..4 {
        core.step();
        if i > 0 {
            // Its decode steps so far (the first step was its prefill).
            decode_total += cost(core.sched().planned_shape());
            decode_steps += 1;
        }
    }
    let mut long = submit(
        &mut core,
        100,
        greedy(prompt(100, LONG), 8, SloClass::Batch),
    );
    let (mut steps, mut worst, mut total, mut late_chunk) = (0usize, 0.0f64, 0.0f64, usize::MAX);
    loop {
        inter.poll();
        let before = inter.tokens.len();
        let logged = log.lock().unwrap().len();
        core.step();
        steps += 1;
        inter.poll();
        assert_eq!(
            inter.tokens.len(),
            before + 1,
            "step {steps}: the stream was skipped"
        );
        let shape = *core.sched().planned_shape();
        let secs = cost(&shape);
        worst = worst.max(secs);
        total += secs;
        // The stream's TPOT (its mean time between tokens since its first, what
        // the target bounds) stays within the target, up to the model's error;
        // allowance left unused carries over (at most CREDIT_STEPS = 4 steps'
        // worth), so one step may be longer, never past base + 4 x allowance.
        decode_total += secs;
        decode_steps += 1;
        let tpot = decode_total / decode_steps as f64;
        assert!(
            tpot <= TPOT_MS / 1e3 * 1.05,
            "step {steps}: TPOT {:.1} ms (this step {shape:?}: {:.1} ms)",
            tpot * 1e3,
            secs * 1e3
        );
        let prefilled = core
            .sched()
            .running()
            .iter()
            .find(|s| s.id() == 100)
            .is_some_and(|s| s.is_decoding());
        if prefilled {
            break;
        }
        let tokens = log.lock().unwrap()[logged].num_tokens();
        if tokens > 1 && shape.context_tokens > 14_000 * (tokens - 1) {
            late_chunk = late_chunk.min(tokens - 1);
        }
        assert!(steps < 2000, "the long prompt made too little progress");
    }
    // The last chunks are smaller than the first (they cost more per token) but
    // never empty.
    assert!(
        (1..60).contains(&late_chunk),
        "late chunk of {late_chunk} tokens"
    );
    let mean = total / steps as f64;
    assert!(
        mean > TPOT_MS / 1e3 * 0.7,
        "the steps used the room: mean {:.1} ms",
        mean * 1e3
    );
    // Base 15 ms + 4 x 45 ms of allowance, up to the model's error.
    assert!(worst < 0.195 * 1.1, "worst step {:.1} ms", worst * 1e3);
    core.cancel(0, FinishReason::Cancelled);
    run_to_idle(&mut core, 10_000);
    long.poll();
    assert_eq!(
        long.tokens,
        MockRunner::reference(&prompt(100, LONG), 8, VOCAB)
    );
    assert_all_blocks_return(&mut core);
}
