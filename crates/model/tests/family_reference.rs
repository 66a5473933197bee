//! The families sloserve has no real weights for (Llama 3.1 `rope_freqs`, Mixtral-style
//! `llama` with experts, Qwen2 with YaRN, Qwen2-MoE with its shared expert, Qwen3-MoE,
//! gpt-oss, Phi-3.5-mini and Phi-4-mini with LongRoPE), on small files in each
//! architecture's exact GGUF layout that `scripts/make_family_models.py` writes
//! (`make models-generated`), against llama.cpp's F32
//! records on the same files (`scripts/make_family_reference.py`): exact precision within
//! 2e-3 of every step's top-5 logprobs and greedy-equal over 32 tokens, on prompts up to
//! 2,100 tokens (prefilled in chunks). gpt-oss's experts are MXFP4: exact precision on that
//! file is checked against llama.cpp's F32 records on its twin (`gpt-oss-f32`: the same
//! values as F32), and fast precision against llama.cpp on the MXFP4 file itself (8-bit
//! activations in both). A mixture's rows are batch-invariant: a sequence's logits are the
//! same bits alone and beside others, in both precisions and under `--quantize q8_0`.
//! phi3's LongRoPE factors are chosen by the served context: the file is checked at
//! 4,096 (long) and 1,024 (short) against llama.cpp at those contexts.

mod common;

use std::path::PathBuf;

use common::*;
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::config::Activation;
use sloserve_model::family::Gating;
use sloserve_model::kv_cache::KvDtype;
use sloserve_model::rope::RopeFactors;
use sloserve_model::{GgufFile, LlamaRunner, ModelConfig, Precision, RunnerOptions, WeightType};

/// (model file, the records it is checked against): gpt-oss's MXFP4 file against the F32
/// records of its twin, and the twin (F32 experts, as the converter writes an unquantized
/// checkpoint) against them too.
const FAMILIES: [(&str, &str); 9] = [
    ("llama3", "llama3"),
    ("mixtral", "mixtral"),
    ("qwen2-yarn", "qwen2-yarn"),
    ("qwen2moe", "qwen2moe"),
    ("qwen3moe", "qwen3moe"),
    ("gpt-oss", "gpt-oss-f32"),
    ("gpt-oss-f32", "gpt-oss-f32"),
    ("phi3", "phi3"),
    ("phi4-mini", "phi4-mini"),
];
const EXACT_TOL: f32 = 2e-3;

fn generated(name: &str) -> PathBuf {
    let p = repo_root().join(format!("models/generated/{name}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run `make models-generated` first",
        p.display()
    );
    p
}

fn load(name: &str, precision: Precision, quantize: Option<WeightType>) -> LlamaRunner {
    load_kv(name, precision, quantize, None)
}

fn load_kv(
    name: &str,
    precision: Precision,
    quantize: Option<WeightType>,
    kv_dtype: Option<KvDtype>,
) -> LlamaRunner {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(64 << 20),
        quantize,
        kv_dtype,
        ..Default::default()
    };
    LlamaRunner::load(generated(name), &opts).unwrap_or_else(|e| panic!("load {name}: {e}"))
}

/// The records, after checking that the file here is the one they were made on (the
/// generator is deterministic; a different numpy or gguf would show here first).
fn records(name: &str) -> Vec<GreedyRecord> {
    let recs = records_on(name, name);
    assert_eq!(recs.len(), 5, "{name}: five prompts");
    assert!(recs.iter().any(|r| r.prompt_token_ids.len() > 2000));
    recs
}

/// Records `name`, made on the generated file `model` (checked as `records` does).
fn records_on(model: &str, name: &str) -> Vec<GreedyRecord> {
    use sha2::{Digest, Sha256};
    let file = format!("llamacpp-f32-family-{name}.jsonl");
    let want = reference_json(&file)[0]["model_sha256"]
        .as_str()
        .expect("model_sha256")
        .to_string();
    let bytes = std::fs::read(generated(model)).expect("read the generated model");
    let got: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        got, want,
        "{name}: models/generated/{model}.gguf is not the file llama.cpp's records were made on"
    );
    read_records(&file)
}

