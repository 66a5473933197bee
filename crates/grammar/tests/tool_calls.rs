//! Tool-call grammars (`<tool_call>\n{"name", "arguments"}\n</tool_call>`) on the
//! Qwen vocabulary: walks produce calls that name an allowed function with
//! arguments valid against its parameters; a named choice allows only that one.

mod common;

use common::{factory, walk, MODELS};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
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
    let validators: Vec<(String, jsonschema::Validator)> = tools
        .iter()
        .map(|t| {
            let s = t.parameters.clone().unwrap_or(json!({"type": "object"}));
            (t.name.clone(), jsonschema::validator_for(&s).unwrap())
        })
        .collect();
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
