//! `/v1/completions` with `echo` and `prompt_logprobs` on the real default model
//! (exact precision: batch-invariant, so concurrent tests cannot change a score):
//! the legacy shape (`null` first, offsets into the echoed text), `max_tokens` 0,
//! vLLM's `prompt_logprobs` list, streaming (the prompt chunk first), scores equal
//! to the generated tokens' own logprobs when teacher-forced, independent of
//! companions, of chunking (prompts past 64 tokens) and of the prefix cache, and
//! OpenAI-shaped 400s naming the field.

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

fn complete(body: Value) -> Value {
    let r = post(server().addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn f32s(v: &Value) -> Vec<Option<f64>> {
    v.as_array().unwrap().iter().map(Value::as_f64).collect()
}

const PROMPT: &str = "The capital of France is Paris, and the capital of Italy is";

#[test]
fn echo_scores_the_prompt_in_the_legacy_shape() {
    let v = complete(json!({"prompt": PROMPT, "echo": true, "logprobs": 2, "max_tokens": 0}));
    let c = &v["choices"][0];
    assert_eq!(c["text"], PROMPT);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), n);
    assert_eq!(tokens.concat(), PROMPT);
    let scores = f32s(&lp["token_logprobs"]);
    assert_eq!(scores[0], None);
    assert!(lp["top_logprobs"][0].is_null());
    assert!(scores[1..].iter().all(|s| s.is_some_and(|x| x <= 0.0)));
    let offsets: Vec<usize> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap() as usize)
        .collect();
    for (j, t) in tokens.iter().enumerate() {
        assert_eq!(&PROMPT[offsets[j]..offsets[j] + t.len()], *t);
    }
    for j in 1..n {
        let top = lp["top_logprobs"][j].as_object().unwrap();
        assert!((1..=2).contains(&top.len()));
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(best >= scores[j].unwrap() - 1e-6);
    }
    // " Rome" after "the capital of Italy is" is the model's likeliest token.
    let v = complete(
        json!({"prompt": PROMPT, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0}),
    );
    let c = &v["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(
        text.starts_with(PROMPT) && text.len() > PROMPT.len(),
        "{text}"
    );
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n + 1);
    assert_eq!(
        lp["text_offset"][n].as_u64().unwrap() as usize,
        PROMPT.len()
    );
    assert_eq!(f32s(&lp["token_logprobs"])[..n], scores[..]);
}

#[test]
fn prompt_scores_equal_the_generated_tokens_logprobs() {
    let v = complete(
        json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0, "ignore_eos": true}),
    );
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let gen_text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let gen_lp = f32s(&v["choices"][0]["logprobs"]["token_logprobs"]);
    let ids = post(
        server().addr,
        "/tokenize",
        &json!({"prompt": format!("{PROMPT}{gen_text}")}),
    )
    .json();
    let ids = ids["tokens"].clone();
    let v = complete(json!({"prompt": ids, "echo": true, "logprobs": 0, "max_tokens": 0}));
    let scores = f32s(&v["choices"][0]["logprobs"]["token_logprobs"]);
    assert_eq!(
        scores.len(),
        n + gen_lp.len(),
        "the text re-tokenizes differently"
    );
    for (j, g) in gen_lp.iter().enumerate() {
        let (a, b) = (scores[n + j].unwrap(), g.unwrap());
        assert!((a - b).abs() < 1e-4, "token {j}: scored {a}, generated {b}");
    }
}

