//! Tool-call formats read from real chat templates (copied from llama.cpp's
//! `models/templates/`, see `tests/data/templates/README.md`): each template's format is
//! detected as llama.cpp detects it, and an assistant turn with a call, rendered by the
//! template itself, holds the call as `ToolCallFormat::write_call` spells it.

use serde_json::json;
use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::tool_format::ToolCallFormat;

fn source(name: &str) -> String {
    let path = format!("{}/tests/data/templates/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Each template and its format.
const TEMPLATES: &[(&str, ToolCallFormat)] = &[
    (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        ToolCallFormat::Llama3Json,
    ),
    (
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        ToolCallFormat::Llama3Json,
    ),
    (
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
        ToolCallFormat::Llama3Json,
    ),
    (
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        ToolCallFormat::MistralArray,
    ),
    (
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        ToolCallFormat::MistralArgs,
    ),
    (
        "unsloth-mistral-Devstral-Small-2507.jinja",
        ToolCallFormat::MistralArgs,
    ),
    ("Qwen3-Coder.jinja", ToolCallFormat::Qwen3CoderXml),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        ToolCallFormat::Hermes,
    ),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::Hermes),
    ("Qwen-Qwen3-0.6B.jinja", ToolCallFormat::Hermes),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        ToolCallFormat::DeepSeekR1,
    ),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        ToolCallFormat::DeepSeekR1,
    ),
    // vLLM's template for Phi-4-mini (`functools[...]` in its instructions); it writes
    // history calls as Python reprs, so it is not in the rendering check below.
    (
        "vllm-tool_chat_template_phi4_mini.jinja",
        ToolCallFormat::Phi4MiniJson,
    ),
];

#[test]
fn formats_are_detected_from_the_real_templates() {
    for &(name, want) in TEMPLATES {
        let src = source(name);
        assert_eq!(ToolCallFormat::for_model(None, Some(&src)), want, "{name}");
        let arch = if name.contains("Qwen") {
            "qwen2"
        } else if name.contains("phi4") {
            "phi3"
        } else {
            "llama"
        };
        let family = sloserve_model::family::family(arch);
        assert_eq!(
            ToolCallFormat::for_model(family, Some(&src)),
            want,
            "{name}"
        );
    }
}

#[test]
fn templates_write_calls_as_the_format_spells_them() {
    let args = json!({"city": "Paris"});
    // R1-Distill-Llama's template writes calls only where `content` is none (here "").
    let rendered = |n: &&str| !n.contains("phi4") && !n.contains("R1-Distill-Llama");
    for &(name, format) in TEMPLATES.iter().filter(|(n, _)| rendered(n)) {
        let t = match ChatTemplate::new(&source(name), "<s>", "</s>") {
            Ok(t) => t,
            Err(e) => panic!("{name}: {e}"),
        };
        assert_eq!(t.tool_call_format(), format, "{name}");
        let call = ChatMessage {
            tool_calls: Some(json!([{"id": "abcdefghi", "type": "function",
                "function": {"name": "get_weather", "arguments": args}}])),
            ..ChatMessage::new("assistant", "")
        };
        let result = ChatMessage {
            tool_call_id: Some("abcdefghi".into()),
            ..ChatMessage::new("tool", "sunny")
        };
        let msgs = [ChatMessage::new("user", "Weather in Paris?"), call, result];
        // Tools offered (Qwen3-Coder's `tools is iterable` holds for none in minijinja).
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "description": "The weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}}}}]);
        let text = t
            .render_kwargs(&msgs, Some(&tools), false, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let written = format.write_call("get_weather", &args);
        // Mistral writes each call's id too: before `[ARGS]` (Small 3.2) or as the
        // array item's last key (Nemo).
        let written = match format {
            ToolCallFormat::MistralArray => written.trim_end_matches("}]").to_string(),
            ToolCallFormat::MistralArgs if text.contains("[CALL_ID]") => {
                written.replace("[ARGS]", "[CALL_ID]abcdefghi[ARGS]")
            }
            _ => written,
        };
        assert!(
            text.contains(&written),
            "{name}: {written:?} not in\n{text}"
        );
    }
}

/// Llama 3's vocabulary (llama.cpp's `ggml-vocab-llama-bpe.gguf`, see
/// `tests/data/vocab/README.md`).
fn llama3_tokenizer() -> sloserve_model::tokenizer::Tokenizer {
    use std::io::Read;
    let path = format!(
        "{}/tests/data/vocab/ggml-vocab-llama-bpe.gguf.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let gz = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut gguf = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut gguf)
        .unwrap();
    let content =
        candle_core::quantized::gguf_file::Content::read(&mut std::io::Cursor::new(gguf)).unwrap();
    sloserve_model::tokenizer::Tokenizer::from_gguf(&content).unwrap()
}

#[test]
fn a_kept_marker_is_decoded_where_control_tokens_are_dropped() {
    use sloserve_model::detokenizer::StreamDecoder;
    let tok = llama3_tokenizer();
    // This vocabulary (Llama 3.0) predates `<|python_tag|>`: there the marker is plain
    // text, so the server keeps nothing; a control token it has stands in for it.
    assert!(tok
        .encode(ToolCallFormat::Llama3Json.rendered_markers()[0], true)
        .unwrap()
        .iter()
        .all(|&id| !tok.is_special(id)));
    let ids = tok.encode("<|eot_id|>", true).unwrap();
    assert_eq!(ids.len(), 1);
    assert!(tok.is_special(ids[0]), "a control token");
    let text = tok.encode("{\"name\": \"f\"}", false).unwrap();
    let all: Vec<u32> = ids.iter().chain(&text).copied().collect();
    let run = |keep: Vec<u32>| {
        let mut d = StreamDecoder::new(true);
        d.keep(keep);
        let mut s: String = all.iter().map(|&id| d.push(&tok, id).to_string()).collect();
        s.push_str(&d.flush());
        s
    };
    assert_eq!(run(Vec::new()), "{\"name\": \"f\"}");
    assert_eq!(run(ids.clone()), "<|eot_id|>{\"name\": \"f\"}");
}

/// gpt-oss's template is harmony's (it writes the recipient and the `functions.`
/// namespace apart, so detection reads the namespace), and so is the family's default.
#[test]
fn gpt_oss_is_harmony() {
    let src = source("openai-gpt-oss-120b.jinja");
    assert_eq!(
        ToolCallFormat::for_model(None, Some(&src)),
        ToolCallFormat::Harmony
    );
    let family = sloserve_model::family::family("gpt-oss");
    assert_eq!(
        ToolCallFormat::for_model(family, None),
        ToolCallFormat::Harmony
    );
}
