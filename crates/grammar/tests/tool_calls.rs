//! Tool-call grammars (`<tool_call>\n{"name", "arguments"}\n</tool_call>`) on the
//! Qwen vocabulary: walks produce calls that name an allowed function with
//! arguments valid against its parameters; a named choice allows only that one;
//! `auto` allows text, or calls (tagged, or bare at the start) that are valid.

mod common;

use common::{factory, walk, MODELS};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_grammar::{tool_call_constraint, ToolChoice, ToolFunction};

fn tools() -> Vec<ToolFunction> {
    vec![
        ToolFunction {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"location": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["location", "unit"], "additionalProperties": false
            })),
        },
        ToolFunction {
            name: "add".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false
            })),
        },
        ToolFunction {
            name: "ping".into(),
            parameters: None,
        },
    ]
}

/// Each function's name and a validator of its arguments (any object without
/// `parameters`).
fn validators(tools: &[ToolFunction]) -> Vec<(String, jsonschema::Validator)> {
    tools
        .iter()
        .map(|t| {
            let s = t.parameters.clone().unwrap_or(json!({"type": "object"}));
            (t.name.clone(), jsonschema::validator_for(&s).unwrap())
        })
        .collect()
}

/// Splits `<tool_call>\n{json}\n</tool_call>` blocks (separated by newlines).
fn parse_calls(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<tool_call>\n") {
        let body = &rest[start + "<tool_call>\n".len()..];
        let end = body
            .find("\n</tool_call>")
            .unwrap_or_else(|| panic!("unclosed call in {text}"));
        out.push(serde_json::from_str(&body[..end]).unwrap_or_else(|e| panic!("{e}: {text}")));
        rest = &body[end + "\n</tool_call>".len()..];
    }
    assert!(rest.trim().is_empty(), "trailing text {rest:?} in {text}");
    out
}

#[test]
fn tool_call_walks_make_valid_calls() {
    let (tok, f) = factory(MODELS[2].1);
    let eos = f.tok_trie().eos_tokens().to_vec();
    let tools = tools();
    let validators = validators(&tools);
    let cases = [
        (ToolChoice::Required, false),
        (ToolChoice::Required, true),
        (ToolChoice::Named("add".into()), false),
    ];
    for (choice, parallel) in cases {
        let c = tool_call_constraint(&tools, &choice, parallel).unwrap();
        let g = f.compile(&c).unwrap();
        for seed in 0..6 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = g.start();
            let w = walk(&mut m, &tok, &eos, &mut rng, 10, 0.3, 3000);
            let text = tok.decode(&w.tokens, false).unwrap();
            assert!(w.finished, "{choice:?}: unfinished {text}");
            let calls = parse_calls(&text);
            assert!(!calls.is_empty());
            if !parallel {
                assert_eq!(calls.len(), 1, "{text}");
            }
            for call in calls {
                let name = call["name"].as_str().unwrap();
                if let ToolChoice::Named(n) = &choice {
                    assert_eq!(name, n);
                }
                let (_, v) = validators.iter().find(|(n, _)| n == name).unwrap();
                assert!(v.is_valid(&call["arguments"]), "{text}");
            }
        }
    }
    assert!(tool_call_constraint(&tools, &ToolChoice::Named("nope".into()), false).is_err());
    assert!(tool_call_constraint(&[], &ToolChoice::Required, false).is_err());
}

