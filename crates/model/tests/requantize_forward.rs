//! `--quantize` end to end: the default model re-quantized at load to each weight
//! type runs a forward whose step-0 logits change where the weights changed and stay
//! close to llama.cpp's exact reference (argmax and top-5 logprobs).

mod common;
use common::*;
use sloserve_engine::ModelRunner;
use sloserve_model::requantize::WeightPlan;
use sloserve_model::{GgufFile, LlamaRunner, Precision, RunnerOptions, WeightType};

fn load(quantize: Option<WeightType>) -> LlamaRunner {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: Some(32 << 20),
        max_model_len: Some(256),
        quantize,
        ..Default::default()
    };
    LlamaRunner::load(model_path(), &opts).expect("load the default model")
}

/// Step-0 logits of each of the ten exact-reference prompts.
fn step0(runner: &mut LlamaRunner, records: &[GreedyRecord]) -> Vec<Vec<f32>> {
    records
        .iter()
        .map(|r| greedy(runner, &r.prompt_token_ids, 1, 0).1.remove(0))
        .collect()
}

/// Loads with `ty`; checks against the reference (at least `min_argmax` of 10
/// step-0 argmaxes equal, mean top-5 error at most `max_err`) and that the logits
/// differ from the file's exactly when `--quantize` changes some tensor's type.
fn check(ty: WeightType, min_argmax: usize, max_err: f32) {
    let records = read_records("llamacpp-f32-greedy-smollm2.jsonl");
    let file_rows = step0(&mut load(None), &records);
    let mut runner = load(Some(ty));
    assert_eq!(runner.info().vocab_size, 49152);
    let rows = step0(&mut runner, &records);
    let (mut equal, mut err) = (0, 0.0);
    for (row, rec) in rows.iter().zip(&records) {
        assert!(row.iter().all(|x| x.is_finite()), "{ty}: non-finite logits");
        equal += usize::from(argmax(row) == rec.greedy_token_ids[0]);
        err += top5_error(row, &rec.top5_logprobs_per_step[0]) / records.len() as f32;
    }
    println!("{ty}: step-0 argmax equal on {equal}/10, mean max top-5 error {err:.4}");
    assert!(equal >= min_argmax, "{ty}: argmax equal on {equal}/10");
    assert!(err <= max_err, "{ty}: mean top-5 error {err}");
    let content = GgufFile::open(model_path()).unwrap().content;
    let changes = WeightPlan::new(&content, Some(ty))
        .tensors
        .iter()
        .any(|(_, from, to, _)| from != to);
    assert_eq!(
        rows != file_rows,
        changes,
        "{ty}: logits changed = {}, yet the plan changes a type = {changes}",
        rows != file_rows
    );
}

/// The 8-bit types' bounds are those of 8-bit activations on this sensitive model
/// (fast precision rounds prompts' activations too since stop 19: 8/10 and ~0.2 on
/// the file's own Q4_1, where llama.cpp's path measures 9/10 and 0.12).
#[test]
fn q8_0_forward() {
    check(WeightType::Q8_0, 8, 0.25);
}

/// Q4_1 -> Q4_0 costs much accuracy on this small model (exact precision on the same
/// weights measures the same: 5/10, 2.35), so the bounds only say the output is sane.
#[test]
fn q4_0_forward() {
    check(WeightType::Q4_0, 4, 3.0);
}

#[test]
fn q4_1_forward() {
    check(WeightType::Q4_1, 8, 0.25);
}

#[test]
fn f16_forward() {
    check(WeightType::F16, 10, 0.02);
}

/// f16 weights decode on their own rows kernel (f32 products of the widened
/// weights): the 4-bit file's values are exact in f16, so greedy decoding follows
/// the exact reference as closely as exact mode's f32 products do: the first 16
/// tokens of every prompt (fewer where the reference stopped at EOS) (prompts and decode steps both in fast precision).
#[test]
fn f16_decode_follows_the_exact_greedy_reference() {
    let records = read_records("llamacpp-f32-greedy-smollm2.jsonl");
    let mut runner = load(Some(WeightType::F16));
    for r in &records {
        let n = r.greedy_token_ids.len().min(16);
        let (tokens, _) = greedy(&mut runner, &r.prompt_token_ids, n, 0);
        assert_eq!(tokens, r.greedy_token_ids[..n], "{}", r.id);
    }
}

/// The plan names the output matrix's type as llama-quantize would here (Q8_0: the
/// 576-value rows are not a multiple of 256) and every other matrix the chosen one.
#[test]
fn plan_follows_llama_quantize() {
    let content = GgufFile::open(model_path()).unwrap().content;
    let plan = WeightPlan::new(&content, Some(WeightType::Q4_0));
    let ty = |name: &str| plan.tensors.iter().find(|t| t.0 == name).unwrap().2;
    use candle_core::quantized::GgmlDType as D;
    assert_eq!(ty("token_embd.weight"), D::Q8_0, "tied output matrix");
    assert_eq!(ty("blk.0.attn_q.weight"), D::Q4_0);
    assert_eq!(ty("blk.29.ffn_down.weight"), D::Q4_0);
    assert_eq!(ty("blk.0.attn_norm.weight"), D::F32);
    let f16 = WeightPlan::new(&content, Some(WeightType::F16));
    assert!(f16.bytes() > plan.bytes());
}
