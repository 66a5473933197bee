//! The HTTP API against the real server and default model: completions and chat,
//! JSON and SSE, usage numbers, stop strings, seeds, logprobs, tokenize, models,
//! metrics and UTF-8 streaming (errors: `errors.rs`; SLO classes and targets:
//! `slo_targets.rs`).

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

/// One fast-precision server shared by the tests of this file.
fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(test_args()))
}

/// An exact-precision server for the tests that compare outputs across requests:
/// exact mode is batch-invariant, so concurrent tests cannot change a result.
fn exact_server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.precision = "exact".parse().unwrap();
        TestServer::start(a)
    })
}

/// Every SSE event of a streamed request, as JSON (the `[DONE]` checked and dropped).
fn stream_all(s: &TestServer, path: &str, body: &Value) -> (Vec<Value>, String) {
    let mut st = send(s.addr, "POST", path, &[], body.to_string().as_bytes());
    assert_eq!(st.status, 200);
    assert_eq!(st.header("content-type"), Some("text/event-stream"));
    let raw = String::from_utf8(st.read_all()).expect("UTF-8 stream");
    assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
    let events: Vec<&str> = raw.strip_suffix("\n\n").unwrap().split("\n\n").collect();
    let mut out = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        assert!(!ev.contains('\n'), "one line per event: {ev:?}");
        let data = ev.strip_prefix("data: ").expect("data: prefix");
        if i + 1 == events.len() {
            assert_eq!(data, "[DONE]");
        } else {
            out.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}")));
        }
    }
    (out, raw)
}

fn text_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|ch| {
            ch["text"]
                .as_str()
                .or(ch["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect()
}

fn tokenize_count(s: &TestServer, prompt: &str) -> u64 {
    let r = post(s.addr, "/tokenize", &json!({"prompt": prompt}));
    assert_eq!(r.status, 200);
    r.json()["count"].as_u64().unwrap()
}

#[test]
fn completion_json_with_usage_and_timings() {
    let s = server();
    let prompt = "The capital of France is";
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"model": "smol", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "smol");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let ch = &v["choices"][0];
    assert!(ch["text"].is_string());
    assert!(ch["finish_reason"] == "length" || ch["finish_reason"] == "stop");
    let u = &v["usage"];
    assert_eq!(
        u["prompt_tokens"].as_u64().unwrap(),
        tokenize_count(s, prompt)
    );
    let c = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&c));
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + c
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
    let t = &u["sloserve"];
    assert_eq!(t["slo_class"], "interactive");
    for k in ["queue_ms", "ttft_ms", "prefill_ms", "e2e_ms"] {
        assert!(t[k].as_f64().unwrap() >= 0.0, "{k}: {t}");
    }
    assert!(t["ttft_ms"].as_f64().unwrap() <= t["e2e_ms"].as_f64().unwrap());
    assert!(t["preemptions"].is_u64() && t["cached_prompt_tokens"].is_u64());
}

#[test]
fn completion_stream_framing_usage_and_logprobs() {
    let s = server();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}, "logprobs": 1});
    let (chunks, _) = stream_all(s, "/v1/completions", &body);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let u = &usage_chunk["usage"];
    assert_eq!(u["completion_tokens"], 12);
    assert_eq!(
        u["prompt_tokens"].as_u64().unwrap(),
        tokenize_count(s, "Once upon a time")
    );
    assert!(u["sloserve"]["ttft_ms"].as_f64().unwrap() > 0.0);
    let finishes: Vec<&Value> = rest
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, vec![&json!("length")]);
    assert!(rest.last().unwrap()["choices"][0]["finish_reason"] == "length");
    let streamed_tokens: usize = rest
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["tokens"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    assert_eq!(streamed_tokens, 12, "one logprobs entry per streamed token");
    for c in rest {
        assert_eq!(c["object"], "text_completion");
        assert!(c.get("usage").is_none());
    }
    assert!(!text_of(rest).is_empty());
    // Without include_usage: no usage chunk.
    let body = json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true, "stream": true});
    let (chunks, _) = stream_all(s, "/v1/completions", &body);
    assert!(chunks
        .iter()
        .all(|c| c.get("usage").is_none() && c["choices"].as_array().unwrap().len() == 1));
}

