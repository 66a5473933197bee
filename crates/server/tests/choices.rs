//! `n` > 1 against the real server and default model: one choice per engine
//! request with seeds `seed + i`, the prompt counted once and prefilled once (the
//! later choices read its blocks from the prefix cache), streamed chunks
//! interleaved by `index` reassembling to the JSON answer, and the 400s.

mod common;

use std::sync::{Mutex, OnceLock};

use common::*;
use serde_json::{json, Value};

/// An exact-precision server (batch-invariant: a choice's text does not depend
/// on what runs beside it, so answers can be compared across requests).
fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.precision = "exact".parse().unwrap();
        TestServer::start(a)
    })
}

/// The tests read the engine's cache counters: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

fn ok(r: Resp) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn texts(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["message"]["content"].as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn n_choices_share_one_prefill_and_seed_plus_i() {
    let _l = serial();
    let s = server();
    // A prompt no other test sends, several KV blocks long.
    let prompt = "Choices test: a list of the animals that live on a farm in the north of \
                  the country, with one short sentence about each of them, written for a \
                  class of young children who have never been to a farm, in plain words, \
                  with the sound each animal makes and what it eats every day:";
    let body = |n: u32, seed: u64| json!({"prompt": prompt, "max_tokens": 8, "temperature": 1, "seed": seed, "n": n});
    let bs = s.state.engine.info().block_size as u64;
    let before = s.state.engine.stats().counters;
    let v = ok(post(s.addr, "/v1/completions", &body(3, 40)));
    let after = s.state.engine.stats().counters;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(c["finish_reason"] == "length" || c["finish_reason"] == "stop");
    }
    let u = &v["usage"];
    let prompt_tokens = u["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens > 2 * bs,
        "the prompt spans blocks: {prompt_tokens}"
    );
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((3..=24).contains(&completion), "{u}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        prompt_tokens + completion
    );
    // Choices 1 and 2 found the first one's full blocks cached.
    let full = (prompt_tokens - 1) / bs * bs;
    let cached = after.prompt_tokens_cached - before.prompt_tokens_cached;
    assert!(cached >= 2 * full, "cached {cached}, want 2 x {full}");
    let computed = after.prompt_tokens_computed - before.prompt_tokens_computed;
    assert!(
        computed <= prompt_tokens + 2 * bs,
        "one prefill: computed {computed} of 3 x {prompt_tokens}"
    );
    let metrics = get(s.addr, "/metrics").text();
    assert!(metric(&metrics, "sloserve:prefix_cache_hits_total").unwrap() >= (2 * full) as f64);

    // The prompt counted once: as n = 1 counts it; choice i is seed + i's answer.
    let all = texts(&v);
    for i in 0..3 {
        let one = ok(post(s.addr, "/v1/completions", &body(1, 40 + i)));
        assert_eq!(one["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens));
        assert_eq!(texts(&one), vec![all[i as usize].clone()], "choice {i}");
    }
}

/// Every SSE event's JSON (the `[DONE]` checked and dropped).
fn stream_all(s: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let mut st = send(s.addr, "POST", path, &[], body.to_string().as_bytes());
    assert_eq!(st.status, 200);
    let mut out = Vec::new();
    let mut done = false;
    while let Some(ev) = st.next_event() {
        let data = ev.strip_prefix("data: ").expect("data: prefix");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        out.push(serde_json::from_str(data).unwrap());
    }
    assert!(done, "ends with [DONE]");
    out
}

#[test]
fn streamed_choices_interleave_and_equal_the_json_answer() {
    let _l = serial();
    let s = server();
    let msgs = json!([{"role": "user", "content": "Name a color and a fruit."}]);
    let body = json!({"messages": msgs, "max_tokens": 10, "temperature": 1, "seed": 5, "n": 2});
    let v = ok(post(s.addr, "/v1/chat/completions", &body));
    let want = texts(&v);
    assert_eq!(want.len(), 2);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let chunks = stream_all(s, "/v1/chat/completions", &sbody);
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
    assert_eq!(
        usage["usage"]["completion_tokens"],
        v["usage"]["completion_tokens"]
    );
    let mut got = vec![String::new(); 2];
    let mut roles = [0; 2];
    let mut finishes = [0; 2];
    for c in rest {
        assert!(c.get("usage").is_none());
        let ch = c["choices"].as_array().unwrap();
        assert_eq!(ch.len(), 1, "one choice per chunk: {c}");
        let i = ch[0]["index"].as_u64().unwrap() as usize;
        assert_eq!(finishes[i], 0, "nothing after a choice's finish chunk");
        if ch[0]["delta"]["role"] == "assistant" {
            roles[i] += 1;
        }
        if let Some(t) = ch[0]["delta"]["content"].as_str() {
            got[i].push_str(t);
        }
        if !ch[0]["finish_reason"].is_null() {
            finishes[i] += 1;
        }
    }
    assert_eq!((roles, finishes), ([1, 1], [1, 1]));
    assert_eq!(got, want);

    // Completions stream the same way.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1,
        "seed": 9, "n": 3, "ignore_eos": true});
    let want = texts(&ok(post(s.addr, "/v1/completions", &body)));
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let mut got = vec![String::new(); 3];
    for c in stream_all(s, "/v1/completions", &sbody) {
        let ch = &c["choices"][0];
        got[ch["index"].as_u64().unwrap() as usize].push_str(ch["text"].as_str().unwrap());
    }
    assert_eq!(got, want);
}

