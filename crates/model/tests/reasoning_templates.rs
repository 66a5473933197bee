//! Thinking models' real chat templates (copied from llama.cpp's `models/templates/`, see
//! `tests/data/templates/README.md`): the reasoning format is read from them, Qwen3's
//! `enable_thinking: false` arrives through `chat_template_kwargs` and closes an empty think
//! block in the prompt (so the answer is all content), and a DeepSeek-R1 distill's prompt
//! opens the block (so the answer starts in its reasoning).

use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::reasoning::{split_all, ReasoningFormat};

fn template(name: &str) -> ChatTemplate {
    let path = format!("{}/tests/data/templates/{name}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    ChatTemplate::new(&src, "", "<|im_end|>").expect("the template compiles")
}

fn kwargs(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().expect("an object").clone()
}

#[test]
fn qwen3_thinks_unless_told_not_to() {
    let t = template("Qwen-Qwen3-0.6B.jinja");
    assert_eq!(t.reasoning_format(), ReasoningFormat::ThinkTags);
    let msgs = [ChatMessage::new("user", "What is 2+2?")];
    let thinking = t.render_kwargs(&msgs, None, true, None).unwrap();
    assert!(
        thinking.ends_with("<|im_start|>assistant\n"),
        "{thinking:?}"
    );
    let off = kwargs(serde_json::json!({"enable_thinking": false}));
    let plain = t.render_kwargs(&msgs, None, true, Some(&off)).unwrap();
    assert!(
        plain.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{plain:?}"
    );
    // A model that thinks anyway: its answer splits; with thinking off the prompt closed it.
    let s = split_all(
        t.reasoning_format(),
        &thinking,
        "<think>\n4, plainly.\n</think>\n\n4",
    );
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("\n4, plainly.\n", "4")
    );
    let s = split_all(t.reasoning_format(), &plain, "4");
    assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("", "4"));
    // kwargs never replace the template's own variables.
    let hostile = kwargs(serde_json::json!({"messages": [], "add_generation_prompt": false}));
    assert_eq!(
        t.render_kwargs(&msgs, None, true, Some(&hostile)).unwrap(),
        thinking
    );
}

#[test]
fn r1_distill_prompt_opens_the_think_block() {
    let t = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    assert_eq!(t.reasoning_format(), ReasoningFormat::ThinkTags);
    let p = t
        .render_kwargs(&[ChatMessage::new("user", "Is 7 prime?")], None, true, None)
        .unwrap();
    assert!(p.ends_with("<think>\n"), "{p:?}");
    let s = split_all(
        t.reasoning_format(),
        &p,
        "7 has no divisors but 1 and 7.\n</think>\n\nYes.",
    );
    assert_eq!(s.reasoning, "7 has no divisors but 1 and 7.\n");
    assert_eq!(s.content, "Yes.");
}

/// The date line `strftime_now` writes (today's, in both renderings).
fn undated(p: &str) -> String {
    p.lines()
        .map(|l| match l.starts_with("Current date: ") {
            true => "Current date: (today)",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// gpt-oss's harmony template renders as llama.cpp's `/apply-template` renders it
/// (`llamacpp-apply-template-gpt-oss.jsonl`, `scripts/make_harmony_template_reference.py`:
/// a system prompt, which becomes the developer message; a second turn with
/// `reasoning_effort: high`; tools offered; a tool call with its analysis sent back as
/// `reasoning_content` and its result; that round trip answered and a new question),
/// and an answer in its channels splits: `analysis` is reasoning, `final` content.
#[test]
fn gpt_oss_harmony_renders_as_llamacpp_and_splits_by_channel() {
    let t = template("openai-gpt-oss-120b.jinja");
    assert_eq!(t.reasoning_format(), ReasoningFormat::Harmony);
    let path = format!(
        "{}/tests/data/llamacpp-apply-template-gpt-oss.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let recs = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut last = String::new();
    for line in recs.lines() {
        let rec: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut msgs: Vec<ChatMessage> =
            serde_json::from_value(rec["request"]["messages"].clone()).unwrap();
        // The calls' arguments as objects, as the server (and llama.cpp) pass them.
        for m in &mut msgs {
            for c in m
                .tool_calls
                .iter_mut()
                .flat_map(|c| c.as_array_mut().unwrap())
            {
                let a = &mut c["function"]["arguments"];
                *a = serde_json::from_str(a.as_str().unwrap()).unwrap();
            }
        }
        let kw = rec["request"]
            .get("chat_template_kwargs")
            .map(|v| kwargs(v.clone()));
        let tools = rec["request"].get("tools");
        let ours = t.render_kwargs(&msgs, tools, true, kw.as_ref()).unwrap();
        let want = rec["prompt"].as_str().unwrap();
        assert_eq!(undated(&ours), undated(want));
        last = ours;
    }
    assert!(last.ends_with("<|start|>assistant"), "{last:?}");
    let s = split_all(
        t.reasoning_format(),
        &last,
        "<|channel|>analysis<|message|>Smallest prime: 2.<|end|><|start|>assistant\
         <|channel|>final<|message|>2<|return|>",
    );
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("Smallest prime: 2.", "2")
    );
}