#[test]
fn chat_json_and_stream() {
    let s = server();
    let msgs = json!([{"role": "system", "content": "You are brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 10, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    let rendered = post(s.addr, "/tokenize", &json!({"messages": msgs}));
    assert_eq!(v["usage"]["prompt_tokens"], rendered.json()["count"]);

    let body = json!({"messages": msgs, "max_completion_tokens": 10, "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true}});
    let (chunks, _) = stream_all(s, "/v1/chat/completions", &body);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 10);
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
    }
    assert!(!text_of(&chunks).is_empty());
}

#[test]
fn stop_string_across_tokens_is_never_emitted() {
    let s = exact_server();
    let prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
    let base = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let full = post(s.addr, "/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let stop = " 14,";
    let at = full
        .find(stop)
        .unwrap_or_else(|| panic!("continuation {full:?} lacks {stop:?}"));
    // The stop string spans several tokens.
    assert!(tokenize_count(s, stop) > 1);
    let mut body = base.clone();
    body["stop"] = json!(["never-here", stop]);
    let v = post(s.addr, "/v1/completions", &body).json();
    assert_eq!(v["choices"][0]["text"], full[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 16);
    // The engine finished it, so every timing is known.
    let slo = &v["usage"]["sloserve"];
    for k in ["queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "e2e_ms"] {
        assert!(slo[k].is_f64(), "{k}: {slo}");
    }
    // Usage counts the tokens the client got: up to the stop string's last token.
    let mut lp = body.clone();
    lp["logprobs"] = json!(0);
    let v = post(s.addr, "/v1/completions", &lp).json();
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    body["stream"] = json!(true);
    let (chunks, raw) = stream_all(s, "/v1/completions", &body);
    assert!(!raw.contains("14,"), "{raw}");
    assert_eq!(text_of(&chunks), full[..at]);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    // Chat with a single stop string: the unstopped reply has it, the stopped one ends
    // just before it.
    let mut chat = json!({"messages": [{"role": "user", "content": "Count from 1 to 20 with commas."}],
        "max_tokens": 40, "temperature": 0});
    let v = post(s.addr, "/v1/chat/completions", &chat).json();
    let unstopped = v["choices"][0]["message"]["content"].as_str().unwrap();
    let stop = "5.";
    let at = unstopped
        .find(stop)
        .unwrap_or_else(|| panic!("unstopped reply {unstopped:?} lacks {stop:?}"));
    chat["stop"] = json!(stop);
    let v = post(s.addr, "/v1/chat/completions", &chat).json();
    assert_eq!(v["choices"][0]["message"]["content"], unstopped[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn seed_reproduces_sampling_at_temperature_1() {
    let s = exact_server();
    let body = json!({"prompt": "My favourite animal is", "max_tokens": 16, "temperature": 1.0,
        "seed": 1234, "ignore_eos": true});
    let a = post(s.addr, "/v1/completions", &body).json();
    let b = post(s.addr, "/v1/completions", &body).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    // Another seed samples another text (greedy decoding would not).
    let mut other = body.clone();
    other["seed"] = json!(4321);
    let c = post(s.addr, "/v1/completions", &other).json();
    assert!(c["choices"][0]["text"].is_string());
    assert_ne!(
        a["choices"][0]["text"], c["choices"][0]["text"],
        "seeds 1234 and 4321 gave the same text"
    );
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let (chunks, _) = stream_all(s, "/v1/completions", &stream);
    assert_eq!(text_of(&chunks), a["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn logprobs_shapes() {
    let s = server();
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4, "logprobs": 2, "ignore_eos": true}),
    )
    .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), 4);
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert!((1..=2).contains(&top.len()));
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    let v = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "ignore_eos": true}),
    )
    .json();
    let c = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(c.as_array().unwrap().len(), 3);
    assert!(c[0]["token"].is_string() && c[0]["bytes"].is_array());
    assert_eq!(c[0]["top_logprobs"].as_array().unwrap().len(), 2);
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    )
    .json();
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn token_id_prompts_tokenize_detokenize_and_models() {
    let s = server();
    let t = post(
        s.addr,
        "/tokenize",
        &json!({"prompt": "Hello world", "return_token_strs": true}),
    )
    .json();
    assert_eq!(t["max_model_len"], 1024);
    let ids = t["tokens"].clone();
    assert_eq!(
        t["count"].as_u64().unwrap() as usize,
        ids.as_array().unwrap().len()
    );
    assert_eq!(
        t["token_strs"].as_array().unwrap().len(),
        ids.as_array().unwrap().len()
    );
    let d = post(s.addr, "/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["prompt"], "Hello world");
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 2}),
    )
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], t["count"]);
    let e = post(s.addr, "/detokenize", &json!({"tokens": [999999]})).openai_error(400);
    assert_eq!(e["param"], "tokens");
    let m = get(s.addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "smol");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(get(s.addr, "/v1/models/smol").status, 200);
    assert_eq!(
        get(s.addr, "/v1/models/nope").openai_error(404)["code"],
        "model_not_found"
    );
    // The file stem is accepted as a model name too.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn health_ready_and_metrics() {
    let s = server();
    assert_eq!(get(s.addr, "/health").status, 200);
    let r = get(s.addr, "/ready");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ready");
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200);
    // The engine publishes its counters after the step whose last token the
    // client may already hold.
    wait_for("the engine's snapshot", 10, || {
        let text = get(s.addr, "/metrics").text();
        metric(&text, "sloserve:generation_tokens_total{").unwrap_or(0.0) >= 3.0
    });
    let m = get(s.addr, "/metrics");
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let text = m.text();
    for name in [
        "sloserve:time_to_first_token_seconds_bucket",
        "sloserve:inter_token_latency_seconds_bucket",
        "sloserve:time_per_output_token_seconds_bucket",
        "sloserve:e2e_request_latency_seconds_bucket",
        "sloserve:request_queue_time_seconds_bucket",
        "sloserve:request_prefill_time_seconds_bucket",
        "sloserve:num_requests_running{",
        "sloserve:num_requests_waiting{",
        "sloserve:kv_cache_usage_perc{",
        "sloserve:prefix_cache_queries_total{",
        "sloserve:prefix_cache_hits_total{",
        "sloserve:prompt_tokens_total{",
        "sloserve:generation_tokens_total{",
        "sloserve:num_preemptions_total{",
        "sloserve:preemption_resumptions_total{model_name=\"smol\",kv=\"kept\"}",
        "sloserve:recomputed_tokens_total{model_name=\"smol\",part=\"prompt\"}",
        "sloserve:requests_rejected_total{",
        "vllm:num_requests_waiting{",
        "vllm:num_requests_running{",
        "vllm:kv_cache_usage_perc{",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    let ttft =
        "sloserve:time_to_first_token_seconds_bucket{model_name=\"smol\",slo_class=\"interactive\"";
    for le in ["0.005", "0.1", "60", "+Inf"] {
        assert!(
            text.contains(&format!("{ttft},le=\"{le}\"}}")),
            "bucket {le}"
        );
    }
    assert!(metric(&text, "sloserve:time_to_first_token_seconds_count{model_name=\"smol\",slo_class=\"interactive\"}").unwrap() >= 1.0);
    assert!(metric(&text, "sloserve:generation_tokens_total{").unwrap() >= 3.0);
    let kv = metric(&text, "vllm:kv_cache_usage_perc{").unwrap();
    assert!((0.0..=1.0).contains(&kv));
}

