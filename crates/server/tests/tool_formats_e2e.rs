//! Tool calls end to end in each model format: the server, on SmolLM2 with a real chat
//! template of each format in place of its own (`--chat-template-file`, the templates of
//! `crates/model/tests/data/templates/`), answers `tool_choice` named and `required`
//! with the call in the template's format (the grammar's), parsed into `tool_calls`,
//! the same streamed and not. With `parallel_tool_calls: false`, so that the grammar
//! ends the answer after one call (SmolLM2 does not know these templates' end of turn).

mod common;

use common::{post, send, test_args, TestServer};
use serde_json::{json, Value};

const TEMPLATES: &[&str] = &[
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "unsloth-mistral-Devstral-Small-2507.jinja",
    "Qwen3-Coder.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
];

/// The formats added later, whose markers are many tokens in SmolLM2's vocabulary: about 35 s
/// more, so in `make test-tools-slow`.
const SLOW_TEMPLATES: &[&str] = &[
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "vllm-tool_chat_template_phi4_mini.jinja",
];

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"enum": ["Paris", "London"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
            "properties": {}}}}])
}

fn check_call(call: &Value, what: &str) {
    assert_eq!(call["function"]["name"], "get_weather", "{what}: {call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{what}: {e}: {call}"));
    assert!(
        args["city"] == "Paris" || args["city"] == "London",
        "{what}: {args}"
    );
    assert!(
        args["days"].as_u64().is_some_and(|d| (1..=9).contains(&d)),
        "{what}: {args}"
    );
}

#[test]
fn forced_calls_in_each_template_format_come_back_as_tool_calls() {
    forced_calls(TEMPLATES);
}

#[test]
#[ignore = "slow: make test-tools-slow"]
fn forced_calls_in_the_r1_and_phi4_mini_formats_come_back_as_tool_calls() {
    forced_calls(SLOW_TEMPLATES);
}

fn forced_calls(templates: &[&str]) {
    for name in templates {
        let mut args = test_args();
        // Devstral's system prompt alone is 1,400 tokens.
        args.engine.set("max-model-len", "2048").unwrap();
        args.engine.set("kv-cache-memory", "256MiB").unwrap();
        args.chat_template_file = Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../model/tests/data/templates")
                .join(name),
        );
        let s = TestServer::start(args);
        let format = s.state.chat_template.as_ref().unwrap().tool_call_format();
        let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": tools(), "max_tokens": 160, "temperature": 0, "parallel_tool_calls": false,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            // The R1 template's prompt opens a think block, after which the grammar would
            // apply: closed here, so the call comes first.
            "chat_template_kwargs": {"enable_thinking": false}});
        let r = post(s.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let v = r.json();
        let choice = &v["choices"][0];
        let what = format!("{name} ({format:?})");
        assert_eq!(choice["finish_reason"], "tool_calls", "{what}: {v}");
        assert_eq!(choice["message"]["content"], Value::Null, "{what}: {v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{what}: {v}");
        check_call(&calls[0], &what);

        // Streamed: the same call in deltas.
        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let mut st = send(
            s.addr,
            "POST",
            "/v1/chat/completions",
            &[],
            stream.to_string().as_bytes(),
        );
        assert_eq!(st.status, 200);
        let raw = String::from_utf8(st.read_all()).unwrap();
        let (mut fname, mut fargs, mut content) = (String::new(), String::new(), String::new());
        for ev in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
            if ev == "[DONE]" {
                break;
            }
            let c: Value = serde_json::from_str(ev).unwrap();
            let d = &c["choices"][0]["delta"];
            content.push_str(d["content"].as_str().unwrap_or(""));
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                fname.push_str(t["function"]["name"].as_str().unwrap_or(""));
                fargs.push_str(t["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(content, "", "{what}: {raw}");
        assert_eq!(
            json!({"function": {"name": fname, "arguments": fargs}}),
            json!({"function": calls[0]["function"].clone()}),
            "{what}"
        );

        // `required` (parallel calls off: SmolLM2 does not know these templates' end of
        // turn, so it would go on calling): one call to either function.
        let mut req = body.clone();
        req["tool_choice"] = json!("required");
        let v = post(s.addr, "/v1/chat/completions", &req).json();
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().cloned();
        let calls = calls.unwrap_or_else(|| panic!("{what}: required: {v}"));
        assert_eq!(calls.len(), 1, "{what}: {v}");
        s.shutdown();
    }
}
