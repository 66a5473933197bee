//! SLO-aware steps (`step_budget = "time"`) against the mock runner with a
//! synthetic step cost on the engine's clock: the time limit, the rotation of
//! skipped batch rows, the tightest target, priority inversion, and outputs equal
//! to the ground truth whatever was skipped.

use super::*;
use crate::config::StepBudgetPolicy;
use crate::step_cost::StepShape;

/// 10 ms a step, 5 ms a decode row, 2 ms a prefill token.
fn cost(s: &StepShape) -> f64 {
    0.010 + 0.005 * s.decode_rows as f64 + 0.002 * s.prefill_tokens as f64
}

fn slo_cfg(interference: f64) -> EngineConfig {
    EngineConfig {
        max_batch_interference: interference,
        slo_margin: 0.0,
        batch_max_skip_steps: 1000,
        step_budget: StepBudgetPolicy::Time,
        max_num_batched_tokens: 512,
        max_prefill_chunk: 64,
        ..cfg(2000)
    }
}

fn core_with_cost(c: EngineConfig) -> (EngineCore, crate::mock::BatchLog) {
    let (mut core, log) = new_core(c);
    core.set_synthetic_cost(cost);
    (core, log)
}

/// `n` batch requests, run until all of them decode.
fn batch_flood(core: &mut EngineCore, n: u64, max_tokens: usize) -> Vec<Client> {
    let clients: Vec<Client> = (0..n)
        .map(|i| {
            submit(
                core,
                100 + i,
                greedy(prompt(100 + i, 20), max_tokens, SloClass::Batch),
            )
        })
        .collect();
    for _ in 0..4 {
        core.step();
    }
    assert!(
        core.sched().running().iter().all(|s| s.is_decoding()),
        "the flood decodes"
    );
    clients
}

/// A core with `c`, 8 batch requests decoding, and 20 steps for the cost model to
/// learn the flood's steps.
fn warm_flood(c: EngineConfig) -> (EngineCore, crate::mock::BatchLog, Vec<Client>) {
    let (mut core, log) = core_with_cost(c);
    let flood = batch_flood(&mut core, 8, 400);
    for _ in 0..20 {
        core.step();
    }
    (core, log, flood)
}

fn rows(log: &crate::mock::BatchLog, step: usize) -> usize {
    log.lock().unwrap()[step].seqs.len()
}

