//! Chat template rendering against llama.cpp's rendered prompts for SmolLM2-135M-Instruct,
//! plus the Hugging Face template features (pycompat methods, raise_exception, strftime_now).

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::ModelError;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference(name: &str) -> Vec<serde_json::Value> {
    let path = repo_root().join("../shared/reference").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read reference file {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line is JSON"))
        .collect()
}

fn load() -> (Content, Tokenizer) {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = std::fs::File::open(&path).unwrap_or_else(|e| {
        panic!(
            "model file {} is missing ({e}): run `make model` to fetch it",
            path.display()
        )
    });
    let content = Content::read(&mut file).expect("model file is valid GGUF");
    let tok = Tokenizer::from_gguf(&content).expect("tokenizer builds");
    (content, tok)
}

#[test]
fn reproduces_llamacpp_chat_prompts() {
    let (content, tok) = load();
    let tmpl = ChatTemplate::from_gguf(&content, &tok)
        .unwrap()
        .expect("SmolLM2 has a template");
    assert!(tmpl.source().contains("<|im_start|>"));
    let mut n = 0;
    for file in [
        "llamacpp-greedy-smollm2-q4_1.jsonl",
        "llamacpp-f32-greedy-smollm2.jsonl",
        "llamacpp-f32-long-smollm2.jsonl",
    ] {
        for r in reference(file).into_iter().filter(|r| r["kind"] == "chat") {
            let id = r["id"].as_str().unwrap_or("?").to_string();
            let messages: Vec<ChatMessage> =
                serde_json::from_value(r["input"].clone()).expect("chat input is a message list");
            let rendered = tmpl.render(&messages, true).unwrap();
            assert_eq!(
                rendered,
                r["rendered_prompt"].as_str().unwrap(),
                "{file} {id}: rendered prompt"
            );
            let want: Vec<u32> = serde_json::from_value(r["prompt_token_ids"].clone()).unwrap();
            assert_eq!(
                tok.encode(&rendered, true).unwrap(),
                want,
                "{file} {id}: prompt tokens"
            );
            n += 1;
        }
    }
    assert!(n >= 7, "only {n} chat records found");
}

#[test]
fn default_system_message_comes_from_the_template() {
    let (content, tok) = load();
    let tmpl = ChatTemplate::from_gguf(&content, &tok).unwrap().unwrap();
    let user = [ChatMessage::new("user", "hi")];
    let out = tmpl.render(&user, false).unwrap();
    assert!(out.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    assert!(out.ends_with("<|im_start|>user\nhi<|im_end|>\n"), "{out:?}");
    let with_system = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "hi"),
    ];
    let out = tmpl.render(&with_system, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn hugging_face_template_features() {
    let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}\
               {{ raise_exception('no bad roles') }}{% endif %}\
               {{ m['role'] | upper }}: {{ m.content.strip() }}|{% if m.content.startswith(' x') %}yes{% endif %}\n\
               {% endfor %}{% if tools is none %}no tools{% endif %}{{ eos_token }}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let msgs = [ChatMessage::new("user", " x y ")];
    assert_eq!(
        t.render(&msgs, false).unwrap(),
        "<s>USER: x y|yesno tools</s>" // trim_blocks eats the newline
    );
    match t.render(&[ChatMessage::new("bad", "")], false) {
        Err(ModelError::ChatTemplate(msg)) => assert!(msg.contains("no bad roles"), "{msg}"),
        other => panic!("expected a template error, got {other:?}"),
    }
    let date = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
    let today = date.render(&[], false).unwrap();
    assert!(today.len() == 10 && today.starts_with("20"), "{today}");
    // trim_blocks / lstrip_blocks, as transformers sets them.
    let ws = ChatTemplate::new("  {% if true %}\nA\n  {% endif %}\nB", "", "").unwrap();
    assert_eq!(ws.render(&[], false).unwrap(), "A\nB");
}

#[test]
fn compile_errors_are_reported() {
    match ChatTemplate::new("{% for m in messages %}{{ m.content }", "", "") {
        Err(ModelError::ChatTemplate(msg)) => assert!(msg.contains("compile"), "{msg}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a broken template must not compile"),
    }
}
