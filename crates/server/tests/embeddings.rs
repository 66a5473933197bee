//! `/v1/embeddings`, `/v1/rerank` and `/score` over HTTP on the default model:
//! with `--pooling mean` the vectors equal llama.cpp's (its records,
//! cosine >= 0.9999) in every input shape and encoding, `dimensions` keeps the
//! leading values renormalised, the scores are the embeddings' cosines, and a
//! Batch API line answers as the endpoint does; with `--pooling rank` a pair's
//! score is P(yes) / (P(yes) + P(no)) as the completions endpoint's own logprobs
//! of the two answers give it. Bad input is a 400 naming the field.

mod common;

use std::sync::OnceLock;

use base64::Engine as _;
use common::batch::*;
use common::*;
use serde_json::{json, Value};
use sloserve_server::pooling_mode::PoolingFlag;

fn server(flag: PoolingFlag) -> &'static TestServer {
    static MEAN: OnceLock<TestServer> = OnceLock::new();
    static RANK: OnceLock<TestServer> = OnceLock::new();
    let cell = match flag {
        PoolingFlag::Rank => &RANK,
        _ => &MEAN,
    };
    cell.get_or_init(|| {
        let mut a = test_args();
        // Exact precision for the comparison with llama.cpp's F32 records.
        if flag == PoolingFlag::Mean {
            a.precision = "exact".parse().unwrap();
        }
        a.pooling = Some(flag);
        TestServer::start(a)
    })
}

fn ok(flag: PoolingFlag, path: &str, body: &Value) -> Value {
    let r = post(server(flag).addr, path, body);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
}

fn records() -> Vec<Value> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/llamacpp-embed-smollm2.jsonl"
    );
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn embeddings_equal_llama_cpp_in_every_shape() {
    let m = PoolingFlag::Mean;
    let recs = records();
    let texts: Vec<&str> = recs.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let r = ok(
        m,
        "/v1/embeddings",
        &json!({"model": "smol", "input": texts}),
    );
    assert_eq!(
        (r["object"].as_str(), r["model"].as_str()),
        (Some("list"), Some("smol"))
    );
    let tokens: usize = recs
        .iter()
        .map(|r| r["token_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(r["usage"]["prompt_tokens"], tokens);
    assert_eq!(r["usage"]["total_tokens"], tokens);
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), recs.len());
    for (i, (d, rec)) in data.iter().zip(&recs).enumerate() {
        assert_eq!(
            (d["index"].as_u64(), d["object"].as_str()),
            (Some(i as u64), Some("embedding"))
        );
        let v = floats(&d["embedding"]);
        assert_eq!(v.len(), 576);
        assert!((norm(&v) - 1.0).abs() < 1e-5);
        let c = cosine(&v, &floats(&rec["embedding"]));
        assert!(c >= 0.9999, "{}: cosine {c}", rec["id"]);
    }
    let full = floats(&data[3]["embedding"]);
    // Token ids, one list or several; base64 little-endian f32; dimensions.
    let ids = recs[3]["token_ids"].clone();
    let one = ok(m, "/v1/embeddings", &json!({"input": ids}));
    assert_eq!(floats(&one["data"][0]["embedding"]), full);
    let two = ok(
        m,
        "/v1/embeddings",
        &json!({"input": [ids, recs[0]["token_ids"]]}),
    );
    assert_eq!(floats(&two["data"][0]["embedding"]), full);
    let b64 = ok(
        m,
        "/v1/embeddings",
        &json!({"input": texts[3], "encoding_format": "base64"}),
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let back: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, full);
    let short = ok(
        m,
        "/v1/embeddings",
        &json!({"input": texts[3], "dimensions": 64}),
    );
    let short = floats(&short["data"][0]["embedding"]);
    assert_eq!(short.len(), 64);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    assert!(cosine(&short, &full[..64]) > 0.999_999);
    // An interactive embedding is served too, and counted in its class (no
    // other test of this file asks for interactive).
    let metrics = || get(server(m).addr, "/metrics").text();
    let key = "sloserve:request_success_total{model_name=\"smol\",slo_class=\"interactive\",finished_reason=\"length\"}";
    let before = metric(&metrics(), key).unwrap_or(0.0);
    let body = json!({"input": texts[3], "slo_class": "interactive"});
    let i = ok(m, "/v1/embeddings", &body);
    assert!(cosine(&floats(&i["data"][0]["embedding"]), &full) > 0.999_999);
    assert_eq!(metric(&metrics(), key), Some(before + 1.0));
}

#[test]
fn bad_embedding_requests_are_400s_naming_the_field() {
    let addr = server(PoolingFlag::Mean).addr;
    let long: Vec<u32> = (0..1100).map(|i| 300 + i % 1000).collect();
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": ["a", ""]}), "input"),
        (json!({"input": "a", "dimensions": 577}), "dimensions"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": vec!["a"; 2049]}), "input"),
        (json!({"input": [[5], long]}), "input[1]"),
        (json!({"input": [[5, 99999999]]}), "input"),
    ] {
        let e = post(addr, "/v1/embeddings", &body).openai_error(400);
        assert_eq!(e["param"], param, "{e}");
    }
    let e = post(
        addr,
        "/v1/embeddings",
        &json!({"input": "a", "model": "nope"}),
    );
    assert_eq!(e.status, 404);
    // A reranker embeds nothing.
    let rank = server(PoolingFlag::Rank).addr;
    let e = post(rank, "/v1/embeddings", &json!({"input": "a"})).openai_error(400);
    assert!(e["message"].as_str().unwrap().contains("reranker"), "{e}");
}