/// Steps that carry interactive decodes take at most (1 + interference) times the
/// same step without batch work; interactive decodes are never skipped; skipped
/// batch rows rotate; every output equals the ground truth.
#[test]
fn batch_rows_yield_to_the_interference_bound_and_rotate() {
    let (mut core, log) = core_with_cost(slo_cfg(0.5));
    let mut flood = batch_flood(&mut core, 12, 80);
    // Let the model learn the cost while the flood runs alone: every row joins.
    for _ in 0..20 {
        let before = log.lock().unwrap().len();
        core.step();
        assert_eq!(rows(&log, before), 12, "no interactive work: full steps");
        assert_eq!(core.sched().last_limit(), None);
    }
    let mut inter: Vec<Client> = (0..2)
        .map(|i| {
            submit(
                &mut core,
                i,
                greedy(prompt(i, 8), 30, SloClass::Interactive),
            )
        })
        .collect();
    // Rotation, measured from step 5 on: with at least `min_rows` batch rows a
    // step, no row waits more than ceil(12 / min_rows) steps.
    let mut last_run = [5usize; 12];
    let (mut max_gap, mut min_rows) = (0, usize::MAX);
    for step in 0..25 {
        let before = log.lock().unwrap().len();
        let tokens_before: Vec<usize> = inter
            .iter_mut()
            .map(|c| {
                c.poll();
                c.tokens.len()
            })
            .collect();
        core.step();
        let batch = log.lock().unwrap()[before].clone();
        if step >= 1 {
            // Both interactive streams decode in every step (never skipped).
            for (c, b) in inter.iter_mut().zip(&tokens_before) {
                c.poll();
                assert_eq!(
                    c.tokens.len(),
                    b + 1,
                    "step {step}: an interactive row was skipped"
                );
            }
            // Interactive part: 2 decode rows = 20 ms; bound 1.5x = 30 ms.
            let shape = core.sched().planned_shape();
            assert!(
                cost(shape) <= 0.030 + 1e-9,
                "step {step}: {shape:?} costs {} s",
                cost(shape)
            );
            let batch_rows = batch.seqs.len() - 2;
            assert!(batch_rows < 12, "step {step}: batch rows were deferred");
            if step >= 5 {
                // Once the model has seen steps of this shape.
                assert!(
                    batch_rows >= 1,
                    "step {step}: the bound leaves room for batch rows"
                );
                min_rows = min_rows.min(batch_rows);
            }
        }
        // Which batch requests ran (the mock's first token ids differ per prompt:
        // identify them by the running set instead).
        let ran: Vec<u64> = core
            .sched()
            .running()
            .iter()
            .filter(|s| s.class() == SloClass::Batch && s.last_run_step() == core.sched().step_no())
            .map(|s| s.id())
            .collect();
        for id in ran.into_iter().filter(|_| step > 5) {
            let k = (id - 100) as usize;
            max_gap = max_gap.max(step - last_run[k]);
            last_run[k] = step;
        }
    }
    for last in last_run {
        max_gap = max_gap.max(24 - last);
    }
    assert!(
        max_gap <= 12usize.div_ceil(min_rows),
        "a batch row waited {max_gap} steps with at least {min_rows} rows a step"
    );
    assert!(core.sched().counters().batch_rows_deferred > 0);
    run_to_idle(&mut core, 2000);
    for c in inter.iter_mut().chain(flood.iter_mut()) {
        c.poll();
        let seq = c.id;
        let p = if seq < 100 {
            prompt(seq, 8)
        } else {
            prompt(seq, 20)
        };
        let n = if seq < 100 { 30 } else { 80 };
        assert_eq!(
            c.tokens,
            MockRunner::reference(&p, n, VOCAB),
            "request {seq}"
        );
    }
    assert_all_blocks_return(&mut core);
}

/// With no room at all (interference 0), batch rows still run: each at least
/// every `batch_max_skip_steps` steps.
#[test]
fn no_batch_row_starves() {
    let mut c = slo_cfg(0.0);
    c.batch_max_skip_steps = 5;
    let (mut core, _log) = core_with_cost(c);
    let mut flood = batch_flood(&mut core, 4, 40);
    let mut inter = submit(
        &mut core,
        0,
        greedy(prompt(0, 8), 200, SloClass::Interactive),
    );
    let counts = |flood: &mut Vec<Client>| -> Vec<usize> {
        flood
            .iter_mut()
            .map(|c| {
                c.poll();
                c.tokens.len()
            })
            .collect()
    };
    let start = counts(&mut flood);
    for _ in 0..30 {
        core.step();
    }
    let end = counts(&mut flood);
    for (a, b) in start.iter().zip(&end) {
        // One starving row is forced a step: the 4 rows, skipped together, are
        // forced on consecutive steps, then each about every 6 steps: at least 4
        // tokens each in 30 steps.
        assert!(
            b - a >= 4,
            "a batch sequence got {} tokens in 30 steps",
            b - a
        );
    }
    inter.poll();
    assert!(
        inter.tokens.len() >= 29,
        "the interactive stream kept decoding"
    );
    run_to_idle(&mut core, 2000);
    assert_all_blocks_return(&mut core);
}

