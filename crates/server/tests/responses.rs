//! `/v1/responses` against the real server and default model: the response object
//! and its echoed fields, output items (message, function_call), usage, the
//! `incomplete` status, the streamed events (order, `sequence_number`, text equal
//! to the JSON answer) and the 400s.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

/// An exact-precision server (batch-invariant: answers compare across requests).
fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        let mut a = test_args();
        a.precision = "exact".parse().unwrap();
        TestServer::start(a)
    })
}

fn ok(r: Resp) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().clone())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect()
}

const WEATHER: &str = r#"{"type": "function", "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}"#;

#[test]
fn response_object_shape_usage_and_echo() {
    let s = server();
    let body = json!({"model": "smol", "input": "Say hello.", "instructions": "You are brief.",
        "max_output_tokens": 8, "temperature": 0, "metadata": {"run": "7"}, "store": true});
    let v = ok(post(s.addr, "/v1/responses", &body));
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert_eq!(v["object"], "response");
    assert!(v["created_at"].as_u64().unwrap() > 0);
    assert!(
        v["status"] == "completed" || v["status"] == "incomplete",
        "{v}"
    );
    assert_eq!(v["model"], "smol");
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{v}");
    let m = &out[0];
    assert_eq!(
        (&m["type"], &m["role"]),
        (&json!("message"), &json!("assistant"))
    );
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["status"], v["status"]);
    assert_eq!(m["content"][0]["type"], "output_text");
    assert_eq!(m["content"][0]["annotations"], json!([]));
    // Echoed request fields; nothing stored.
    assert_eq!(v["instructions"], "You are brief.");
    assert_eq!(v["metadata"], json!({"run": "7"}));
    assert_eq!((&v["temperature"], &v["top_p"]), (&json!(0.0), &json!(1.0)));
    assert_eq!(v["max_output_tokens"], 8);
    assert_eq!(
        (&v["tools"], &v["tool_choice"]),
        (&json!([]), &json!("auto"))
    );
    assert_eq!(v["parallel_tool_calls"], true);
    assert_eq!(v["text"], json!({"format": {"type": "text"}}));
    assert_eq!(
        (&v["store"], &v["previous_response_id"]),
        (&json!(false), &Value::Null)
    );
    // The same as chat with the instructions as the system message.
    let chat = ok(post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}),
    ));
    assert_eq!(output_text(&v), chat["choices"][0]["message"]["content"]);
    let u = &v["usage"];
    assert_eq!(u["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(u["output_tokens"], chat["usage"]["completion_tokens"]);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);

    // Cut by max_output_tokens: incomplete.
    let v = ok(post(
        s.addr,
        "/v1/responses",
        &json!({"input": "Count to one hundred.", "max_output_tokens": 3, "ignore_eos": true}),
    ));
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);
}

#[test]
fn required_tool_gives_a_function_call_item_and_round_trips() {
    let s = server();
    let tool: Value = serde_json::from_str(WEATHER).unwrap();
    let body = json!({"input": "What is the weather in Paris?", "tools": [tool],
        "tool_choice": "required", "max_output_tokens": 60, "temperature": 0});
    let v = ok(post(s.addr, "/v1/responses", &body));
    let calls: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert!(!calls.is_empty(), "{v}");
    let c = calls[0];
    assert!(c["id"].as_str().unwrap().starts_with("fc_"));
    assert!(c["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        (&c["name"], &c["status"]),
        (&json!("get_weather"), &json!("completed"))
    );
    let args: Value = serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    assert_eq!(v["tool_choice"], "required");
    assert_eq!(v["tools"][0]["name"], "get_weather");

    // The call and its output sent back: a message answers.
    let mut input = vec![json!({"role": "user", "content": "What is the weather in Paris?"})];
    input.push(c.clone());
    input.push(
        json!({"type": "function_call_output", "call_id": c["call_id"], "output": "sunny, 21 C"}),
    );
    let v = ok(post(
        s.addr,
        "/v1/responses",
        &json!({"input": input, "tools": [tool], "max_output_tokens": 8, "temperature": 0}),
    ));
    assert!(!v["output"].as_array().unwrap().is_empty(), "{v}");
}

/// Each event as (the `event:` name, its data).
fn events(s: &TestServer, body: &Value) -> Vec<(String, Value)> {
    let mut st = send(
        s.addr,
        "POST",
        "/v1/responses",
        &[],
        body.to_string().as_bytes(),
    );
    assert_eq!(st.status, 200);
    assert_eq!(st.header("content-type"), Some("text/event-stream"));
    let mut out = Vec::new();
    while let Some(ev) = st.next_event() {
        let (name, data) = ev.split_once('\n').expect("event: and data: lines");
        let name = name
            .strip_prefix("event: ")
            .expect("event: line")
            .to_string();
        let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data["type"], name.as_str());
        out.push((name, data));
    }
    for (i, (_, d)) in out.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "sequence numbers count up from 0");
    }
    out
}