#[test]
fn configs_name_their_family() {
    let cfg = |n: &str| ModelConfig::from_gguf(&GgufFile::open(generated(n)).unwrap()).unwrap();
    let m = cfg("qwen3moe").moe.expect("qwen3moe has experts");
    assert_eq!((m.experts, m.used, m.ffn, m.shared_ffn), (8, 4, 64, None));
    assert!(m.rules.norm_weights);
    let m = cfg("qwen2moe").moe.expect("qwen2moe has experts");
    assert_eq!(
        (m.used, m.shared_ffn, m.rules.norm_weights),
        (2, Some(128), false)
    );
    let m = cfg("mixtral")
        .moe
        .expect("llama with expert_count has experts");
    assert_eq!((m.experts, m.ffn), (8, 256));
    assert!(cfg("llama3").moe.is_none());
    let oss = cfg("gpt-oss");
    let m = oss.moe.expect("gpt-oss has experts");
    assert_eq!((m.experts, m.used, m.ffn, m.shared_ffn), (8, 4, 64, None));
    assert_eq!(m.rules.gating, Gating::SoftmaxChosen);
    assert!(m.rules.biases && !m.rules.norm_weights);
    assert_eq!(
        (oss.head_dim, oss.q_size(), oss.hidden_size),
        (64, 256, 128)
    );
    let sw = oss.sliding_window.expect("gpt-oss slides");
    assert_eq!((sw.window, sw.pattern, sw.rope_scaled), (128, 2, true));
    assert_eq!(
        (oss.layer_window(0), oss.layer_window(1)),
        (Some(128), None)
    );
    assert_eq!(oss.rope_scaling.freq_scale, 1.0 / 32.0);
    assert!(matches!(oss.activation, Activation::SwigluOai { .. }));
    let phi = cfg("phi3");
    assert_eq!(
        phi.rope_factors,
        RopeFactors::LongShort { orig_ctx: 1024 },
        "phi3 reads LongRoPE's factors"
    );
    assert_eq!(
        phi.rope_factors.tensor(phi.context_length),
        Some("rope_factors_long.weight")
    );
    // The file's attention factor, sqrt(1 + ln 4 / ln 1024), no other scaling; the
    // file's sliding window ignored, as llama.cpp does.
    let r = phi.rope_scaling;
    assert_eq!((r.freq_scale, r.ext_factor), (1.0, 0.0));
    assert!(
        (r.attn_factor - 1.2f32.sqrt()).abs() < 1e-6,
        "{}",
        r.attn_factor
    );
    assert!(phi.sliding_window.is_none());
    assert_eq!((phi.rope_dims, phi.head_dim, phi.num_kv_heads), (32, 32, 4));
    // Phi-4-mini's layout: 24 of each head's 32 dimensions turned, KV heads grouped, tied.
    let phi4 = cfg("phi4-mini");
    assert_eq!(
        (phi4.rope_dims, phi4.head_dim, phi4.num_kv_heads),
        (24, 32, 2)
    );
    assert!(phi4.tied_embeddings && !phi.tied_embeddings);
    let yarn = cfg("qwen2-yarn").rope_scaling;
    assert_eq!(
        (yarn.freq_scale, yarn.ext_factor, yarn.orig_ctx),
        (0.25, 1.0, 1024)
    );
}

/// Exact precision against llama.cpp's F32 records, every family. A step whose token's
/// text is not whole UTF-8 has no top-5 in llama-server's answer (its id is still
/// compared); at most one step in twenty may lack it.
#[test]
fn exact_matches_llamacpp_f32() {
    for (model, name) in FAMILIES {
        let mut r = load(model, Precision::Exact, None);
        let recs = records(name);
        let steps: usize = recs.iter().map(|r| r.top5_logprobs_per_step.len()).sum();
        let bare = recs
            .iter()
            .flat_map(|r| &r.top5_logprobs_per_step)
            .filter(|s| s.is_empty())
            .count();
        assert!(
            bare * 20 <= steps,
            "{name}: {bare} of {steps} steps without a top-5"
        );
        for rec in recs {
            assert_eq!(rec.greedy_token_ids.len(), 32, "{name} {}", rec.id);
            let chunk = if rec.prompt_token_ids.len() > 512 {
                384
            } else {
                0
            };
            let (ids, rows) = greedy_until(&mut r, &rec.prompt_token_ids, 32, chunk, &[]);
            let mut worst = 0f32;
            for (step, (row, want)) in rows.iter().zip(&rec.top5_logprobs_per_step).enumerate() {
                let e = top5_error(row, want);
                assert!(
                    e <= EXACT_TOL,
                    "{name} {} step {step}: top-5 error {e}",
                    rec.id
                );
                worst = worst.max(e);
            }
            assert_eq!(ids, rec.greedy_token_ids, "{name} {}: greedy", rec.id);
            eprintln!(
                "{model} {}: {} prompt tokens, worst top-5 error {worst:.2e}",
                rec.id,
                rec.prompt_token_ids.len()
            );
        }
    }
}