#[test]
fn n_out_of_range_and_best_of_are_400() {
    let s = server();
    for n in [0, 17, -1] {
        let e = post(
            s.addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}], "n": n}),
        )
        .openai_error(400);
        assert_eq!(e["param"], "n", "{e}");
        let e = post(s.addr, "/v1/completions", &json!({"prompt": "x", "n": n})).openai_error(400);
        assert_eq!(e["param"], "n", "{e}");
    }
    let e = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "x", "n": 2, "best_of": 3}),
    )
    .openai_error(400);
    assert_eq!(e["param"], "best_of", "{e}");
    let v = ok(post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "x", "n": 2, "best_of": 2, "max_tokens": 2}),
    ));
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
}

#[test]
fn a_disconnect_cancels_every_choice() {
    let _l = serial();
    let s = server();
    let body = json!({"prompt": "Write a very long essay about the sea.", "max_tokens": 400,
        "ignore_eos": true, "stream": true, "n": 3});
    let mut st = send(
        s.addr,
        "POST",
        "/v1/completions",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 3 {
        let c = st.next_json().expect("a chunk");
        seen.insert(c["choices"][0]["index"].as_u64().unwrap());
    }
    let running = |s: &TestServer| {
        let r = s.state.engine.stats().running;
        r.interactive + r.batch
    };
    let t0 = std::time::Instant::now();
    while running(s) < 3 {
        assert!(t0.elapsed().as_secs() < 10, "the choices run");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A client that stopped reading, then went away.
    std::thread::sleep(std::time::Duration::from_secs(1));
    drop(st);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while running(s) > 0 || s.state.inflight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "choices left running: {} running, {} in flight, {} tokens generated",
            running(s),
            s.state.inflight(),
            s.state.engine.stats().counters.generation_tokens
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn without_the_prefix_cache_the_choices_start_together() {
    let _l = serial();
    let mut a = test_args();
    a.precision = "exact".parse().unwrap();
    a.engine.set("no-prefix-cache", "true").unwrap();
    let own = TestServer::start(a);
    assert!(!own.state.engine.config().enable_prefix_cache);
    let body = json!({"prompt": "The three primary colors are", "max_tokens": 5,
        "temperature": 1, "seed": 3, "n": 2});
    let v = ok(post(own.addr, "/v1/completions", &body));
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    // The same answers as with the cache's one prefill.
    assert_eq!(
        texts(&v),
        texts(&ok(post(server().addr, "/v1/completions", &body)))
    );
    own.shutdown();
}
