//! `--kv-cache-type q8_0` and `q4_0` on the real default model (SmolLM2-135M Q4_1,
//! fast precision): the top-5 logprob error against the f16-KV path, teacher-forced on
//! the f16 path's own greedy continuations of the ten reference prompts, beside
//! llama.cpp's error for the same KV types against its f16 KV on the same prompts
//! (`tests/data/llamacpp-kvquant-smollm2.jsonl`, made by `scripts/kv_quant_reference.py`);
//! the bytes per token; and batch invariance with quantized blocks.

mod common;
use std::collections::HashMap;

use common::*;
use sloserve_engine::{Batch, KvCacheType, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

fn load(kv: KvCacheType) -> LlamaRunner {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: Some(64 << 20),
        kv_cache_type: kv,
        ..Default::default()
    };
    LlamaRunner::load(model_path(), &opts).expect("load the default model")
}

/// The logits rows of `prompt` followed by `forced` fed one token at a time: row j
/// predicts the token after `prompt + forced[..j]`.
fn teacher_forced(r: &mut LlamaRunner, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let bs = r.info().block_size;
    let table: Vec<u32> = (0..(prompt.len() + forced.len()).div_ceil(bs) as u32).collect();
    let (mut batch, mut logits) = (Batch::default(), Logits::default());
    batch.push(prompt, 0, &table[..prompt.len().div_ceil(bs)], true);
    r.execute(&batch, &mut logits).unwrap();
    let mut rows = vec![logits.row(0).to_vec()];
    for (j, &t) in forced[..forced.len() - 1].iter().enumerate() {
        let pos = prompt.len() + j;
        batch.clear();
        batch.push(&[t], pos, &table[..(pos + 1).div_ceil(bs)], true);
        r.execute(&batch, &mut logits).unwrap();
        rows.push(logits.row(0).to_vec());
    }
    rows
}

/// Mean and largest (over steps) of the largest top-5 logprob error of a step.
#[derive(Debug, Default)]
struct Error {
    mean: f32,
    max: f32,
    steps: usize,
}

impl Error {
    fn of(per_step: &[f32]) -> Error {
        Error {
            mean: per_step.iter().sum::<f32>() / per_step.len() as f32,
            max: per_step.iter().cloned().fold(0.0, f32::max),
            steps: per_step.len(),
        }
    }
}

const STEPS: usize = 32;

/// Ours: each quantized type's error against our f16 KV, per step.
fn ours(types: &[KvCacheType]) -> Vec<Error> {
    let records = read_records("llamacpp-greedy-smollm2-q4_1.jsonl");
    let mut f16 = load(KvCacheType::F16);
    let base: Vec<(Vec<u32>, Vec<Vec<f32>>)> = records
        .iter()
        .map(|rec| greedy_until(&mut f16, &rec.prompt_token_ids, STEPS, 0, &[]))
        .collect();
    drop(f16);
    types
        .iter()
        .map(|&kv| {
            let mut r = load(kv);
            let mut errs = Vec::new();
            for (rec, (tokens, rows)) in records.iter().zip(&base) {
                let q = teacher_forced(&mut r, &rec.prompt_token_ids, tokens);
                for (a, b) in q.iter().zip(rows) {
                    let lb = log_softmax(b);
                    let mut ids: Vec<usize> = (0..lb.len()).collect();
                    ids.select_nth_unstable_by(5, |&x, &y| lb[y].total_cmp(&lb[x]));
                    let top5: Vec<TopLogprob> = ids[..5]
                        .iter()
                        .map(|&i| TopLogprob {
                            id: i as u32,
                            logprob: lb[i],
                        })
                        .collect();
                    errs.push(top5_error(a, &top5));
                }
            }
            Error::of(&errs)
        })
        .collect()
}

/// llama.cpp's, from its records: per step, the largest |logprob| difference over its
/// f16 KV's top 5 (ids missing from the quantized run's top 10 count its tenth's).
fn llamacpp(kind: &str) -> Error {
    let mut errs = Vec::new();
    for rec in reference_json("llamacpp-kvquant-smollm2.jsonl") {
        let base = rec["f16"]["top5_logprobs_per_step"].as_array().unwrap();
        let quant = rec[kind]["top10_logprobs_per_step"].as_array().unwrap();
        for (b, q) in base.iter().zip(quant) {
            let q: HashMap<u64, f64> = q
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["id"].as_u64().unwrap(), t["logprob"].as_f64().unwrap()))
                .collect();
            let floor = q.values().cloned().fold(f64::INFINITY, f64::min);
            let e = b
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let (id, lp) = (t["id"].as_u64().unwrap(), t["logprob"].as_f64().unwrap());
                    (lp - q.get(&id).copied().unwrap_or(floor)).abs()
                })
                .fold(0.0, f64::max);
            errs.push(e as f32);
        }
    }
    Error::of(&errs)
}

