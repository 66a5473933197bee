//! Reasoning end to end through the real server. On the generated gpt-oss file (its real
//! harmony template from llama.cpp, `models/generated/gpt-oss.gguf`): a named tool call comes back as
//! `tool_calls` (JSON and streamed, `finish_reason: tool_calls`) and as a Responses
//! `function_call` item, and a history holding that call and its result renders
//! through the template in the template's own form. On SmolLM2 with a DeepSeek-R1
//! distill's template (its prompt opens `<think>`, so the answer starts in the
//! reasoning): `usage.completion_tokens_details.reasoning_tokens`, the Responses
//! reasoning item and its streamed events, `thinking_token_budget` closing the
//! reasoning after exactly that many reasoning tokens, and `response_format` applying
//! after the reasoning.

mod common;

use common::{post, send, test_args, TestServer};
use serde_json::{json, Value};

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"enum": ["Paris", "London"]}},
            "required": ["city"], "additionalProperties": false}}}])
}

/// The `data:` payloads of a stream, up to `[DONE]`.
fn events(raw: &str) -> Vec<Value> {
    raw.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .take_while(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn stream(s: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let mut st = send(s.addr, "POST", path, &[], body.to_string().as_bytes());
    assert_eq!(st.status, 200);
    events(&String::from_utf8(st.read_all()).unwrap())
}

#[test]
fn harmony_tool_calls_round_trip_on_gpt_oss() {
    let mut args = test_args();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    args.model = dir.join("../../models/generated/gpt-oss.gguf");
    // The file carries SmolLM2's vocabulary and template (`scripts/make_family_models.py`):
    // the harmony markers are text there, spelled in several tokens.
    args.chat_template_file =
        Some(dir.join("../model/tests/data/templates/openai-gpt-oss-120b.jinja"));
    let s = TestServer::start(args);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": weather_tool(), "max_tokens": 80, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let v = post(s.addr, "/v1/chat/completions", &body).json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null, "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "London", "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 0,
        "{v}"
    );

    // Streamed: the same call in deltas.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
    for c in stream(&s, "/v1/chat/completions", &sb) {
        let ch = &c["choices"][0];
        for t in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            name.push_str(t["function"]["name"].as_str().unwrap_or(""));
            arguments.push_str(t["function"]["arguments"].as_str().unwrap_or(""));
        }
        if !ch["finish_reason"].is_null() {
            finish = ch["finish_reason"].clone();
        }
    }
    assert_eq!(
        (name.as_str(), &arguments, finish),
        (
            "get_weather",
            call["arguments"]
                .as_str()
                .map(String::from)
                .as_ref()
                .unwrap(),
            json!("tool_calls")
        )
    );

    // The Responses API: a function_call item.
    let r = post(
        s.addr,
        "/v1/responses",
        &json!({"input": "Weather in Paris?", "max_output_tokens": 80, "temperature": 0,
            "tools": [{"type": "function", "name": "get_weather",
                "description": "The weather in a city",
                "parameters": weather_tool()[0]["function"]["parameters"]}],
            "tool_choice": {"type": "function", "name": "get_weather"}}),
    )
    .json();
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.last().unwrap()["type"], "function_call", "{r}");
    assert_eq!(items.last().unwrap()["arguments"], call["arguments"], "{r}");

    // The call and its result back in the history: the template writes them in
    // its own form (the recipient in the role's header; `tojson` as Python's, with
    // spaces).
    let history = json!({"messages": [{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function", "function": {"name": "get_weather",
            "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": weather_tool(), "max_tokens": 8});
    let ids: Vec<u32> = post(s.addr, "/v1/chat/completions/render", &history).json()["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let text = s.state.tokenizer.decode(&ids, false).unwrap();
    let want = format!(
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{{\"city\": {}}}<|call|>\
         <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|>\
         <|start|>assistant",
        args["city"]
    );
    assert!(text.ends_with(&want), "{text}");

    // `reasoning_effort` reaches the template (gpt-oss's system message says it).
    let render = |body: Value| {
        let r = post(s.addr, "/v1/chat/completions/render", &body);
        (r.status, r.json())
    };
    let ask = json!([{"role": "user", "content": "Hi"}]);
    let (_, v) = render(json!({"messages": ask, "reasoning_effort": "high"}));
    let ids: Vec<u32> = v["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let text = s.state.tokenizer.decode(&ids, false).unwrap();
    assert!(text.contains("Reasoning: high"), "{text}");
    let (status, v) = render(json!({"messages": ask, "reasoning_effort": "max"}));
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("reasoning_effort")),
        "{v}"
    );
    s.shutdown();
}

/// SmolLM2 with the R1 distill's template: the answer starts inside `<think>`.
fn r1_server() -> TestServer {
    let mut args = test_args();
    args.chat_template_file = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../model/tests/data/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
    );
    TestServer::start(args)
}

#[test]
fn reasoning_tokens_items_and_budget_on_a_template_that_thinks() {
    let s = r1_server();
    let ask = json!([{"role": "user", "content": "Is 7 a prime number?"}]);
    let body = json!({"messages": ask, "max_tokens": 16, "temperature": 0});
    let v = post(s.addr, "/v1/chat/completions", &body).json();
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let n = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    let total = v["usage"]["completion_tokens"].as_u64().unwrap();
    // Cut off in its reasoning: every token but what a possible tag start holds.
    if m["content"].as_str().unwrap_or("").is_empty() && !reasoning.contains('<') {
        assert_eq!(n, total, "{v}");
    }
    assert!(n > 0 && n <= total, "{v}");

    // Streamed: the usage chunk carries the same count.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let evs = stream(&s, "/v1/chat/completions", &sb);
    let usage = &evs.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"], n,
        "{usage}"
    );

    // The Responses API: a reasoning item first, with the same text.
    let rb = json!({"input": ask, "max_output_tokens": 16, "temperature": 0});
    let r = post(s.addr, "/v1/responses", &rb).json();
    let item = &r["output"][0];
    assert_eq!(item["type"], "reasoning", "{r}");
    assert_eq!(item["summary"], json!([]), "{r}");
    assert_eq!(item["content"][0]["type"], "reasoning_text", "{r}");
    assert_eq!(item["content"][0]["text"], reasoning, "{r}");
    assert_eq!(
        r["usage"]["output_tokens_details"]["reasoning_tokens"], n,
        "{r}"
    );
    let mut sr = rb.clone();
    sr["stream"] = json!(true);
    let evs = stream(&s, "/v1/responses", &sr);
    let deltas: String = evs
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, reasoning);
    let done = evs
        .iter()
        .find(|e| e["type"] == "response.reasoning_text.done")
        .unwrap();
    assert_eq!(done["text"], reasoning);

    // A budget of 4: the engine forces `</think>` after the fourth reasoning token,
    // and the answer goes on as content.
    for budget in [0u64, 4] {
        let mut b = body.clone();
        b["thinking_token_budget"] = json!(budget);
        b["max_tokens"] = json!(24);
        let v = post(s.addr, "/v1/chat/completions", &b).json();
        let u = &v["usage"];
        assert_eq!(
            u["completion_tokens_details"]["reasoning_tokens"], budget,
            "{v}"
        );
        let m = &v["choices"][0]["message"];
        assert!(
            m["content"].as_str().is_some_and(|c| !c.is_empty()),
            "budget {budget}: {v}"
        );
        if budget == 4 {
            assert!(
                reasoning.starts_with(m["reasoning_content"].as_str().unwrap()),
                "{v}"
            );
        }
    }
    // A grammar waits for the end of the reasoning the prompt opened: free reasoning
    // (here closed by a budget of 3), then the JSON the format asks for, as content.
    for budget in [Some(3), None] {
        let mut b = body.clone();
        b["response_format"] = json!({"type": "json_object"});
        b["max_tokens"] = json!(48);
        if let Some(n) = budget {
            b["thinking_token_budget"] = json!(n);
        }
        let v = post(s.addr, "/v1/chat/completions", &b).json();
        let m = &v["choices"][0]["message"];
        let r = m["reasoning_content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        // Free reasoning: the same as without the format (a prefix of it, or it).
        assert!(reasoning.starts_with(r) || r.starts_with(reasoning), "{v}");
        if budget.is_some() {
            let c = m["content"].as_str().unwrap_or_else(|| panic!("{v}"));
            assert!(c.trim_start().starts_with('{'), "{v}");
        }
    }
    // `/v1/completions` is not split (reasoning is parsed for chat only, as vLLM and
    // llama-server do): the text comes back as generated, tags and all; a budget still
    // ends the reasoning that the prompt opened.
    let prompt = "<｜User｜>Is 7 a prime number?<｜Assistant｜><think>\n";
    for budget in [None, Some(0)] {
        let mut b = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
        if let Some(n) = budget {
            b["thinking_token_budget"] = json!(n);
        }
        let v = post(s.addr, "/v1/completions", &b).json();
        let c = &v["choices"][0];
        assert!(c.get("reasoning_content").is_none(), "{v}");
        let text = c["text"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(text.starts_with("</think>"), budget.is_some(), "{v}");
    }
    let bad = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": ask, "thinking_token_budget": -1}),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    s.shutdown();
}
