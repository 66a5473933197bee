//! `sloserve serve` on all-MiniLM-L6-v2 (the `bert` encoder; `make model-minilm`)
//! over HTTP: `/v1/embeddings` answers the twelve reference texts at cosine >=
//! 0.9999 to llama.cpp's `llama-embedding` (`minilm-embed.jsonl`), unit length,
//! with the tokens counted; `/v1/rerank` ranks the relevant passage first; an
//! input past the 512-token context is a 400 naming the limit, and the
//! generation endpoints answer a 400 that the model is an encoder.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/all-MiniLM-L6-v2.F16.gguf");
        assert!(
            a.model.exists(),
            "{}: run `make model-minilm`",
            a.model.display()
        );
        a.engine.set("max-model-len", "512").unwrap();
        a.served_model_name = Some("minilm".into());
        TestServer::start(a)
    })
}

fn records() -> Vec<Value> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/minilm-embed.jsonl"
    );
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn error_of(r: &Resp) -> (String, String) {
    let e = &r.json()["error"];
    (
        e["param"].as_str().unwrap_or("").to_string(),
        e["message"].as_str().unwrap_or("").to_string(),
    )
}

#[test]
fn embeddings_equal_llama_cpp() {
    let recs = records();
    let texts: Vec<&str> = recs.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let r = post(
        server().addr,
        "/v1/embeddings",
        &json!({"model": "minilm", "input": texts}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), recs.len());
    for (d, rec) in data.iter().zip(&recs) {
        let got = floats(&d["embedding"]);
        assert_eq!(got.len(), 384);
        let n: f64 = got.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "{}: norm {n}", rec["id"]);
        let c = cosine(&got, &floats(&rec["llamacpp"]));
        assert!(c >= 0.9999, "{}: cosine {c} to llama.cpp", rec["id"]);
    }
    let tokens: u64 = recs
        .iter()
        .map(|r| r["token_ids"].as_array().unwrap().len() as u64)
        .sum();
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(tokens));
}

#[test]
fn rerank_puts_the_relevant_passage_first() {
    let recs = records();
    let text = |id: &str| {
        recs.iter().find(|r| r["id"] == id).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let r = post(
        server().addr,
        "/v1/rerank",
        &json!({"query": text("query"), "documents": [text("code"), text("passage"), text("numbers")]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results[0]["index"].as_u64(), Some(1), "{results:?}");
}

#[test]
fn past_the_context_and_generation_are_400s() {
    let long = "word ".repeat(600);
    let r = post(server().addr, "/v1/embeddings", &json!({"input": [long]}));
    assert_eq!(r.status, 400, "{}", r.text());
    let (param, msg) = error_of(&r);
    assert_eq!(param, "input[0]");
    assert!(msg.contains("512"), "{msg}");
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        ),
        ("/v1/responses", json!({"input": "Hi"})),
    ] {
        let r = post(server().addr, path, &body);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let (param, msg) = error_of(&r);
        assert_eq!(param, "model", "{path}");
        assert!(msg.contains("encoder"), "{path}: {msg}");
    }
}
