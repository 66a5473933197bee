//! The render endpoints against the real server and default model: the token ids
//! they answer are the prompt generation runs (its `usage.prompt_tokens`, and the
//! same ids sent back as a token prompt give the same completion), for chat and
//! completions, in vLLM's shapes; bad input is the generation endpoint's 400.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.precision = "exact".parse().unwrap();
        TestServer::start(a)
    })
}

fn ids(v: &Value) -> Vec<u64> {
    v["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("token_ids in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn ok(path: &str, body: &Value) -> Value {
    let r = post(server().addr, path, body);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

#[test]
fn completions_render_is_what_generation_runs() {
    for prompt in ["The capital of France is", "<|im_start|>user\nhi<|im_end|>"] {
        let body = json!({"model": "smol", "prompt": prompt, "max_tokens": 4, "temperature": 0});
        let r = ok("/v1/completions/render", &body);
        let arr = r.as_array().expect("an array, one element per prompt");
        assert_eq!(arr.len(), 1);
        let rendered = ids(&arr[0]);
        assert_eq!(arr[0]["model"], "smol");
        assert!(arr[0]["request_id"].as_str().unwrap().starts_with("cmpl-"));
        // The generation's own count and its tokenizer agree with the render.
        let gen = ok("/v1/completions", &body);
        assert_eq!(
            gen["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            rendered.len()
        );
        let tok = ok("/tokenize", &json!({"prompt": prompt}));
        assert_eq!(ids(&json!({"token_ids": tok["tokens"]})), rendered);
        // The rendered ids as a token prompt run the same request.
        let again = ok(
            "/v1/completions",
            &json!({"prompt": rendered, "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(again["choices"][0]["text"], gen["choices"][0]["text"]);
        // Special tokens taken literally change the render as they change generation.
        if prompt.contains("<|im_start|>") {
            let mut split = body.clone();
            split["split_special_tokens"] = json!(true);
            let r2 = ok("/v1/completions/render", &split);
            assert_ne!(ids(&r2[0]), rendered);
            let g2 = ok("/v1/completions", &split);
            assert_eq!(
                g2["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
                ids(&r2[0]).len()
            );
        }
    }
    // A token prompt renders as itself.
    let r = ok("/v1/completions/render", &json!({"prompt": [1, 2, 3]}));
    assert_eq!(ids(&r[0]), vec![1, 2, 3]);
}

#[test]
fn chat_render_is_what_generation_runs() {
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}
    ]);
    for add_generation_prompt in [true, false] {
        let body = json!({
            "messages": messages, "max_tokens": 4, "temperature": 0,
            "add_generation_prompt": add_generation_prompt,
        });
        let r = ok("/v1/chat/completions/render", &body);
        assert!(r.is_object(), "one object: {r}");
        assert!(r["request_id"].as_str().unwrap().starts_with("chatcmpl-"));
        let rendered = ids(&r);
        let gen = ok("/v1/chat/completions", &body);
        assert_eq!(
            gen["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            rendered.len(),
            "add_generation_prompt={add_generation_prompt}"
        );
        // Generation from the rendered ids gives the chat's own answer.
        let again = ok(
            "/v1/completions",
            &json!({"prompt": rendered, "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(
            again["choices"][0]["text"],
            gen["choices"][0]["message"]["content"]
        );
    }
}

#[test]
fn bad_input_is_the_generation_endpoints_error() {
    let s = server();
    let long = "word ".repeat(4000);
    let cases = [
        ("/v1/completions", json!({"prompt": "hi", "temperature": 9})),
        ("/v1/completions", json!({"prompt": [999999999]})),
        ("/v1/completions", json!({"prompt": ["a", "b"]})),
        ("/v1/completions", json!({"prompt": long})),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 5000}),
        ),
        ("/v1/completions", json!({"prompt": "hi", "model": "nope"})),
        ("/v1/chat/completions", json!({"messages": []})),
        ("/v1/chat/completions", json!({"messages": "hi"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}),
        ),
    ];
    for (path, body) in cases {
        let g = post(s.addr, path, &body);
        let r = post(s.addr, &format!("{path}/render"), &body);
        assert!(
            g.status >= 400 && g.status < 500,
            "{path} {body}: {}",
            g.status
        );
        assert_eq!(r.status, g.status, "{path} {body}: {}", r.text());
        let (ge, re) = (g.openai_error(g.status), r.openai_error(r.status));
        assert_eq!(re["message"], ge["message"], "{path} {body}");
        assert_eq!(re["param"], ge["param"], "{path} {body}");
    }
    let raw = request(
        s.addr,
        "POST",
        "/v1/chat/completions/render",
        &[("content-type", "application/json")],
        b"{\"messages\": ",
    );
    raw.openai_error(400);
}