/// Runs `r` (the generated file `model`) over `name`'s records: each step's top-5 error against them (up to the
/// first greedy difference), and whether each greedy run equals theirs.
fn against(r: &mut LlamaRunner, model: &str, name: &str) -> Vec<(String, Vec<f32>, bool)> {
    let recs = records_on(model, name);
    assert_eq!(recs.len(), 5, "{name}: five prompts");
    recs.iter()
        .map(|rec| {
            let chunk = if rec.prompt_token_ids.len() > 512 {
                384
            } else {
                0
            };
            let (ids, rows) = greedy_until(r, &rec.prompt_token_ids, 32, chunk, &[]);
            // Up to the first greedy difference (past it the texts differ).
            let same = ids
                .iter()
                .zip(&rec.greedy_token_ids)
                .take_while(|(a, b)| a == b)
                .count();
            let errors = rows
                .iter()
                .zip(&rec.top5_logprobs_per_step)
                .take(same + 1)
                .map(|(row, want)| top5_error(row, want))
                .collect();
            (rec.id.clone(), errors, ids == rec.greedy_token_ids)
        })
        .collect()
}

/// gpt-oss in fast precision against llama.cpp on the MXFP4 file, both with an F32 KV
/// cache: both multiply the experts with activations rounded to Q8_0 blocks (llama.cpp's
/// `mxfp4 x q8_0` dot, ours on the Q8_0 blocks that hold the MXFP4 values), so they agree
/// as closely as the exact paths do, greedy-equal. This small model is sensitive: 8-bit
/// activations alone move its first-step logprobs 0.1-0.3 from the F32 reference, in
/// llama.cpp as here, and a few steps where some difference decides a near-tie (2 of
/// 160: 5.6e-3 and 0.11, both on the 2,100-token prompt, each alone: the steps around
/// them are back near 6e-5) are allowed, one step in twenty at most.
#[test]
fn gpt_oss_fast_matches_llamacpp_mxfp4() {
    let mut r = load_kv("gpt-oss", Precision::Fast, None, Some(KvDtype::F32));
    let (mut steps, mut off) = (0, 0);
    for (id, errors, greedy) in against(&mut r, "gpt-oss", "gpt-oss") {
        let (near, far): (Vec<f32>, Vec<f32>) = errors.iter().partition(|&&e| e <= EXACT_TOL);
        let worst = near.iter().fold(0f32, |a, &e| a.max(e));
        eprintln!(
            "gpt-oss fast, f32 KV, {id}: {} of {} steps within {EXACT_TOL} (worst {worst:.2e}), \
             the others {far:?}, greedy-equal {greedy}",
            near.len(),
            errors.len(),
        );
        assert!(greedy, "gpt-oss fast {id}: greedy");
        steps += errors.len();
        off += far.len();
    }
    assert!(
        off * 20 <= steps,
        "gpt-oss fast: {off} of {steps} steps past {EXACT_TOL}"
    );
}

/// The largest difference between two steps' top-5 logprobs on the ids both list.
fn step_gap(a: &[TopLogprob], b: &[TopLogprob]) -> f32 {
    a.iter()
        .flat_map(|x| {
            b.iter()
                .filter(move |y| y.id == x.id)
                .map(move |y| (x.logprob - y.logprob).abs())
        })
        .fold(0f32, f32::max)
}

