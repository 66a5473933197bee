//! Chat template rendering against llama.cpp's rendered prompts for SmolLM2-135M-Instruct,
//! plus the Hugging Face template features (pycompat methods, raise_exception, strftime_now).

mod common;

use candle_core::quantized::gguf_file::Content;
use common::{load_content, reference_json as reference};
use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::ModelError;

fn load() -> (Content, Tokenizer) {
    let content = load_content();
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
    assert_eq!(n, 3 + 3 + 1, "chat records checked");
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
