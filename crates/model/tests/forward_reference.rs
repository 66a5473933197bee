//! The forward pass against llama.cpp's reference outputs on the default model:
//! exact mode (f32 on dequantized weights) token for token, fast mode within
//! llama.cpp's own fast-path error.

mod common;
use common::*;
use sloserve_model::Precision;

/// Exact mode: every step-0 top-5 logprob within 2e-3 and the whole greedy
/// continuation equal, on every other short prompt (the rest in `make test-slow`).
#[test]
fn exact_matches_reference_short_prompts() {
    exact_short(Share::MakeTest);
}

/// The other short prompts (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_short_prompts_rest() {
    exact_short(Share::Slow);
}

fn exact_short(share: Share) {
    let mut runner = load_runner(Precision::Exact);
    let records = read_records("llamacpp-f32-greedy-smollm2.jsonl");
    assert_eq!(records.len(), 10, "short prompt records");
    for rec in share.of(records) {
        let steps = rec.greedy_token_ids.len();
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, steps, 0);
        let err = top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        assert!(err < 2e-3, "{}: step-0 top-5 logprob error {err}", rec.id);
        assert_eq!(
            out, rec.greedy_token_ids,
            "{}: greedy continuation differs",
            rec.id
        );
    }
}

/// Exact mode on the long prompts (863-1305 tokens), prefilled in chunks of 64
/// tokens.
#[test]
fn exact_matches_reference_long_prompts_chunked() {
    exact_long(64);
}

/// The same, prefilled in one piece (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_long_prompts_whole() {
    exact_long(0);
}

fn exact_long(chunk: usize) {
    let mut runner = load_runner(Precision::Exact);
    let records = read_records("llamacpp-f32-long-smollm2.jsonl");
    assert_eq!(records.len(), 3, "long prompt records");
    for rec in records {
        let steps = rec.greedy_token_ids.len();
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, steps, chunk);
        let err = top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        assert!(
            err < 2e-3,
            "{} (chunk {chunk}): step-0 top-5 logprob error {err}",
            rec.id
        );
        assert_eq!(
            out, rec.greedy_token_ids,
            "{} (chunk {chunk}): greedy differs",
            rec.id
        );
    }
}

/// Fast mode (llama.cpp's arithmetic: 8-bit activations for prompts too) against
/// the exact reference at step 0: argmax equal on >= 8 of 10 prompts, mean of the
/// per-prompt largest top-5 error <= 0.25 (llama.cpp's own path: 9/10, 0.12; ten
/// samples of the 8-bit rounding noise this tiny model is sensitive to: the
/// comparison with llama.cpp over 261 steps is `teacher_forced.rs`'s). Until stop
/// 18 fast mode ran prompts in f32 and held 9/10 and 0.15. Prints where greedy
/// departs.
#[test]
fn fast_is_within_llamacpp_fast_path_error() {
    let mut runner = load_runner(Precision::Fast);
    let records = read_records("llamacpp-f32-greedy-smollm2.jsonl");
    assert_eq!(records.len(), 10, "short prompt records");
    let (mut argmax_equal, mut err_sum) = (0, 0.0);
    for rec in &records {
        let steps = rec.greedy_token_ids.len();
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, steps, 0);
        let err = top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        err_sum += err;
        if out[0] == rec.greedy_token_ids[0] {
            argmax_equal += 1;
        }
        let departs = out
            .iter()
            .zip(&rec.greedy_token_ids)
            .position(|(a, b)| a != b);
        println!(
            "{}: step-0 top-5 error {err:.4}, greedy departs at {departs:?}",
            rec.id
        );
    }
    let mean = err_sum / records.len() as f32;
    println!(
        "fast: step-0 argmax equal on {argmax_equal}/{}, mean max top-5 error {mean:.4}",
        records.len()
    );
    assert!(
        argmax_equal >= 8,
        "step-0 argmax equal on only {argmax_equal}/10"
    );
    assert!(mean <= 0.25, "mean step-0 top-5 error {mean} > 0.25");
}