/// The limit follows the tightest target: an absolute TPOT target replaces the
/// relative bound, and the tightest running target wins.
#[test]
fn the_limit_follows_the_tightest_target() {
    let (mut core, _log, _flood) = warm_flood(slo_cfg(0.2));
    let mut loose = submit(
        &mut core,
        0,
        greedy(prompt(0, 8), 100, SloClass::Interactive).with_tpot_slo_ms(100.0),
    );
    for _ in 0..3 {
        core.step();
    }
    let limit = core
        .sched()
        .last_limit()
        .expect("interactive work bounds the step");
    assert!(
        (limit - 0.100).abs() < 1e-9,
        "absolute TPOT 100 ms: limit {limit}"
    );
    loose.poll();
    let _tight = submit(
        &mut core,
        1,
        greedy(prompt(1, 8), 100, SloClass::Interactive).with_tpot_slo_ms(30.0),
    );
    for _ in 0..3 {
        core.step();
    }
    let limit = core.sched().last_limit().unwrap();
    assert!(
        (limit - 0.030).abs() < 1e-9,
        "tightest target 30 ms: limit {limit}"
    );
    // On average within the target (allowance left unused carries over for a few
    // steps, so single steps may go over).
    let mut total = 0.0;
    for _ in 0..20 {
        core.step();
        total += cost(core.sched().planned_shape());
    }
    let mean = total / 20.0;
    assert!(
        mean <= 0.030 * 1.05,
        "mean step {mean} s (model error under 5%)"
    );
    let _relative = submit(
        &mut core,
        2,
        greedy(prompt(2, 8), 100, SloClass::Interactive),
    );
    for _ in 0..3 {
        core.step();
    }
    // Three interactive rows: 25 ms predicted; relative bound 1.2x = 30 ms.
    let limit = core.sched().last_limit().unwrap();
    assert!(
        (limit - 0.030).abs() < 0.003,
        "relative bound: limit {limit}"
    );
}

/// `max_tpot_stretch`: an absolute TPOT target far above a stream's own step time
/// bounds its steps at that many times the interactive work alone, and so do the
/// lingering steps after it (what an arriving request waits behind).
#[test]
fn a_stretch_bound_caps_a_loose_tpot_target() {
    let mut c = slo_cfg(0.2);
    c.max_tpot_stretch = Some(2.0);
    c.default_tpot_slo_ms = Some(100.0);
    c.interactive_linger_ms = 500;
    c.interactive_followup_ms = 0; // the lingering bound itself, not the follow-up's
    let (mut core, _log, _flood) = warm_flood(c);
    let mut inter = submit(&mut core, 0, greedy(prompt(0, 8), 6, SloClass::Interactive));
    for _ in 0..4 {
        core.step();
    }
    // One interactive decode row: 15 ms; 2x = 30 ms (as the engine's learned cost
    // predicts it), far under the 100 ms target.
    let limit = core
        .sched()
        .last_limit()
        .expect("interactive work bounds the step");
    assert!(
        (0.020..=0.032).contains(&limit),
        "stretch 2x: limit {limit}"
    );
    while !inter.done() {
        core.step();
    }
    // Lingering after the stream ended: the same bound.
    core.step();
    let limit = core.sched().last_limit().expect("a lingering bound");
    assert!((0.020..=0.032).contains(&limit), "lingering: limit {limit}");
    run_to_idle(&mut core, 3000);
    assert_all_blocks_return(&mut core);
}

/// A loose TTFT target does not let batch rows stretch the step a person waits
/// for: the step that runs an interactive prefill stays within the relative bound
/// (1.2x its interactive work), though 60 s of slack would fit the whole flood.
#[test]
fn a_loose_ttft_target_keeps_the_prefill_step_short() {
    let (mut core, log, _flood) = warm_flood(slo_cfg(0.2));
    let mut inter = submit(
        &mut core,
        0,
        greedy(prompt(0, 8), 5, SloClass::Interactive).with_ttft_slo_ms(60_000.0),
    );
    let before = log.lock().unwrap().len();
    core.step();
    inter.poll();
    assert_eq!(inter.tokens.len(), 1, "the prefill ran in the next step");
    // The interactive part: 10 ms + 8 prefill tokens x 2 ms = 26 ms; bound 31.2 ms,
    // room for one 5 ms batch row, where all 8 (66 ms) fit the TTFT slack.
    let batch_rows = rows(&log, before) - 1;
    let (shape, limit) = (core.sched().planned_shape(), core.sched().last_limit());
    assert!(
        batch_rows <= 2,
        "{batch_rows} batch rows beside the prefill"
    );
    assert!(
        cost(shape) <= 0.026 * 1.2 + 0.005,
        "the prefill step costs {} s (limit {limit:?})",
        cost(shape)
    );
    run_to_idle(&mut core, 3000);
    assert_all_blocks_return(&mut core);
}