/// `auto` with strict tools: text with no tag ends at EOS; once the model writes
/// `<tool_call>`, what follows is a valid call (seeded walks after a text prefix);
/// a malformed body is refused; an output that begins as a bare call to a
/// function (`{"name": "add", "arguments": `) is a valid call, other JSON is text.
#[test]
fn auto_allows_text_or_constrained_calls() {
    let (tok, f) = factory(MODELS[2].1);
    let eos = f.tok_trie().eos_tokens().to_vec();
    let tools = tools();
    let c = tool_call_constraint(&tools, &ToolChoice::Auto, true).unwrap();
    let g = f.compile(&c).unwrap();
    let words = f.tok_trie().vocab_size().div_ceil(32);
    let mut mask = vec![0u32; words];
    let allowed = |mask: &[u32], t: u32| mask[t as usize / 32] >> (t % 32) & 1 == 1;

    let validators = validators(&tools);

    // Free text: almost every token, and EOS, is allowed at each step.
    let mut m = g.start();
    let text = tok
        .encode("The weather in Paris is mild; no tool is needed.", false)
        .unwrap();
    for &t in &text {
        m.fill_mask(&mut mask).unwrap();
        let n: u32 = mask.iter().map(|w| w.count_ones()).sum();
        assert!(
            n as usize > tok.vocab_size() * 9 / 10,
            "only {n} tokens allowed in text"
        );
        assert!(allowed(&mask, t));
        m.commit(t).unwrap();
    }
    m.fill_mask(&mut mask).unwrap();
    assert!(
        eos.iter().any(|&e| allowed(&mask, e)),
        "EOS refused after text"
    );

    // JSON that names no function is text.
    let mut m = g.start();
    for t in tok
        .encode("{\"name\": \"Ann\", \"arguments\": 3}", false)
        .unwrap()
    {
        m.commit(t)
            .unwrap_or_else(|e| panic!("JSON text token {t}: {e}"));
    }
    m.fill_mask(&mut mask).unwrap();
    assert!(
        eos.iter().any(|&e| allowed(&mask, e)),
        "EOS refused after JSON text"
    );

    // A bare call (no tags, as small models write them): the walk's call is valid.
    let bare = tok
        .encode("{\"name\": \"add\", \"arguments\": ", false)
        .unwrap();
    for seed in 0..4 {
        let mut m = g.start();
        for &t in &bare {
            m.commit(t)
                .unwrap_or_else(|e| panic!("bare token {t}: {e}"));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let w = walk(&mut m, &tok, &eos, &mut rng, 4, 0.3, 3000);
        assert!(w.finished);
        let all: Vec<u32> = bare.iter().copied().chain(w.tokens).collect();
        let text = tok.decode(&all, false).unwrap();
        // The call, then free text (the walk may go on after it).
        let call: Value = serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .next()
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}: {text}"));
        let (_, v) = validators
            .iter()
            .find(|(n, _)| n == call["name"].as_str().unwrap())
            .unwrap();
        assert!(v.is_valid(&call["arguments"]), "{text}");
    }

    // Text, then the tag: the walk's call is valid; the body cannot be free text.
    let tag = tok
        .encode("Let me look that up.\n<tool_call>\n", false)
        .unwrap();
    for seed in 0..6 {
        let mut m = g.start();
        for &t in &tag {
            m.commit(t).unwrap_or_else(|e| panic!("tag token {t}: {e}"));
        }
        if seed == 0 {
            let bad = tok.encode("hello", false).unwrap()[0];
            m.fill_mask(&mut mask).unwrap();
            assert!(!allowed(&mask, bad), "free text allowed inside a call");
            assert!(!eos.iter().any(|&e| allowed(&mask, e)), "EOS inside a call");
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let w = walk(&mut m, &tok, &eos, &mut rng, 6, 0.3, 3000);
        assert!(w.finished);
        let all: Vec<u32> = tag.iter().copied().chain(w.tokens).collect();
        let text = tok.decode(&all, false).unwrap();
        // The first block (free text, or more blocks, may follow it).
        let open = text.find("<tool_call>").unwrap();
        let close = text
            .find("\n</tool_call>")
            .unwrap_or_else(|| panic!("{text}"));
        let calls = parse_calls(&text[open..close + "\n</tool_call>".len()]);
        assert!(!calls.is_empty(), "{text}");
        for call in calls {
            let (_, v) = validators
                .iter()
                .find(|(n, _)| n == call["name"].as_str().unwrap())
                .unwrap();
            assert!(v.is_valid(&call["arguments"]), "{text}");
        }
    }
}