#[test]
fn streamed_events_in_order_equal_the_json_answer() {
    let s = server();
    let body = json!({"input": "Name three colors.", "max_output_tokens": 10, "temperature": 0});
    let want = ok(post(s.addr, "/v1/responses", &body));
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let ev = events(s, &sbody);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas > 0, "{names:?}");
    let last = if want["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    let mut expect = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expect.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expect.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]);
    assert_eq!(names, expect);
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[0].1["response"]["output"], json!([]));
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, output_text(&want));
    let item_id = &ev[2].1["item"]["id"];
    for (n, d) in &ev[3..ev.len() - 1] {
        if n != "response.output_item.done" {
            assert_eq!(&d["item_id"], item_id, "{n}");
        }
        assert_eq!(d["output_index"], 0);
    }
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["status"], want["status"]);
    assert_eq!(output_text(done), text);
    assert_eq!(
        done["usage"]["output_tokens"],
        want["usage"]["output_tokens"]
    );
    assert_eq!(done["id"], ev[0].1["response"]["id"]);

    // A forced call streams as a function_call item.
    let tool: Value = serde_json::from_str(WEATHER).unwrap();
    let ev = events(
        s,
        &json!({"input": "Weather in Oslo?", "tools": [tool], "stream": true,
            "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 60, "temperature": 0,
            "parallel_tool_calls": false}),
    );
    let added = ev
        .iter()
        .find(|(n, d)| n == "response.output_item.added" && d["item"]["type"] == "function_call")
        .expect("a function_call item");
    assert_eq!(added.1["item"]["name"], "get_weather");
    assert_eq!(added.1["item"]["arguments"], "");
    let args = ev
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .expect("arguments done");
    serde_json::from_str::<Value>(args.1["arguments"].as_str().unwrap()).unwrap();
    let done = &ev.last().unwrap();
    assert_eq!(done.0, "response.completed");
    assert_eq!(done.1["response"]["output"].as_array().unwrap().len(), 1);
}

#[test]
fn bad_requests_are_400_naming_the_field() {
    let s = server();
    for (body, param) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"model": "smol"}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "file_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tool_choice": "sometimes",
            "tools": [serde_json::from_str::<Value>(WEATHER).unwrap()]}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}),
            "text.format.schema",
        ),
        (
            json!({"input": "x", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "top_p": 0}), "top_p"),
    ] {
        let e = post(s.addr, "/v1/responses", &body).openai_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let e = post(
        s.addr,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": "r"}),
    )
    .openai_error(400);
    assert!(e["message"].as_str().unwrap().contains("stateless"), "{e}");
    let e = post(
        s.addr,
        "/v1/responses",
        &json!({"input": "x", "model": "gpt-4o"}),
    )
    .openai_error(404);
    assert_eq!(e["code"], "model_not_found");
}
