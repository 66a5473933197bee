//! The generated phi3 file (`models/generated/phi3.gguf`: Phi-3.5-mini's layout with
//! LongRoPE, `make models-generated`) served over HTTP with Phi-3.5-mini's own chat
//! template (`--chat-template-file`): in exact precision a completion of llama.cpp's
//! recorded prompt ids is llama.cpp's greedy continuation, at `--max-model-len 1024`
//! (the short factors: `llamacpp-f32-family-phi3-short.jsonl`) and at the file's 4,096
//! (the long ones: `llamacpp-f32-family-phi3.jsonl`); a chat is tokenized from what
//! llama-server's `/apply-template` renders (`llamacpp-apply-template-phi3.jsonl`).

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::{json, Value};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data")
        .join(name)
}

fn lines(name: &str) -> Vec<Value> {
    let path = data(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn phi3(max_model_len: &str) -> TestServer {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/generated/phi3.gguf");
    assert!(
        model.exists(),
        "{} is missing: run `make models-generated` first",
        model.display()
    );
    let mut a = test_args();
    a.model = model;
    a.precision = "exact".parse().unwrap();
    a.engine.set("max-model-len", max_model_len).unwrap();
    a.served_model_name = Some("phi3".into());
    a.chat_template_file = Some(data("templates/microsoft-Phi-3.5-mini-instruct.jinja"));
    TestServer::start(a)
}

#[test]
fn phi3_served_continues_as_llamacpp_at_each_context() {
    for (len, records) in [
        ("1024", "llamacpp-f32-family-phi3-short.jsonl"),
        ("4096", "llamacpp-f32-family-phi3.jsonl"),
    ] {
        let s = phi3(len);
        for rec in lines(records).iter().take(2) {
            let body = json!({"model": "phi3", "prompt": rec["prompt_token_ids"], "max_tokens": 32,
                "temperature": 0, "ignore_eos": true});
            let r = post(s.addr, "/v1/completions", &body);
            assert_eq!(r.status, 200, "{}", r.text());
            let want = post(
                s.addr,
                "/detokenize",
                &json!({"tokens": rec["greedy_token_ids"]}),
            );
            assert_eq!(
                r.json()["choices"][0]["text"],
                want.json()["prompt"],
                "max-model-len {len}, {}",
                rec["id"]
            );
        }
        if len == "1024" {
            for rec in lines("llamacpp-apply-template-phi3.jsonl") {
                let req = &rec["request"];
                let mut ours = json!({"model": "phi3", "messages": req["messages"]});
                if let Some(g) = req.get("add_generation_prompt") {
                    ours["add_generation_prompt"] = g.clone();
                }
                let chat = post(s.addr, "/tokenize", &ours);
                assert_eq!(chat.status, 200, "{}", chat.text());
                let text =
                    json!({"model": "phi3", "prompt": rec["prompt"], "add_special_tokens": false});
                let plain = post(s.addr, "/tokenize", &text);
                assert_eq!(chat.json()["tokens"], plain.json()["tokens"], "{rec}");
            }
        }
        s.shutdown();
    }
}
