//! Small GGUF files written with candle's GGUF writer: random-weight `qwen2` (q/k/v
//! biases, every supported tensor type), `qwen3` (per-head q/k norms) and `gemma3`
//! (post-norms, GEGLU, a sliding window shorter than the prompts) models load, and
//! their batched, chunked and one-at-a-time forwards agree; a small SentencePiece
//! vocabulary with byte fallback round-trips arbitrary text; bad files give errors
//! naming the file.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, ModelError, Precision, RunnerOptions};

const H: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 64;
const FFN: usize = 512;
const VOCAB: usize = 512;
const LAYERS: usize = 2;
/// Gemma 3 layers: five local (sliding-window) layers, then a global one.
const GEMMA3_LAYERS: usize = 6;
const WINDOW: usize = 8;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sloserve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// Writes a tiny model of architecture `arch`, cycling matrix types through `dtypes`.
fn write_model(path: &Path, arch: &str, dtypes: &[GgmlDType]) {
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut seed = 1;
    let mut next_dtype = 0;
    let mut add = |name: String, shape: &[usize], dtype: Option<GgmlDType>, scale: f32| {
        seed += 1;
        let t = random(shape, seed, scale);
        let dtype = dtype.unwrap_or_else(|| {
            next_dtype += 1;
            dtypes[(next_dtype - 1) % dtypes.len()]
        });
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    };
    add(
        "token_embd.weight".into(),
        &[VOCAB, H],
        Some(GgmlDType::Q8_0),
        1.0,
    );
    add("output_norm.weight".into(), &[H], Some(GgmlDType::F32), 1.0);
    let layers = if arch == "gemma3" {
        GEMMA3_LAYERS
    } else {
        LAYERS
    };
    for l in 0..layers {
        let p = format!("blk.{l}");
        add(
            format!("{p}.attn_norm.weight"),
            &[H],
            Some(GgmlDType::F32),
            1.0,
        );
        add(
            format!("{p}.ffn_norm.weight"),
            &[H],
            Some(GgmlDType::F32),
            1.0,
        );
        add(format!("{p}.attn_q.weight"), &[HEADS * HD, H], None, 0.1);
        add(format!("{p}.attn_k.weight"), &[KV_HEADS * HD, H], None, 0.1);
        add(format!("{p}.attn_v.weight"), &[KV_HEADS * HD, H], None, 0.1);
        add(
            format!("{p}.attn_output.weight"),
            &[H, HEADS * HD],
            None,
            0.1,
        );
        add(format!("{p}.ffn_gate.weight"), &[FFN, H], None, 0.1);
        add(format!("{p}.ffn_up.weight"), &[FFN, H], None, 0.1);
        add(format!("{p}.ffn_down.weight"), &[H, FFN], None, 0.1);
        if arch == "qwen3" || arch == "gemma3" {
            for norm in ["attn_q_norm", "attn_k_norm"] {
                add(
                    format!("{p}.{norm}.weight"),
                    &[HD],
                    Some(GgmlDType::F32),
                    1.0,
                );
            }
        }
        if arch == "gemma3" {
            for norm in ["post_attention_norm", "post_ffw_norm"] {
                add(
                    format!("{p}.{norm}.weight"),
                    &[H],
                    Some(GgmlDType::F32),
                    1.0,
                );
            }
        }
        if arch == "qwen2" {
            add(
                format!("{p}.attn_q.bias"),
                &[HEADS * HD],
                Some(GgmlDType::F32),
                0.5,
            );
            add(
                format!("{p}.attn_k.bias"),
                &[KV_HEADS * HD],
                Some(GgmlDType::F32),
                0.5,
            );
            add(
                format!("{p}.attn_v.bias"),
                &[KV_HEADS * HD],
                Some(GgmlDType::F32),
                0.5,
            );
        }
    }
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (k("embedding_length"), Value::U32(H as u32)),
        (k("feed_forward_length"), Value::U32(FFN as u32)),
        (k("attention.head_count"), Value::U32(HEADS as u32)),
        (k("attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("rope.freq_base"), Value::F32(1_000_000.0)),
        (k("context_length"), Value::U32(512)),
        (k("block_count"), Value::U32(layers as u32)),
        (k("attention.key_length"), Value::U32(HD as u32)),
        (k("attention.value_length"), Value::U32(HD as u32)),
    ];
    if arch == "gemma3" {
        meta.push((k("attention.sliding_window"), Value::U32(WINDOW as u32)));
    }
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}

fn load(path: &Path, precision: Precision) -> Result<LlamaRunner, ModelError> {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(16 << 20),
        ..Default::default()
    };
    LlamaRunner::load(path, &opts)
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + seed * 97) % VOCAB as u32)
        .collect()
}