/// `max_num_seqs` full of batch work: an interactive arrival runs in the next step
/// (a batch sequence is preempted), not after a batch sequence finishes.
#[test]
fn no_priority_inversion_on_a_full_engine() {
    let mut c = slo_cfg(0.2);
    c.max_num_seqs = 4;
    let (mut core, _log) = core_with_cost(c);
    let _flood = batch_flood(&mut core, 4, 300);
    let mut inter = submit(&mut core, 0, greedy(prompt(0, 8), 5, SloClass::Interactive));
    core.step();
    inter.poll();
    assert_eq!(inter.tokens.len(), 1, "first token in the next step");
    assert_eq!(core.sched().counters().preemptions, 1);
    run_to_idle(&mut core, 3000);
    assert_all_blocks_return(&mut core);
}

/// Batch prefill is sized to the time a step's bound leaves: returns the batch
/// prefill tokens of a step beside one interactive decode (15 ms), with the given
/// interference bound.
fn batch_prefill_beside_a_decode(interference: f64) -> usize {
    let (mut core, log) = core_with_cost(slo_cfg(interference));
    // A long batch prompt alone prefills in full chunks.
    let _b = submit(
        &mut core,
        100,
        greedy(prompt(100, 1900), 4, SloClass::Batch),
    );
    for _ in 0..20 {
        core.step();
    }
    let _i = submit(
        &mut core,
        0,
        greedy(prompt(0, 8), 50, SloClass::Interactive),
    );
    for _ in 0..2 {
        core.step();
    }
    let before = log.lock().unwrap().len();
    core.step();
    assert!(cost(core.sched().planned_shape()) <= 0.015 * (1.0 + interference) * 1.05 + 0.0015);
    let n = log.lock().unwrap()[before].num_tokens() - 1;
    n
}

#[test]
fn batch_prefill_is_sized_to_the_time_left() {
    // Bound 22.5 ms: 7.5 ms = 3 prefill tokens (one more when allowance left over
    // from the step before carries over).
    let n = batch_prefill_beside_a_decode(0.5);
    assert!((3..=4).contains(&n), "batch prefill chunk of {n} tokens");
    // Bound 4 x 15 ms = 60 ms: 45 ms = 22 prefill tokens (model error allowed for).
    let n = batch_prefill_beside_a_decode(3.0);
    assert!((16..=23).contains(&n), "batch prefill chunk of {n} tokens");
}

/// The engine's cost model converges on the synthetic cost it observes.
#[test]
fn the_engine_learns_its_step_cost() {
    let (mut core, _log) = core_with_cost(slo_cfg(0.2));
    let _flood = batch_flood(&mut core, 6, 200);
    // Interactive requests arrive every 10 steps with prompts to prefill.
    for i in 0..12 {
        let _c = submit(
            &mut core,
            i,
            greedy(prompt(i, 150), 20, SloClass::Interactive),
        );
        for _ in 0..10 {
            core.step();
        }
    }
    let m = core.sched_mut().cost_model_mut();
    for s in [
        StepShape::of_seq(1, 30, true),
        StepShape::of_seq(64, 0, false) + StepShape::of_seq(1, 30, true),
    ] {
        let (p, t) = (m.predict(&s), cost(&s));
        assert!((p - t).abs() / t < 0.05, "{s:?}: predicted {p}, true {t}");
    }
}

