//! `tool_choice: auto` with a strict function, over HTTP, in four model formats: the
//! real Qwen2.5-Coder-0.5B served with a real chat template of each format in place of
//! its own (`--chat-template-file`, the templates of `crates/model/tests/data/templates/`),
//! asked for the weather with a function whose `city` is at most 3 characters (and, for
//! the formats it was not trained on, told to begin with the format's marker). The
//! model writes the marker (or, in Llama 3's format, a bare call); the format's `auto`
//! grammar makes the rest a call within the schema ("par"), which the format's parser
//! returns as `tool_calls`. Not strict, Llama 3's call goes past the bound ("Paris"), and
//! the other formats' calls are not even well formed (the model does not know them).
//! Slow (five generations on the 0.5B, about 3 minutes with the build on 2 shared cores):
//! `make test-tools-slow`, not `make test`.

mod common;

use common::{post, test_args, TestServer};
use serde_json::{json, Value};

const MODEL: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// Each template, and whether the request asks for the marker. Not here: Qwen3-Coder's
/// XML and DeepSeek-R1's, whose markers the 0.5B does not write even when asked (their
/// `auto` grammars are checked token by token in `tool_format_grammar.rs`).
const TEMPLATES: &[(&str, bool)] = &[
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", false),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", true),
    ("unsloth-mistral-Devstral-Small-2507.jinja", true),
    ("vllm-tool_chat_template_phi4_mini.jinja", true),
];

fn weather(strict: bool) -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city.", "strict": strict,
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 3},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}})
}

#[test]
#[ignore = "slow: make test-tools-slow"]
fn strict_functions_are_constrained_under_auto_in_each_format() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(MODEL);
    assert!(
        path.exists(),
        "{} is missing: run `make models`",
        path.display()
    );
    for &(name, ask_marker) in TEMPLATES {
        let mut args = test_args();
        args.model = path.clone();
        args.engine.set("max-model-len", "2048").unwrap();
        args.engine.set("kv-cache-memory", "128MiB").unwrap();
        args.chat_template_file = Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../model/tests/data/templates")
                .join(name),
        );
        let s = TestServer::start(args);
        let format = s.state.chat_template.as_ref().unwrap().tool_call_format();
        let what = format!("{name} ({format:?})");
        let mut q = "What is the weather like in Paris right now? Answer in celsius.".to_string();
        if ask_marker {
            q.push_str(&format!(
                " Call the tool: begin your reply with {}",
                format.open()
            ));
        }
        let ask = |strict: bool| {
            let body = json!({"messages": [
                {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
                {"role": "user", "content": q}],
                "tools": [weather(strict)], "max_tokens": 60, "temperature": 0});
            let r = post(s.addr, "/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            let c = r.json()["choices"][0].clone();
            eprintln!("{what} strict={strict}: {c}");
            let call = c["message"]["tool_calls"][0]["function"].clone();
            let args: Option<Value> = call["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str(a).ok());
            (call["name"].clone(), args)
        };
        let (fname, args) = ask(true);
        assert_eq!(fname, "get_weather", "{what}");
        let args = args.unwrap_or_else(|| panic!("{what}: no arguments"));
        let city = args["city"].as_str().unwrap_or_default();
        assert!(
            (1..=3).contains(&city.chars().count()) && args["unit"] == "celsius",
            "{what}: {args}"
        );
        if !ask_marker {
            let (_, loose) = ask(false);
            let city = loose.as_ref().and_then(|a| a["city"].as_str());
            assert!(
                city.is_some_and(|c| c.chars().count() > 3),
                "{what}: {loose:?}"
            );
        }
        s.shutdown();
    }
}