fn max_abs_diff(x: &[f32], y: &[f32]) -> f32 {
    x.iter()
        .zip(y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Logits of the last token of `p` prefilled in chunks of `chunk` on blocks from `first`.
fn prefill(r: &mut LlamaRunner, p: &[u32], chunk: usize, first: u32) -> Vec<f32> {
    let table: Vec<u32> = (first..first + p.len().div_ceil(16) as u32).collect();
    let mut out = Logits::default();
    let mut done = 0;
    while done < p.len() {
        let end = (done + chunk).min(p.len());
        let mut b = Batch::default();
        b.push(
            &p[done..end],
            done,
            &table[..end.div_ceil(16)],
            end == p.len(),
        );
        r.execute(&b, &mut out).unwrap();
        done = end;
    }
    out.row(0).to_vec()
}

const ALL_MATRIX_TYPES: &[GgmlDType] = &[
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::F32,
];

#[test]
fn qwen2_with_every_tensor_type_loads_and_batched_chunked_single_agree() {
    let path = tmp("qwen2-tiny.gguf");
    write_model(&path, "qwen2", ALL_MATRIX_TYPES);
    for precision in [Precision::Exact, Precision::Fast] {
        let r = load(&path, precision).unwrap();
        let cfg = &r.model().config;
        assert_eq!(
            (cfg.architecture.as_str(), cfg.qkv_bias, cfg.num_kv_heads),
            ("qwen2", true, KV_HEADS)
        );
        check_batched_chunked_single(r, precision);
    }
}

#[test]
fn qwen3_loads_and_batched_chunked_single_agree() {
    let path = tmp("qwen3-tiny.gguf");
    write_model(
        &path,
        "qwen3",
        &[GgmlDType::Q4K, GgmlDType::Q8_0, GgmlDType::Q6K],
    );
    for precision in [Precision::Exact, Precision::Fast] {
        let r = load(&path, precision).unwrap();
        let cfg = &r.model().config;
        assert_eq!(cfg.architecture, "qwen3");
        assert!(cfg.qk_norm && !cfg.qkv_bias && !cfg.post_norms);
        assert_eq!((cfg.head_dim, cfg.sliding_window), (HD, None));
        check_batched_chunked_single(r, precision);
    }
}

/// Prompts of 40 and 23 tokens over a window of 8: chunks of 7 cross the window.
#[test]
fn gemma3_with_a_sliding_window_loads_and_batched_chunked_single_agree() {
    let path = tmp("gemma3-tiny.gguf");
    write_model(
        &path,
        "gemma3",
        &[GgmlDType::Q5_0, GgmlDType::Q4K, GgmlDType::Q8_0],
    );
    for precision in [Precision::Exact, Precision::Fast] {
        let r = load(&path, precision).unwrap();
        let c = &r.model().config;
        assert!(c.qk_norm && c.post_norms && c.embed_scale.is_some());
        let windows: Vec<_> = (0..GEMMA3_LAYERS).map(|l| c.layer_window(l)).collect();
        assert_eq!(
            windows,
            [Some(WINDOW); 5]
                .into_iter()
                .chain([None])
                .collect::<Vec<_>>()
        );
        check_batched_chunked_single(r, precision);
    }
}

/// Two prompts one at a time, chunked and batched together, on different blocks:
/// exact mode agrees to float rounding, fast mode roughly, with the same argmax.
fn check_batched_chunked_single(mut r: LlamaRunner, precision: Precision) {
    let (a, b) = (tokens(1, 40), tokens(2, 23));
    // One at a time, whole prompts.
    let a_alone = prefill(&mut r, &a, a.len(), 0);
    let b_alone = prefill(&mut r, &b, b.len(), 8);
    assert!(a_alone.iter().all(|x| x.is_finite()));
    // Chunked.
    let a_chunked = prefill(&mut r, &a, 7, 16);
    // Batched: both in one batch, on other blocks.
    let mut batch = Batch::default();
    batch.push(&a, 0, &[24, 25, 26], true);
    batch.push(&b, 0, &[28, 29], true);
    let mut out = Logits::default();
    r.execute(&batch, &mut out).unwrap();
    // Fast mode mixes 8-bit activations (small batches) and f32 GEMM (32+ rows),
    // so it agrees only roughly; exact mode must agree to float rounding.
    let tol = if precision == Precision::Exact {
        1e-3
    } else {
        0.5
    };
    let d = [
        max_abs_diff(&a_alone, &a_chunked),
        max_abs_diff(&a_alone, out.row(0)),
        max_abs_diff(&b_alone, out.row(1)),
    ];
    println!(
        "{precision:?}: chunked {:e}, batched A {:e}, batched B {:e}",
        d[0], d[1], d[2]
    );
    assert!(
        d.iter().all(|&x| x < tol),
        "{precision:?}: differences {d:?}"
    );
    // The same argmax, unless the reference's top logit and the other path's are
    // a near-tie within the measured difference (random weights make ties likely).
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
    for (name, other, diff) in [
        ("batched A", out.row(0), d[1]),
        ("chunked A", &a_chunked[..], d[0]),
    ] {
        let (i, j) = (argmax(&a_alone), argmax(other));
        let gap = a_alone[i] - a_alone[j];
        assert!(
            i == j || gap <= 2.0 * diff,
            "{precision:?}: {name} argmax {j}, alone {i} (gap {gap}, difference {diff})"
        );
    }
}

#[test]
fn llama_with_k_quants_loads_and_runs() {
    let path = tmp("llama-tiny.gguf");
    write_model(
        &path,
        "llama",
        &[GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q5K],
    );
    let mut exact = load(&path, Precision::Exact).unwrap();
    let mut fast = load(&path, Precision::Fast).unwrap();
    assert!(!exact.model().config.qkv_bias);
    let p = tokens(3, 20);
    let (e, f) = (
        prefill(&mut exact, &p, 20, 0),
        prefill(&mut fast, &p, 20, 0),
    );
    assert!(
        max_abs_diff(&e, &f) < 0.5,
        "fast strays from exact by {}",
        max_abs_diff(&e, &f)
    );
}

fn load_err(path: &Path) -> String {
    match load(path, Precision::Fast) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_files_give_errors_naming_the_file_and_problem() {
    // Missing file.
    let missing = tmp("does-not-exist.gguf");
    let e = load_err(&missing);
    assert!(
        e.contains("does-not-exist.gguf") && e.contains("cannot open"),
        "{e}"
    );

    // Wrong magic.
    let wrong = tmp("wrong-magic.gguf");
    std::fs::write(&wrong, b"GGML\x03\x00\x00\x00 this is not a gguf file").unwrap();
    let e = load_err(&wrong);
    assert!(
        e.contains("wrong-magic.gguf") && e.contains("GGUF magic"),
        "{e}"
    );

    // Empty file.
    let empty = tmp("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = load_err(&empty);
    assert!(
        e.contains("empty.gguf") && e.contains("not a valid GGUF"),
        "{e}"
    );

    // Truncated: the real model cut in the middle of its tensor data, and in its header.
    let real = std::fs::read(common::model_path()).unwrap();
    for (name, len) in [
        ("truncated-data.gguf", real.len() / 2),
        ("truncated-header.gguf", 1000),
    ] {
        let t = tmp(name);
        std::fs::write(&t, &real[..len]).unwrap();
        let e = load_err(&t);
        assert!(
            e.contains(name) && (e.contains("truncated") || e.contains("cannot parse")),
            "{e}"
        );
    }

    // Unsupported architecture.
    let arch = tmp("gpt-neox.gguf");
    write_model(&arch, "gptneox", &[GgmlDType::F32]);
    let e = load_err(&arch);
    assert!(
        e.contains("gpt-neox.gguf")
            && e.contains("unsupported architecture 'gptneox'")
            && e.contains("llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, gpt-oss, phi3, bert"),
        "{e}"
    );
    let f = sloserve_model::GgufFile::open(&arch).unwrap();
    let out = sloserve_model::inspect::inspect(&f).unwrap();
    assert!(
        out.contains("architecture:    gptneox")
            && out.contains("supported:       no")
            && out.contains(
                "(supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, gpt-oss, phi3, bert)"
            ),
        "{out}"
    );

    // A phi3 file in another family's layout: its `ffn_up` lacks the gate's rows.
    let phi3 = tmp("phi3-unstacked.gguf");
    write_model(&phi3, "phi3", &[GgmlDType::F32]);
    let e = load_err(&phi3);
    assert!(
        e.contains("phi3-unstacked.gguf")
            && e.contains("blk.0.ffn_up.weight")
            && e.contains(&format!("expected [{}, {H}]", 2 * FFN)),
        "{e}"
    );

    // Unsupported tensor type.
    let q8_1 = tmp("q8_1.gguf");
    write_model(&q8_1, "llama", &[GgmlDType::Q8_1]);
    let e = load_err(&q8_1);
    assert!(
        e.contains("q8_1.gguf") && e.contains("unsupported type Q8_1") && e.contains("Q4_1"),
        "{e}"
    );
}
