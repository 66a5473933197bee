//! A mixture's two expert paths give the same bits: the chosen experts multiplied in
//! two jobs a step (`decoder/moe_panels.rs`, where every expert is 8-bit panels) and
//! one expert at a time (`SLOSERVE_MOE=per-expert`), on the generated files of each
//! mixture family (`make models-generated`): a prompt, a decode row and a second
//! prompt in one batch, so that experts run zero, one and many rows. One test in its
//! own binary: it sets the environment between loads, with no other thread running.

mod common;

use common::repo_root;
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions, WeightType};

fn load(name: &str, quantize: Option<WeightType>) -> LlamaRunner {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: Some(64 << 20),
        quantize,
        ..Default::default()
    };
    let path = repo_root().join(format!("models/generated/{name}.gguf"));
    LlamaRunner::load(&path, &opts).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
}

/// Every row's logits, bits, of one batch: two prompts and a one-token row.
fn logits(r: &mut LlamaRunner) -> Vec<u32> {
    let prompts: [Vec<u32>; 3] = [
        (0..40).map(|i| 100 + i * 37 % 900).collect(),
        vec![7],
        (0..23).map(|i| 50 + i * 11 % 700).collect(),
    ];
    let mut batch = Batch::default();
    let mut next = 0u32;
    for p in &prompts {
        let blocks = p.len().div_ceil(r.info().block_size) as u32;
        batch.push(p, 0, &(next..next + blocks).collect::<Vec<_>>(), true);
        next += blocks;
    }
    let mut out = Logits::default();
    r.execute(&batch, &mut out).expect("a step");
    (0..3)
        .flat_map(|i| out.row(i).to_vec())
        .map(f32::to_bits)
        .collect()
}

#[test]
fn two_jobs_give_the_per_expert_bits() {
    let cases = [
        ("qwen3moe", Some(WeightType::Q8_0)),
        ("qwen2moe", Some(WeightType::Q8_0)),
        ("mixtral", Some(WeightType::Q4_0)),
        ("gpt-oss", None),
    ];
    for (name, quantize) in cases {
        std::env::remove_var("SLOSERVE_MOE");
        let mut r = load(name, quantize);
        let (layers, two) = r.model().expert_layers();
        assert!(
            layers > 0 && two == layers,
            "{name}: {two} of {layers} layers in two jobs"
        );
        let joint = logits(&mut r);
        drop(r);
        std::env::set_var("SLOSERVE_MOE", "per-expert");
        let mut r = load(name, quantize);
        assert_eq!(r.model().expert_layers(), (layers, 0), "{name}: per expert");
        let apart = logits(&mut r);
        std::env::remove_var("SLOSERVE_MOE");
        let differ = joint.iter().zip(&apart).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "{name} {quantize:?}: {differ} logits differ between the paths"
        );
    }
}
