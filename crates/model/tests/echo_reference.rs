//! Prompt scoring (the engine's `prompt_logprobs`, what `/v1/completions` `echo`
//! returns) against llama.cpp's F32 logits, teacher-forced: each exact greedy
//! record's prompt plus its greedy continuation is submitted as one prompt with
//! `max_tokens` 0, and the scores at the continuation's positions must equal
//! llama.cpp's top-5 logprobs of those steps within 2e-3 (exact precision). All
//! records of a model run on one engine at once, in 64-position scoring chunks
//! (the 863-token SmolLM2 prompt takes 14 of them), beside each other. Kept
//! fast: SmolLM2's ten short records and its shortest long one, Qwen2.5-Coder
//! 0.5B's records of at most 512 prompt tokens.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use sloserve_engine::{Engine, EngineConfig, PromptLogprob, Request};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

const TOL: f32 = 2e-3;

fn load(path: &Path) -> LlamaRunner {
    let opts = RunnerOptions {
        precision: Precision::Exact,
        kv_cache_memory: Some(256 << 20),
        max_model_len: Some(4096),
        ..Default::default()
    };
    LlamaRunner::load(path, &opts).expect("load the model")
}

/// The largest error over every reference logprob of every step of the records
/// of `files` whose prompt is at most `max_prompt` tokens, and the steps checked.
fn check(model: &Path, files: &[&str], max_prompt: usize) -> (f32, usize) {
    let engine = Engine::start(Box::new(load(model)), EngineConfig::default()).unwrap();
    let records: Vec<_> = files
        .iter()
        .flat_map(|f| read_records(f))
        .filter(|r| r.prompt_token_ids.len() <= max_prompt)
        .collect();
    let streams: Vec<_> = records
        .iter()
        .map(|r| {
            let n = r.top5_logprobs_per_step.len().min(r.greedy_token_ids.len());
            let mut prompt = r.prompt_token_ids.clone();
            prompt.extend_from_slice(&r.greedy_token_ids[..n]);
            let req = Request::greedy(prompt, 0).with_prompt_logprobs(20);
            engine.submit(req).unwrap()
        })
        .collect();
    let (mut worst, mut steps) = (0f32, 0);
    for (r, s) in records.iter().zip(streams) {
        let done = s.collect_blocking();
        assert!(done.tokens.is_empty(), "{}: max_tokens 0 generated", r.id);
        let p = r.prompt_token_ids.len();
        let n = r.top5_logprobs_per_step.len().min(r.greedy_token_ids.len());
        assert_eq!(done.prompt_logprobs.len(), p + n - 1, "{}", r.id);
        for j in 0..n {
            let ours: &PromptLogprob = &done.prompt_logprobs[p + j - 1];
            assert_eq!(ours.id, r.greedy_token_ids[j]);
            let top: HashMap<u32, f32> = ours.top_logprobs.iter().copied().collect();
            for t in &r.top5_logprobs_per_step[j] {
                let lp = *top
                    .get(&t.id)
                    .unwrap_or_else(|| panic!("{} step {j}: {} not in our top 20", r.id, t.id));
                let err = (lp - t.logprob).abs();
                assert!(
                    err <= TOL,
                    "{} step {j} token {}: {lp} vs {}",
                    r.id,
                    t.id,
                    t.logprob
                );
                worst = worst.max(err);
                if t.id == ours.id {
                    assert!((ours.logprob - t.logprob).abs() <= TOL);
                }
            }
            steps += 1;
        }
    }
    (worst, steps)
}

#[test]
fn smollm2_scores_match_llamacpp_f32() {
    let (worst, steps) = check(
        &model_path(),
        &[
            "llamacpp-f32-greedy-smollm2.jsonl",
            "llamacpp-f32-long-smollm2.jsonl",
        ],
        900,
    );
    eprintln!("SmolLM2: {steps} steps, largest top-5 logprob error {worst:.2e}");
}

#[test]
fn qwen05_scores_match_llamacpp_f32() {
    // The short prompts only: the 2,172-token one costs a minute in exact mode.
    let (worst, steps) = check(&qwen05_path(), &["llamacpp-f32-greedy-qwen0.5b.jsonl"], 512);
    eprintln!("Qwen2.5-Coder 0.5B: {steps} steps, largest top-5 logprob error {worst:.2e}");
}
