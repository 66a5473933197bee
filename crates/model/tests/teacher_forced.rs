//! Each precision's error at every step of llama.cpp's exact greedy continuations,
//! teacher-forced (the prompt plus the reference's first j tokens, prefilled in one
//! piece), beside llama.cpp's own fast path on the steps where its continuation
//! still equals the exact one: 261 steps instead of the ten step-0 samples of
//! `forward_reference.rs`, so the 8-bit paths' rounding noise averages out.

mod common;
use std::collections::HashMap;

use common::*;
use sloserve_model::Precision;

/// Mean of the largest top-5 logprob error per step, and argmax agreement.
#[derive(Debug)]
struct Error {
    mean_top5: f32,
    argmax_equal: usize,
    steps: usize,
}

impl Error {
    fn argmax_share(&self) -> f32 {
        self.argmax_equal as f32 / self.steps as f32
    }
}

/// Every `every`-th record of `name` (1: all).
fn records(name: &str, every: usize) -> Vec<GreedyRecord> {
    read_records(name).into_iter().step_by(every).collect()
}

fn ours(precision: Precision, every: usize) -> Error {
    let mut runner = load_runner(precision);
    let (mut sum, mut equal, mut steps) = (0.0, 0, 0);
    for rec in records("llamacpp-f32-greedy-smollm2.jsonl", every) {
        for (j, top5) in rec.top5_logprobs_per_step.iter().enumerate() {
            let mut ctx = rec.prompt_token_ids.clone();
            ctx.extend_from_slice(&rec.greedy_token_ids[..j]);
            let (out, rows) = greedy(&mut runner, &ctx, 1, 0);
            sum += top5_error(&rows[0], top5);
            equal += (out[0] == rec.greedy_token_ids[j]) as usize;
            steps += 1;
        }
    }
    Error {
        mean_top5: sum / steps as f32,
        argmax_equal: equal,
        steps,
    }
}

/// llama.cpp's fast path (its records on the Q4_1 file) against the exact records,
/// on the steps before its greedy continuation leaves the exact one.
fn llamacpp(every: usize) -> Error {
    let exact = records("llamacpp-f32-greedy-smollm2.jsonl", every);
    let fast = records("llamacpp-greedy-smollm2-q4_1.jsonl", every);
    let (mut sum, mut equal, mut steps) = (0.0, 0, 0);
    for (e, f) in exact.iter().zip(&fast) {
        assert_eq!(e.prompt_token_ids, f.prompt_token_ids);
        let n = e
            .top5_logprobs_per_step
            .len()
            .min(f.top5_logprobs_per_step.len());
        for j in 0..n.min(f.greedy_token_ids.len()) {
            if f.greedy_token_ids[..j] != e.greedy_token_ids[..j] {
                break;
            }
            let reference: HashMap<u32, f32> = e.top5_logprobs_per_step[j]
                .iter()
                .map(|t| (t.id, t.logprob))
                .collect();
            sum += f.top5_logprobs_per_step[j]
                .iter()
                .filter_map(|t| reference.get(&t.id).map(|l| (l - t.logprob).abs()))
                .fold(0.0, f32::max);
            equal += (f.greedy_token_ids[j] == e.greedy_token_ids[j]) as usize;
            steps += 1;
        }
    }
    Error {
        mean_top5: sum / steps as f32,
        argmax_equal: equal,
        steps,
    }
}

/// Fast precision (llama.cpp's arithmetic: 8-bit activations for prompts and
/// decode alike) is as accurate as llama.cpp's fast path within the 8-bit rounding
/// noise: mean error within 10% and argmax agreement within 2 points. `every`:
/// every record (1) or every other one (2).
fn fast_against_llamacpp(every: usize, min_steps: usize) {
    let theirs = llamacpp(every);
    let fast = ours(Precision::Fast, every);
    println!("llama.cpp fast path: {theirs:?}\nfast: {fast:?}");
    assert!(theirs.steps >= min_steps, "{theirs:?}");
    assert!(
        fast.mean_top5 <= 1.1 * theirs.mean_top5,
        "{fast:?} vs {theirs:?}"
    );
    assert!(
        fast.argmax_share() >= theirs.argmax_share() - 0.02,
        "{fast:?} vs {theirs:?}"
    );
}

/// Every other record (each step a whole prefill: `make test`'s share).
#[test]
fn fast_precision_against_llamacpp_at_every_step() {
    fast_against_llamacpp(2, 50);
}

/// All 261 steps (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn fast_precision_against_llamacpp_at_every_step_of_every_record() {
    fast_against_llamacpp(1, 100);
}