/// A streamed completion splits no character: each chunk is valid UTF-8 on its own
/// (`next_event` checks), and the chunks add up to the non-streamed text of the same
/// seed, which a U+FFFD from a split multi-byte character would break. The outputs hold
/// tokens that are only part of a character, so a split was possible.
#[test]
fn utf8_emoji_and_cjk_stream_whole_characters() {
    // Exact mode is batch-invariant: the streamed and the whole run sample alike.
    let s = exact_server();
    let prompts = [
        "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘😗😚😙😋😛😜🤪😝🤑🤗🤭",
        "日本語の文章です。東京、大阪、京都、名古屋、札幌、福岡、神戸、横浜、",
        "🍎🍊🍋🍌🍉🍇🍓 苹果 橘子 柠檬 香蕉 西瓜 葡萄 草莓 🍎🍊🍋🍌",
    ];
    let mut partial_tokens = 0;
    for p in prompts {
        let body = json!({"prompt": p, "max_tokens": 24, "temperature": 0.7, "seed": 11,
            "ignore_eos": true});
        let mut whole_body = body.clone();
        whole_body["logprobs"] = json!(0);
        let whole = post(s.addr, "/v1/completions", &whole_body).json();
        let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
        // A token that is not a whole character shows as U+FFFD in logprobs.tokens.
        partial_tokens += whole["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t.as_str().unwrap().contains('\u{FFFD}'))
            .count();
        let mut stream_body = body.clone();
        stream_body["stream"] = json!(true);
        let mut st = send(
            s.addr,
            "POST",
            "/v1/completions",
            &[],
            stream_body.to_string().as_bytes(),
        );
        assert_eq!(st.status, 200);
        let mut pieces = Vec::new();
        // next_event asserts each event is valid UTF-8 on its own.
        while let Some(v) = st.next_json() {
            pieces.push(v["choices"][0]["text"].as_str().unwrap_or("").to_string());
        }
        for piece in &pieces {
            assert!(
                !piece.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                "chunk {piece:?} holds a U+FFFD the whole text {text:?} lacks"
            );
        }
        assert_eq!(pieces.concat(), text, "streamed vs whole text of {p:?}");
    }
    assert!(
        partial_tokens > 0,
        "no generated token was part of a character: nothing could be split"
    );
}

/// `GET /tokenizer/{file}`: the Hugging Face folder's three files, built from the
/// served GGUF (the ids it encodes to are checked in the model crate's
/// `hf_export` test and `tests/python/test_export_tokenizer.py`).
#[test]
fn the_tokenizer_files_are_served() {
    let s = server();
    let t = get(s.addr, "/tokenizer/tokenizer.json").json();
    assert_eq!(t["model"]["type"], "BPE", "{}", t["model"]["type"]);
    assert!(t["model"]["vocab"].as_object().unwrap().len() > 40_000);
    let c = get(s.addr, "/tokenizer/tokenizer_config.json").json();
    assert!(
        c["chat_template"].as_str().unwrap().contains("im_start"),
        "{c}"
    );
    let m = get(s.addr, "/tokenizer/special_tokens_map.json").json();
    assert!(
        m["eos_token"].is_string() || m["eos_token"].is_object(),
        "{m}"
    );
    let e = get(s.addr, "/tokenizer/vocab.txt").openai_error(404);
    assert!(e["message"].as_str().unwrap().contains("tokenizer.json"));
}
