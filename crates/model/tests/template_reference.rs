//! The real chat templates of the families sloserve serves (copied from llama.cpp's
//! `models/templates/` into `tests/data/templates/`) render byte for byte what
//! llama.cpp's `/apply-template` renders for the same OpenAI requests — plain turns,
//! tools offered, an assistant's call and the tool's result, and for the thinking
//! templates (Qwen3, QwQ, the R1 distills, Ministral 3 Reasoning) assistant turns that
//! carry `reasoning_content` — recorded by
//! `scripts/make_apply_template_reference.py` (`llamacpp-apply-template-<name>.jsonl`)
//! with SmolLM2's vocabulary on both sides (the templates' bos/eos texts). The
//! messages reach the template as the server passes them: a call's `arguments` an
//! object where their JSON text parses as one (`server/src/tools.rs`).

mod common;

use common::load_content;
use serde_json::Value;
use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::tokenizer::Tokenizer;

/// The day the records were made (2026-12-07, noon UTC): llama.cpp gives templates
/// today's date (Llama 3.x's `date_string`, `strftime_now` in Mistral Small 3.2's),
/// as sloserve does by default; the test renders as of the records' day.
const RECORDED_ON_UNIX: i64 = 1_796_644_800;

const SETS: &[(&str, &str)] = &[
    ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("llama3.2", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    ("llama3.3", "meta-llama-Llama-3.3-70B-Instruct.jinja"),
    ("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    (
        "mistral-small-3.2",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    ),
    ("devstral", "unsloth-mistral-Devstral-Small-2507.jinja"),
    ("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    ("qwen3", "Qwen-Qwen3-0.6B.jinja"),
    ("qwen3-coder", "Qwen3-Coder.jinja"),
    (
        "hermes-2-pro",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    ),
    (
        "r1-distill",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    ),
    (
        "r1-distill-llama",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    ),
    (
        "hermes-3",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    ),
    ("qwq", "Qwen-QwQ-32B.jinja"),
    (
        "ministral-3-reasoning",
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    ),
];

/// An OpenAI message as the server hands it to the template.
fn message(m: &Value) -> ChatMessage {
    let calls = m["tool_calls"].as_array().map(|calls| {
        Value::Array(
            calls
                .iter()
                .map(|c| {
                    let text = c["function"]["arguments"].as_str().unwrap_or("");
                    let args = serde_json::from_str::<Value>(text)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| Value::String(text.into()));
                    serde_json::json!({"id": c["id"], "type": c["type"],
                        "function": {"name": c["function"]["name"], "arguments": args}})
                })
                .collect(),
        )
    });
    ChatMessage {
        name: m["name"].as_str().map(Into::into),
        tool_calls: calls,
        tool_call_id: m["tool_call_id"].as_str().map(Into::into),
        reasoning_content: m["reasoning_content"].as_str().map(Into::into),
        ..ChatMessage::new(
            m["role"].as_str().unwrap(),
            m["content"].as_str().unwrap_or(""),
        )
    }
}

#[test]
fn templates_render_as_llamacpp() {
    let tok = Tokenizer::from_gguf(&load_content()).unwrap();
    let dir = env!("CARGO_MANIFEST_DIR");
    let mut failures = Vec::new();
    let mut n = 0;
    for (name, file) in SETS {
        let path = format!("{dir}/tests/data/templates/{file}");
        let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let t = ChatTemplate::with_tokenizer(&src, &tok).expect("the template compiles");
        t.pin_clock(RECORDED_ON_UNIX);
        let recs = format!("{dir}/tests/data/llamacpp-apply-template-{name}.jsonl");
        let recs = std::fs::read_to_string(&recs).unwrap_or_else(|e| panic!("{recs}: {e}"));
        for (i, line) in recs.lines().enumerate() {
            let rec: Value = serde_json::from_str(line).unwrap();
            let req = &rec["request"];
            let msgs: Vec<ChatMessage> = req["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(message)
                .collect();
            let gen = req["add_generation_prompt"].as_bool().unwrap_or(true);
            let ours = t.render_kwargs(&msgs, req.get("tools"), gen, None);
            n += 1;
            match (ours, rec["prompt"].as_str()) {
                (Ok(ours), Some(want)) if ours == want => {}
                (Err(_), None) => {}
                (ours, want) => failures.push(format!(
                    "{name} #{i}:\n  sloserve: {ours:?}\n  llama.cpp: {want:?}"
                )),
            }
        }
    }
    assert!(n >= 61, "{n} records");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
