//! Phi-3.5-mini's real chat template (`tests/data/templates/microsoft-Phi-3.5-mini-instruct.jinja`,
//! copied from llama.cpp's `models/templates/`) renders byte for byte what llama.cpp's
//! `/apply-template` renders (`llamacpp-apply-template-phi3.jsonl`, made by
//! `scripts/make_apply_template_reference.py` with `--jinja --chat-template-file` on the
//! generated phi3 file, whose bos/eos tokens both sides give the template).

use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::reasoning::ReasoningFormat;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::GgufFile;

#[test]
fn phi35_template_renders_as_llamacpp() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let gguf = format!("{dir}/../../models/generated/phi3.gguf");
    assert!(
        std::path::Path::new(&gguf).exists(),
        "{gguf} is missing: run `make models-generated` first"
    );
    let file = GgufFile::open(&gguf).unwrap();
    let tok = Tokenizer::from_gguf(&file.content).unwrap();
    let path = format!("{dir}/tests/data/templates/microsoft-Phi-3.5-mini-instruct.jinja");
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let t = ChatTemplate::with_tokenizer(&src, &tok).expect("the template compiles");
    assert_eq!(t.reasoning_format(), ReasoningFormat::None);
    let recs = format!("{dir}/tests/data/llamacpp-apply-template-phi3.jsonl");
    let recs = std::fs::read_to_string(&recs).unwrap_or_else(|e| panic!("{recs}: {e}"));
    let mut n = 0;
    for line in recs.lines() {
        let rec: serde_json::Value = serde_json::from_str(line).unwrap();
        let msgs: Vec<ChatMessage> =
            serde_json::from_value(rec["request"]["messages"].clone()).unwrap();
        let gen = rec["request"]["add_generation_prompt"]
            .as_bool()
            .unwrap_or(true);
        let ours = t.render_kwargs(&msgs, None, gen, None).unwrap();
        assert_eq!(ours, rec["prompt"].as_str().unwrap(), "{line}");
        n += 1;
    }
    assert_eq!(n, 4);
}