/// Just after interactive work, steps without any stay bounded (the next arrival
/// does not wait behind a full batch step); after `interactive_linger_ms` they
/// are full again.
#[test]
fn steps_stay_short_for_a_while_after_interactive_work() {
    let mut c = slo_cfg(0.5);
    c.interactive_linger_ms = 500;
    let (mut core, log) = core_with_cost(c);
    let _flood = batch_flood(&mut core, 12, 400);
    let mut inter = submit(&mut core, 0, greedy(prompt(0, 8), 3, SloClass::Interactive));
    while !inter.done() {
        core.step();
    }
    // Bounded as beside one decode row (15 ms, 1.5x): at most 2 more rows.
    for _ in 0..5 {
        let before = log.lock().unwrap().len();
        core.step();
        assert!(
            rows(&log, before) <= 3,
            "{} rows right after interactive work",
            rows(&log, before)
        );
        assert!(core.sched().last_limit().is_some());
    }
    // 500 ms later (each step moves the clock by its cost) steps are full again.
    for _ in 0..100 {
        core.step();
    }
    let before = log.lock().unwrap().len();
    core.step();
    assert_eq!(rows(&log, before), 12, "full steps once the linger is over");
    assert_eq!(core.sched().last_limit(), None);
}

/// Just after an interactive request finishes, its client's next request is
/// likely on its way (agents and other closed-loop clients send it at once): for
/// `interactive_followup_ms` steps stay within the relative bound, though the
/// lingering bound under a loose TPOT target is far larger; then they return to it.
#[test]
fn a_finished_interactive_request_keeps_the_next_steps_short() {
    let mut c = slo_cfg(0.2);
    c.default_tpot_slo_ms = Some(100.0);
    c.interactive_linger_ms = 60_000;
    c.interactive_followup_ms = 40;
    let (mut core, log, _flood) = warm_flood(c);
    let mut inter = submit(&mut core, 0, greedy(prompt(0, 8), 6, SloClass::Interactive));
    while !inter.done() {
        core.step();
    }
    // 1.2x the last interactive work (one decode row, 15 ms): 18 ms, where the
    // 100 ms target would let the whole flood (8 rows, 50 ms) join.
    let before = log.lock().unwrap().len();
    core.step();
    let limit = core.sched().last_limit().expect("a bound");
    assert!(limit <= 0.020, "in the follow-up window: limit {limit}");
    assert!(rows(&log, before) < 8, "{} rows", rows(&log, before));
    // 40 ms later (each step moves the clock by its cost): the target's bound.
    for _ in 0..4 {
        core.step();
    }
    let limit = core.sched().last_limit().expect("a lingering bound");
    assert!(limit > 0.05, "after the window: limit {limit}");
    run_to_idle(&mut core, 3000);
    assert_all_blocks_return(&mut core);
}

/// A step limit that nothing fits never stalls the engine: one unit of batch work
/// runs (a decode row), and empty plans do not count as steps.
#[test]
fn a_limit_nothing_fits_still_moves_batch_work() {
    /// `cost` plus 0.1 ms per 1000 context tokens (batch rows, with longer
    /// contexts than the interactive row, cost a little more).
    fn cost_with_context(s: &StepShape) -> f64 {
        cost(s) + 1e-7 * s.context_tokens as f64
    }
    let mut c = slo_cfg(0.0);
    c.interactive_linger_ms = 60_000;
    let (mut core, log) = new_core(c);
    core.set_synthetic_cost(cost_with_context);
    let mut flood = batch_flood(&mut core, 4, 30);
    for _ in 0..20 {
        core.step(); // the model learns the context term
    }
    // Interactive tokens, then a linger as tight as its last decode step: no batch
    // row (longer context) fits.
    let mut inter = submit(&mut core, 0, greedy(prompt(0, 2), 3, SloClass::Interactive));
    while !inter.done() {
        core.step();
    }
    for _ in 0..10 {
        let before = log.lock().unwrap().len();
        core.step();
        assert_eq!(log.lock().unwrap().len(), before + 1, "a step ran");
        assert_eq!(rows(&log, before), 1, "one batch row");
    }
    run_to_idle(&mut core, 1000);
    for c in &mut flood {
        c.poll();
        assert_eq!(c.tokens.len(), 30);
    }
    assert_all_blocks_return(&mut core);
}