/// Fast precision as served (f16 KV cache) is no further from llama.cpp's F32 reference
/// than llama.cpp's own MXFP4 run is, on each prompt's first step (after its prefill;
/// later steps follow greedy paths that part), summed over the prompts, within 25%.
#[test]
fn gpt_oss_fast_is_as_near_f32_as_llamacpp_mxfp4() {
    let (exact, mx) = (records("gpt-oss-f32"), records("gpt-oss"));
    let mut r = load("gpt-oss", Precision::Fast, None);
    let (ours, theirs) = first_steps_from_f32(&mut r, &exact, &mx, "gpt-oss");
    assert!(
        ours <= 1.25 * theirs,
        "sloserve fast {ours} vs llama.cpp MXFP4 {theirs}"
    );
}

/// Each prompt's first step (after its prefill) run on `r`, and in llama.cpp's
/// `theirs`, against the F32 records `exact`: the top-5 errors of each, summed.
fn first_steps_from_f32(
    r: &mut LlamaRunner,
    exact: &[GreedyRecord],
    theirs: &[GreedyRecord],
    label: &str,
) -> (f32, f32) {
    let (mut o_sum, mut t_sum) = (0f32, 0f32);
    for (e, m) in exact.iter().zip(theirs) {
        assert_eq!(e.prompt_token_ids, m.prompt_token_ids);
        let chunk = if e.prompt_token_ids.len() > 512 {
            384
        } else {
            0
        };
        let (_, rows) = greedy_until(r, &e.prompt_token_ids, 1, chunk, &[]);
        let o = top5_error(&rows[0], &e.top5_logprobs_per_step[0]);
        let t = step_gap(&m.top5_logprobs_per_step[0], &e.top5_logprobs_per_step[0]);
        eprintln!(
            "{label} {}: first step from F32, sloserve fast {o:.3}, llama.cpp's {t:.3}",
            e.id
        );
        (o_sum, t_sum) = (o_sum + o, t_sum + t);
    }
    (o_sum, t_sum)
}

/// Logits of sequence `i` of `prompts` run together in one batch (each in its own blocks).
fn together(r: &mut LlamaRunner, prompts: &[&[u32]]) -> Vec<Vec<f32>> {
    let mut batch = Batch::default();
    let mut next = 0u32;
    for p in prompts {
        let blocks = p.len().div_ceil(r.info().block_size) as u32;
        let table: Vec<u32> = (next..next + blocks).collect();
        next += blocks;
        batch.push(p, 0, &table, true);
    }
    let mut logits = Logits::default();
    r.execute(&batch, &mut logits).unwrap();
    (0..prompts.len()).map(|i| logits.row(i).to_vec()).collect()
}

/// A mixture's sequence gives the same bits alone and beside others (which route their
/// tokens to other experts and change how many rows each expert runs).
#[test]
fn experts_are_batch_invariant() {
    for (precision, quantize) in [
        (Precision::Exact, None),
        (Precision::Fast, None),
        (Precision::Fast, Some(WeightType::Q8_0)),
    ] {
        for name in ["qwen3moe", "qwen2moe", "mixtral", "gpt-oss"] {
            let mut r = load(name, precision, quantize);
            let recs = records(name);
            let a: &[u32] = &recs[1].prompt_token_ids;
            let b: &[u32] = &recs[2].prompt_token_ids;
            let one: &[u32] = &recs[0].prompt_token_ids[..1];
            let alone = together(&mut r, &[a])[0].clone();
            let beside = together(&mut r, &[b, a, one]);
            assert!(
                alone
                    .iter()
                    .zip(&beside[1])
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name} {precision:?} {quantize:?}: a prompt's logits changed beside others"
            );
            let decode_alone = together(&mut r, &[one])[0].clone();
            assert!(
                decode_alone
                    .iter()
                    .zip(&beside[2])
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name} {precision:?} {quantize:?}: a one-token row changed beside others"
            );
        }
    }
}