#[test]
fn vllm_prompt_logprobs_shape() {
    let v = complete(json!({"prompt": PROMPT, "prompt_logprobs": 2, "max_tokens": 1}));
    let c = &v["choices"][0];
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(!c["text"].as_str().unwrap().starts_with("The capital"));
    let pl = c["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), n);
    assert!(pl[0].is_null());
    let ids = post(server().addr, "/tokenize", &json!({"prompt": PROMPT})).json()["tokens"].clone();
    for j in 1..n {
        let e = pl[j].as_object().unwrap();
        assert!((1..=3).contains(&e.len()));
        let own = &e[&ids[j].to_string()];
        assert!(own["rank"].as_u64().unwrap() >= 1);
        assert!(own["logprob"].as_f64().unwrap() <= 0.0);
        assert!(own["decoded_token"].is_string());
        assert!(e.values().any(|x| x["rank"] == 1));
    }
    // Not asked: absent.
    let v = complete(json!({"prompt": PROMPT, "max_tokens": 1}));
    assert!(v["choices"][0].get("prompt_logprobs").is_none());
}

#[test]
fn scores_do_not_depend_on_companions_chunks_or_the_cache() {
    // Past PROMPT_SCORING_CHUNK (64) tokens: scored in several chunks.
    let long = "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife. ".repeat(4);
    let body = json!({"prompt": long, "echo": true, "logprobs": 1, "max_tokens": 0});
    let alone = complete(body.clone());
    let n = alone["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n > 64, "{n}");
    let lp = |v: &Value| v["choices"][0]["logprobs"]["token_logprobs"].clone();
    assert_eq!(lp(&alone).as_array().unwrap().len() as u64, n);
    let addr = server().addr;
    let companions: Vec<_> = (0..3)
        .map(|i| {
            std::thread::spawn(move || {
                post(addr, "/v1/completions", &json!({"prompt": format!("Story {i}: the dragon"), "max_tokens": 24, "ignore_eos": true}))
            })
        })
        .collect();
    // Again beside them, its prompt's blocks now in the prefix cache.
    let again = complete(body);
    for c in companions {
        assert_eq!(c.join().unwrap().status, 200);
    }
    assert_eq!(lp(&again), lp(&alone));
    let cached = &again["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached.as_u64().unwrap_or(0), 0);
}

#[test]
fn streaming_sends_the_prompt_first() {
    let body = json!({"prompt": PROMPT, "echo": true, "logprobs": 1, "max_tokens": 3, "stream": true, "ignore_eos": true});
    let mut st = send(
        server().addr,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    let first = st.next_json().unwrap();
    let c = &first["choices"][0];
    assert_eq!(c["text"], PROMPT);
    assert!(c["logprobs"]["token_logprobs"][0].is_null());
    assert!(c["logprobs"]["token_logprobs"][1].is_number());
    let mut texts = String::new();
    while let Some(ev) = st.next_json() {
        if let Some(t) = ev["choices"][0]["text"].as_str() {
            texts.push_str(t);
            if let Some(o) = ev["choices"][0]["logprobs"]["text_offset"][0].as_u64() {
                assert!(o as usize >= PROMPT.len());
            }
        }
    }
    assert!(!texts.is_empty());
}

#[test]
fn bad_fields_are_named() {
    for (body, param) in [
        (
            json!({"prompt": "a", "prompt_logprobs": 21}),
            "prompt_logprobs",
        ),
        (
            json!({"prompt": "a", "echo": true, "logprobs": -1}),
            "logprobs",
        ),
        (json!({"prompt": "a", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": "a", "echo": "yes"}), "echo"),
    ] {
        let e = post(server().addr, "/v1/completions", &body).openai_error(400);
        assert_eq!(e["param"], param, "{body}");
    }
}

#[test]
fn tokenizer_info_serves_lm_evals_remote_tokenizer() {
    let v = get(server().addr, "/tokenizer_info").json();
    assert_eq!(v["tokenizer_class"], "gpt2");
    let eos = v["eos_token"].as_str().unwrap();
    assert_eq!(v["pad_token"], eos);
    assert!(v["chat_template"].as_str().unwrap().contains("im_start"));
    assert_eq!(v["model_max_length"], 1024);
    // lm-eval reads the EOS id by tokenizing its text.
    let ids = post(
        server().addr,
        "/tokenize",
        &json!({"prompt": eos, "add_special_tokens": false}),
    )
    .json();
    assert_eq!(ids["tokens"].as_array().unwrap().len(), 1);
}

/// Fast precision: a scoring chunk of 3+ rows always takes the dequantized GEMM,
/// so a long prompt's scores do not change beside other requests either (sent
/// while three generations run; the overlap is likely, not forced).
#[test]
fn fast_precision_scores_do_not_depend_on_companions() {
    static S: OnceLock<TestServer> = OnceLock::new();
    let s = S.get_or_init(|| TestServer::start(test_args()));
    let body = json!({"prompt": PROMPT.repeat(3), "echo": true, "logprobs": 1, "max_tokens": 0});
    let lp = |v: Value| v["choices"][0]["logprobs"]["token_logprobs"].clone();
    let alone = lp(post(s.addr, "/v1/completions", &body).json());
    let addr = s.addr;
    let companions: Vec<_> = (0..3)
        .map(|i| {
            std::thread::spawn(move || {
                let b =
                    json!({"prompt": format!("Story {i}:"), "max_tokens": 32, "ignore_eos": true});
                post(addr, "/v1/completions", &b)
            })
        })
        .collect();
    let beside = lp(post(s.addr, "/v1/completions", &body).json());
    for c in companions {
        assert_eq!(c.join().unwrap().status, 200);
    }
    assert_eq!(beside, alone);
}

#[test]
fn chat_prompt_logprobs_cover_the_rendered_prompt() {
    let body = json!({"messages": [{"role": "user", "content": "Name a colour."}],
                      "prompt_logprobs": 1, "max_tokens": 2});
    let r = post(server().addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let pl = v["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        pl.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(pl[0].is_null() && pl[1..].iter().all(Value::is_object));
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 30});
    let e = post(server().addr, "/v1/chat/completions", &body).openai_error(400);
    assert_eq!(e["param"], "prompt_logprobs");
    let plain = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    let v = post(server().addr, "/v1/chat/completions", &plain).json();
    assert!(v.get("prompt_logprobs").is_none());
}
