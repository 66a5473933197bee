//! Accuracy of each `--quantize` weight type against the exact reference
//! (`cargo bench -p sloserve-model --bench quant_accuracy [-- --quantize TYPE ...]`):
//! the default model in fast precision, per weight type (the file's own, then each
//! re-quantized one, or only those named), on llama.cpp's ten exact (f32) reference
//! prompts, with the fast-mode reference test's own code (`tests/common`): step-0
//! argmax agreement, the mean over prompts of the largest step-0 top-5 logprob error,
//! and greedy agreement (tokens equal before the first difference). Deterministic, so
//! a busy machine is fine. Also prints the weights' bytes in their effective types.
//! `--exact` runs exact precision instead (f32 products on the same weights: the
//! weights' own error without the 8-bit activations). Writes
//! `target/bench/quant-accuracy.json` (`quant-accuracy-exact.json`).

use sloserve_model::requantize::WeightPlan;
use sloserve_model::{GgufFile, LlamaRunner, Precision, RunnerOptions, WeightType};

#[path = "common.rs"]
mod common;
#[path = "../tests/common/mod.rs"]
mod reference;

use common::target_dir;
use reference::{greedy, model_path, read_records, top5_error};

struct Accuracy {
    argmax_equal: usize,
    prompts: usize,
    mean_top5_error: f32,
    /// Tokens equal to the reference before the first difference, summed over prompts.
    greedy_equal: usize,
    greedy_total: usize,
    /// Prompts whose whole greedy continuation is equal.
    greedy_whole: usize,
}

fn measure(quantize: Option<WeightType>, precision: Precision) -> Accuracy {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(256 << 20),
        quantize,
        ..Default::default()
    };
    let mut runner = LlamaRunner::load(model_path(), &opts).expect("load the default model");
    let records = read_records("llamacpp-f32-greedy-smollm2.jsonl");
    let mut a = Accuracy {
        argmax_equal: 0,
        prompts: records.len(),
        mean_top5_error: 0.0,
        greedy_equal: 0,
        greedy_total: 0,
        greedy_whole: 0,
    };
    for rec in &records {
        let want = &rec.greedy_token_ids;
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, want.len(), 0);
        a.mean_top5_error += top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        a.argmax_equal += usize::from(out[0] == want[0]);
        let equal = out.iter().zip(want).take_while(|(x, y)| x == y).count();
        a.greedy_equal += equal;
        a.greedy_total += want.len();
        a.greedy_whole += usize::from(equal == want.len());
    }
    a.mean_top5_error /= records.len().max(1) as f32;
    a
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let chosen: Vec<Option<WeightType>> = args
        .windows(2)
        .filter(|w| w[0] == "--quantize")
        .map(|w| match w[1].as_str() {
            "none" | "file" => None,
            t => Some(t.parse().unwrap_or_else(|e| panic!("--quantize: {e}"))),
        })
        .collect();
    let types = if chosen.is_empty() {
        std::iter::once(None)
            .chain(WeightType::ALL.map(Some))
            .collect()
    } else {
        chosen
    };
    let exact = args.iter().any(|a| a == "--exact");
    let precision = if exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let content = GgufFile::open(model_path())
        .expect("open the default model")
        .content;
    let mut rows = Vec::new();
    println!(
        "{:<12} {:>12} {:>8} {:>10} {:>16}  weights",
        "weights", "argmax@0", "top5err", "greedy", "whole greedy"
    );
    for ty in types {
        let label = ty.map_or("file".to_string(), |t| t.to_string());
        let a = measure(ty, precision);
        let plan = WeightPlan::new(&content, ty);
        println!(
            "{label:<12} {:>9}/{:<2} {:>8.4} {:>5}/{:<4} {:>13}/{:<2}  {}",
            a.argmax_equal,
            a.prompts,
            a.mean_top5_error,
            a.greedy_equal,
            a.greedy_total,
            a.greedy_whole,
            a.prompts,
            plan.summary()
        );
        rows.push(serde_json::json!({
            "quantize": ty.map(|t| t.name()),
            "argmax_equal": a.argmax_equal,
            "prompts": a.prompts,
            "mean_max_top5_error": a.mean_top5_error,
            "greedy_equal_tokens": a.greedy_equal,
            "greedy_reference_tokens": a.greedy_total,
            "greedy_whole": a.greedy_whole,
            "weight_bytes": plan.bytes(),
            "weights": plan.summary(),
        }));
    }
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("create target/bench");
    let path = dir.join(if exact {
        "quant-accuracy-exact.json"
    } else {
        "quant-accuracy.json"
    });
    let json = serde_json::json!({
        "bench": "quant_accuracy",
        "precision": if exact { "exact" } else { "fast" },
        "results": rows,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("write json");
    println!("wrote {}", path.display());
}