/// Each quantized type's error against f16 KV is about llama.cpp's for the same type
/// against its f16 KV on the same prompts (llama.cpp's own f16 run teacher-forced is
/// exactly its greedy run: its error is the KV type's alone).
#[test]
fn quantized_kv_error_against_f16_kv_is_at_most_llamacpps() {
    let ours = ours(&[KvCacheType::Q8_0, KvCacheType::Q4_0]);
    for (kind, e) in ["q8_0", "q4_0"].iter().zip(&ours) {
        let l = llamacpp(kind);
        println!(
            "{kind} vs f16 KV, top-5 logprob error per step: ours mean {:.4} max {:.4} \
             ({} steps); llama.cpp mean {:.4} max {:.4} ({} steps)",
            e.mean, e.max, e.steps, l.mean, l.max, l.steps
        );
    }
    let (q8, l8) = (&ours[0], llamacpp("q8_0"));
    // Measured (2026-12-07, both with the Hadamard rotation): ours mean 0.1999 max
    // 0.975, llama.cpp mean 0.1991 max 1.214 over the same 320 steps (q4_0: 0.749 and
    // 4.16, 0.744 and 3.70). Without the rotation ours were 0.207 and 1.348.
    assert!(q8.mean <= 1.05 * l8.mean, "q8_0 mean {q8:?} vs {l8:?}");
    assert!(q8.max <= l8.max, "q8_0 max {q8:?} vs {l8:?}");
    let (q4, l4) = (&ours[1], llamacpp("q4_0"));
    assert!(q4.mean <= 1.05 * l4.mean, "q4_0 mean {q4:?} vs {l4:?}");
}

/// Bytes per token: 34/64 of f16's with q8_0, 18/64 with q4_0.
#[test]
fn quantized_blocks_count_their_bytes() {
    let per_token = |kv| load(kv).info().kv_bytes_per_token;
    let f16 = per_token(KvCacheType::F16);
    // SmolLM2-135M: 30 layers, 3 KV heads of 64: 2 x 30 x 192 x 2 bytes.
    assert_eq!(f16, 23_040);
    assert_eq!(per_token(KvCacheType::Q8_0) * 64, f16 * 34);
    assert_eq!(per_token(KvCacheType::Q4_0) * 64, f16 * 18);
    // The same budget holds 64/34 (1.88x) the blocks with q8_0.
    let blocks = |kv| load(kv).info().num_kv_blocks;
    let (b16, b8) = (blocks(KvCacheType::F16), blocks(KvCacheType::Q8_0));
    let ratio = b8 as f64 / b16 as f64;
    assert!((ratio - 64.0 / 34.0).abs() < 0.01, "{b8} vs {b16} blocks");
}

/// With quantized blocks a sequence's logits in a mixed batch equal its logits alone,
/// bit for bit, and chunked prefill equals one piece.
#[test]
fn quantized_kv_is_batch_invariant() {
    let prompt = |seed: u32, len: u32| -> Vec<u32> {
        (0..len)
            .map(|i| 100 + (i * 7919 + seed * 104729) % 20000)
            .collect()
    };
    for kv in [KvCacheType::Q8_0, KvCacheType::Q4_0] {
        let (a, b) = (prompt(1, 40), prompt(2, 50));
        let mut r = load(kv);
        let (mut batch, mut out) = (Batch::default(), Logits::default());
        batch.push(&a, 0, &[0, 1, 2], true);
        r.execute(&batch, &mut out).unwrap();
        let a_alone = out.row(0).to_vec();
        batch.clear();
        batch.push(&b, 0, &[3, 4, 5, 6], true);
        r.execute(&batch, &mut out).unwrap();
        let b_alone = out.row(0).to_vec();
        // Both at once, in other blocks, B's prompt in two chunks (its first beside
        // nothing, its second beside A's whole prompt).
        batch.clear();
        batch.push(&b[..21], 0, &[10, 11], false);
        r.execute(&batch, &mut out).unwrap();
        batch.clear();
        batch.push(&a, 0, &[20, 21, 22], true);
        batch.push(&b[21..], 21, &[10, 11, 12, 13], true);
        r.execute(&batch, &mut out).unwrap();
        assert_eq!(out.row(0), &a_alone[..], "{kv:?}: A beside B");
        assert_eq!(out.row(1), &b_alone[..], "{kv:?}: B chunked, beside A");
    }
}