/// phi3's LongRoPE at a context of 1,024 (not over the file's original 1,024): the
/// short factors, as llama.cpp's `-c 1024` records (`phi3-short`) have them, exact
/// within 2e-3 and greedy-equal; at the file's 4,096 (`phi3`, checked with every family
/// above) the long ones. The two record sets differ, so each pair of factors is checked.
#[test]
fn phi3_short_factors_below_the_original_context() {
    let (short, long) = (records_on("phi3", "phi3-short"), records("phi3"));
    assert_eq!(short.len(), 4);
    let apart = short
        .iter()
        .zip(&long)
        .map(|(s, l)| {
            assert_eq!(s.prompt_token_ids, l.prompt_token_ids);
            step_gap(&s.top5_logprobs_per_step[0], &l.top5_logprobs_per_step[0])
        })
        .fold(0f32, f32::max);
    assert!(apart > 0.1, "the short and long records differ by {apart}");
    let opts = RunnerOptions {
        precision: Precision::Exact,
        kv_cache_memory: Some(64 << 20),
        max_model_len: Some(1024),
        ..Default::default()
    };
    let mut r = LlamaRunner::load(generated("phi3"), &opts).expect("load phi3");
    for rec in &short {
        let (ids, rows) = greedy_until(&mut r, &rec.prompt_token_ids, 32, 0, &[]);
        let worst = rows
            .iter()
            .zip(&rec.top5_logprobs_per_step)
            .map(|(row, want)| top5_error(row, want))
            .fold(0f32, f32::max);
        eprintln!("phi3 at 1,024 {}: worst top-5 error {worst:.2e}", rec.id);
        assert!(worst <= EXACT_TOL, "phi3 short {}: {worst}", rec.id);
        assert_eq!(ids, rec.greedy_token_ids, "phi3 short {}: greedy", rec.id);
    }
}

/// `sloserve inspect` on the phi3 file names the family, LongRoPE (which factors for
/// which context, the attention factor) and that it is served.
#[test]
fn inspect_names_phi3_and_longrope() {
    let out =
        sloserve_model::inspect::inspect(&GgufFile::open(generated("phi3")).unwrap()).unwrap();
    for needle in [
        "architecture:    phi3",
        "rope freqs:      LongRoPE: rope_factors_long.weight when the served context is over 1024 \
         (by default the file's 4096), else rope_factors_short.weight; attention factor 1.0954",
        "supported:       yes",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

/// phi3 in fast precision under `--quantize q8_0` (its fused `attn_qkv` and stacked
/// `ffn_up` as 8-bit panels), against llama.cpp on the same file quantized to Q8_0 by
/// llama-quantize (`phi3-q8_0`; the blocks are the same bytes): both multiply Q8_0
/// weights with activations rounded to Q8_0 blocks. With an F32 KV cache the shortest
/// prompt agrees within 2e-3 on all 32 steps, greedy-equal; past a few dozen positions
/// the attention's output, summed in another order, now and then lands across a
/// rounding step of its 8-bit blocks, and this small model turns that into 0.1
/// (gpt-oss's note above), so the longer prompts are held to the bar gpt-oss's fast
/// path is: as served (f16 KV) no further from llama.cpp's F32 records than
/// llama.cpp's Q8_0 run, on first steps, within 25%.
#[test]
fn phi3_fast_q8_0_as_llamacpp_q8_0() {
    let q8 = Some(WeightType::Q8_0);
    let mut r = load_kv("phi3", Precision::Fast, q8, Some(KvDtype::F32));
    let recs = records_on("phi3", "phi3-q8_0");
    let p1 = &recs[0];
    let (ids, rows) = greedy_until(&mut r, &p1.prompt_token_ids, 32, 0, &[]);
    let errors: Vec<f32> = rows
        .iter()
        .zip(&p1.top5_logprobs_per_step)
        .map(|(row, want)| top5_error(row, want))
        .collect();
    let worst = errors.iter().fold(0f32, |a, &e| a.max(e));
    eprintln!(
        "phi3 fast q8_0, f32 KV, {}: worst of 32 steps {worst:.2e}",
        p1.id
    );
    assert!(worst <= EXACT_TOL, "{}: {errors:?}", p1.id);
    assert_eq!(ids, p1.greedy_token_ids, "{}: greedy", p1.id);
    let mut r = load("phi3", Precision::Fast, q8);
    let (ours, theirs) = first_steps_from_f32(&mut r, &records("phi3"), &recs, "phi3 q8_0");
    assert!(
        ours <= 1.25 * theirs,
        "sloserve fast q8_0 {ours} vs llama.cpp Q8_0 {theirs}"
    );
}