#[test]
fn rerank_and_score_on_an_embedding_model_are_cosines() {
    let m = PoolingFlag::Mean;
    let q = "What is the capital of France?";
    let docs = [
        "Paris is the capital of France.",
        "fn main() {}",
        "Berlin is in Germany.",
    ];
    let emb = ok(
        m,
        "/v1/embeddings",
        &json!({"input": [q, docs[0], docs[1], docs[2]]}),
    );
    let v: Vec<Vec<f32>> = (0..4)
        .map(|i| floats(&emb["data"][i]["embedding"]))
        .collect();
    let want: Vec<f64> = (1..4).map(|i| cosine(&v[0], &v[i])).collect();
    let r = ok(
        m,
        "/v1/rerank",
        &json!({"query": q, "documents": docs, "top_n": 2}),
    );
    let res = r["results"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    let mut best: Vec<usize> = (0..3).collect();
    best.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
    for (k, x) in res.iter().enumerate() {
        let i = x["index"].as_u64().unwrap() as usize;
        assert_eq!(i, best[k]);
        assert!((x["relevance_score"].as_f64().unwrap() - want[i]).abs() < 1e-5);
        assert_eq!(x["document"]["text"], docs[i]);
    }
    let r = ok(
        m,
        "/v1/rerank",
        &json!({"query": q, "documents": docs, "return_documents": false}),
    );
    assert!(r["results"][0].get("document").is_none());
    let s = ok(m, "/score", &json!({"text_1": q, "text_2": docs}));
    assert_eq!(s["object"], "list");
    for (i, d) in s["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["index"], i);
        assert!((d["score"].as_f64().unwrap() - want[i]).abs() < 1e-5);
    }
    let pairwise = ok(
        m,
        "/score",
        &json!({"text_1": [q, q], "text_2": [docs[1], docs[2]]}),
    );
    assert!((pairwise["data"][1]["score"].as_f64().unwrap() - want[2]).abs() < 1e-5);
    let e = post(
        server(m).addr,
        "/score",
        &json!({"text_1": ["a", "b"], "text_2": ["c"]}),
    );
    assert_eq!(e.openai_error(400)["param"], "text_2");
}

/// The reranker's score against the completions endpoint's own logprobs of
/// "yes" and "no" after the same prompt (echo with prompt logprobs).
#[test]
fn a_rerankers_score_is_p_yes_over_p_yes_plus_p_no() {
    let r = PoolingFlag::Rank;
    let (q, doc) = (
        "What is the capital of France?",
        "Paris is the capital of France.",
    );
    let got = ok(r, "/score", &json!({"text_1": q, "text_2": doc}))["data"][0]["score"]
        .as_f64()
        .unwrap();
    // The reranker's prompt, its parts tokenized as the server does: the
    // template's control tokens parsed, the pair as plain text.
    let tok = |text: &str, plain: bool| -> Vec<Value> {
        let b = json!({"prompt": text, "split_special_tokens": plain});
        ok(r, "/tokenize", &b)["tokens"].as_array().unwrap().clone()
    };
    let mut ids = tok("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n", false);
    ids.extend(tok(&format!("<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: {q}\n<Document>: {doc}"), true));
    ids.extend(tok(
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        false,
    ));
    let lp = |answer: &str| {
        let id = tok(answer, true);
        assert_eq!(id.len(), 1, "{answer:?} is one token");
        let prompt: Vec<Value> = ids.iter().chain(&id).cloned().collect();
        let body = json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0});
        let c = ok(r, "/v1/completions", &body);
        let lps = c["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .clone();
        lps.last().unwrap().as_f64().unwrap()
    };
    let (yes, no) = (lp("yes").exp(), lp("no").exp());
    let want = yes / (yes + no);
    assert!(
        (got - want).abs() < 1e-4,
        "score {got}, from logprobs {want}"
    );
    let rr = ok(
        r,
        "/v1/rerank",
        &json!({"query": q, "documents": ["Bananas are yellow.", doc]}),
    );
    let res = rr["results"].as_array().unwrap();
    let s: Vec<f64> = res
        .iter()
        .map(|x| x["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(s[0] >= s[1] && s.iter().all(|x| (0.0..=1.0).contains(x)));
    let of_doc = res.iter().find(|x| x["index"] == 1).unwrap();
    assert!((of_doc["relevance_score"].as_f64().unwrap() - want).abs() < 1e-4);
}

#[test]
fn embedding_lines_run_through_the_batch_api() {
    let srv = server(PoolingFlag::Mean);
    let text = "The quick brown fox jumps over the lazy dog.";
    let line = |id: &str| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings",
               "body": {"input": [text, "Hello"]}})
        .to_string()
    };
    let done = run_batch(srv, "/v1/embeddings", &[line("a"), line("b")]);
    assert_eq!(done["request_counts"]["completed"], 2, "{done}");
    let sync = ok(PoolingFlag::Mean, "/v1/embeddings", &json!({"input": text}));
    let want = floats(&sync["data"][0]["embedding"]);
    for l in file_lines(srv, &done["output_file_id"]) {
        let body = &l["response"]["body"];
        assert_eq!(l["response"]["status_code"], 200, "{l}");
        assert_eq!(floats(&body["data"][0]["embedding"]), want);
        assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    }
}
