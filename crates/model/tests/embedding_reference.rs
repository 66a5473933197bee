//! Pooled requests (`Request::pooling`) on real weights against llama.cpp's
//! embeddings of the same files (`scripts/make_embedding_reference.py`: llama-server
//! `--embedding`, F32 KV cache): the generated Qwen3-Embedding-shaped file
//! (`qwen3.pooling_type` 3, last token, EOS appended) and SmolLM2 with mean
//! pooling, exact precision, cosine >= 0.9999 per text. Tokenized as llama.cpp's
//! embedding path does (`encode_prompt`: the same ids). A text's embedding is
//! the same bits alone and beside the others, and after its prompt was cached.

mod common;

use std::path::PathBuf;

use common::*;
use sloserve_engine::{Engine, EngineConfig, EngineHandle, Pooling, Request};
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{GgufFile, LlamaRunner, ModelConfig, Precision, RunnerOptions};

const MIN_COSINE: f64 = 0.9999;

struct Record {
    id: String,
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn records(name: &str, model: &PathBuf) -> Vec<Record> {
    use sha2::{Digest, Sha256};
    let recs = reference_json(&format!("llamacpp-embed-{name}.jsonl"));
    let bytes = std::fs::read(model).expect("read the model");
    let got: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        recs[0]["model_sha256"].as_str(),
        Some(got.as_str()),
        "{name}: not the recorded file"
    );
    recs.iter()
        .map(|r| Record {
            id: r["id"].as_str().unwrap().into(),
            text: r["text"].as_str().unwrap().into(),
            ids: serde_json::from_value(r["token_ids"].clone()).unwrap(),
            embedding: serde_json::from_value(r["embedding"].clone()).unwrap(),
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn engine(model: &PathBuf, chunk: usize) -> EngineHandle {
    let opts = RunnerOptions {
        precision: Precision::Exact,
        kv_cache_memory: Some(64 << 20),
        max_model_len: Some(1024),
        ..Default::default()
    };
    let runner = LlamaRunner::load(model, &opts).expect("load");
    let cfg = EngineConfig {
        max_prefill_chunk: chunk,
        ..EngineConfig::default()
    };
    Engine::start(Box::new(runner), cfg).expect("start the engine")
}

fn pooled(e: &EngineHandle, reqs: Vec<Request>) -> Vec<Vec<f32>> {
    let streams: Vec<_> = reqs.into_iter().map(|r| e.submit(r).unwrap()).collect();
    streams
        .into_iter()
        .map(|s| s.collect_blocking().pooled.expect("a pooled output"))
        .collect()
}

fn check(name: &str, model: PathBuf, pooling: Pooling, file_pooling: Option<u32>) {
    let recs = records(name, &model);
    let file = GgufFile::open(&model).unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&file).unwrap().pooling_type,
        file_pooling
    );
    let tok = Tokenizer::from_gguf(&file.content).unwrap();
    for r in &recs {
        assert_eq!(
            tok.encode_prompt(&r.text).unwrap(),
            r.ids,
            "{name} {}: token ids",
            r.id
        );
    }
    let e = engine(&model, 512);
    let req = |r: &Record| Request::pooled(r.ids.clone(), pooling.clone());
    let together = pooled(&e, recs.iter().map(req).collect());
    for (r, got) in recs.iter().zip(&together) {
        let c = cosine(got, &r.embedding);
        assert!(
            c >= MIN_COSINE,
            "{name} {}: cosine {c} to llama.cpp's",
            r.id
        );
        eprintln!("{name} {}: {} tokens, cosine {c:.7}", r.id, r.ids.len());
    }
    // Alone, and after a generation request cached the same prompt: the same bits.
    let p = &recs[3];
    let _ = e
        .submit(Request::greedy(p.ids.clone(), 2))
        .unwrap()
        .collect_blocking();
    let alone = pooled(&e, vec![req(p)]);
    assert_eq!(
        alone[0], together[3],
        "{name}: alone or after caching, not the same bits"
    );
    e.shutdown();
    // Prefilled in chunks of 16 positions: the same embedding within the bar.
    let e = engine(&model, 16);
    let chunked = pooled(&e, vec![req(p)]);
    assert!(cosine(&chunked[0], &p.embedding) >= MIN_COSINE);
    e.shutdown();
}

#[test]
fn qwen3_embedding_shaped_last_token_pooling_equals_llama_cpp() {
    let model = repo_root().join("models/generated/qwen3-embed.gguf");
    assert!(
        model.exists(),
        "{}: run `make models-generated`",
        model.display()
    );
    check("qwen3-embed", model, Pooling::Last, Some(3));
}

#[test]
fn smollm2_mean_pooling_equals_llama_cpp() {
    check("smollm2", model_path(), Pooling::Mean, None);
}
