//! The grammar of a forced tool call in each model format (`sloserve_grammar`, compiled
//! on the Qwen2.5 vocabulary) makes text that the server's parser reads back as the
//! same calls: the calls `ToolCallFormat::write_call` spells are accepted token by
//! token, the forced prefix of a named call is that text's start, and random walks
//! through the grammar parse back to calls of the named function with valid arguments.

use serde_json::{json, Value};
use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_grammar::{tool_call_constraint_in, GrammarFactory, ToolChoice, ToolFunction};
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::tool_format::{ToolCallFormat, ALL, R1_CALLS_BEGIN, R1_CALLS_END};
use sloserve_model::GgufFile;
use sloserve_server::tool_parser::{Functions, ToolCallParser, ToolEvent};

const MODEL: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn factory() -> (Tokenizer, GrammarFactory) {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(MODEL);
    assert!(p.exists(), "{} is missing: run `make models`", p.display());
    let file = GgufFile::open(&p).unwrap();
    let tok = Tokenizer::from_gguf(&file.content).unwrap();
    let f = GrammarFactory::from_tokenizer(&tok, tok.vocab_size()).unwrap();
    (tok, f)
}

fn tools() -> Vec<ToolFunction> {
    vec![
        ToolFunction {
            name: "get_weather".into(),
            parameters: Some(json!({"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]})),
        },
        ToolFunction {
            name: "add".into(),
            parameters: Some(json!({"type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"], "additionalProperties": false})),
        },
    ]
}

fn parse(format: ToolCallFormat, text: &str) -> (String, Vec<(String, Value)>) {
    let mut p = ToolCallParser::new(Functions {
        format,
        names: vec!["get_weather".into(), "add".into()],
        string_params: vec![("get_weather".into(), "city".into())],
    });
    // Harmony's calls reach the parser through the reasoning splitter, as the
    // server gives them (the answer continues `<|start|>assistant`).
    let split;
    let text = match format {
        ToolCallFormat::Harmony => {
            let mut sp = sloserve_model::reasoning::ReasoningFormat::Harmony
                .splitter("<|start|>assistant")
                .with_calls();
            let mut out = sloserve_model::reasoning::Split::default();
            sp.push(text, &mut out);
            sp.finish(&mut out);
            split = out;
            &split.content
        }
        _ => text,
    };
    let mut events = p.push(text);
    events.extend(p.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::Call(c) => {
                let args = serde_json::from_str(&c.arguments)
                    .unwrap_or_else(|e| panic!("{format:?}: arguments {:?}: {e}", c.arguments));
                calls.push((c.name, args));
            }
        }
    }
    (content, calls)
}

/// How parallel calls follow each other in `format`'s grammar.
fn join(format: ToolCallFormat, a: &str, b: &str) -> String {
    match format {
        ToolCallFormat::MistralArray => format!(
            "{}, {}",
            a.trim_end_matches(']'),
            &b["[TOOL_CALLS][".len()..]
        ),
        ToolCallFormat::Phi4MiniJson => {
            format!("{}, {}", a.trim_end_matches(']'), &b["functools[".len()..])
        }
        ToolCallFormat::DeepSeekR1 => format!(
            "{}\n{}",
            a.trim_end_matches(R1_CALLS_END),
            &b[R1_CALLS_BEGIN.len()..]
        ),
        ToolCallFormat::MistralArgs => format!("{a}{b}"),
        _ => format!("{a}\n{b}"),
    }
}

#[test]
fn written_calls_are_accepted_and_parse_back() {
    let (tok, f) = factory();
    let weather = json!({"city": "Paris", "days": 2});
    let add = json!({"a": 1, "b": 2});
    for format in ALL {
        let one = format.write_call("get_weather", &weather);
        let two = join(format, &one, &format.write_call("add", &add));
        for (choice, parallel, text) in [
            (ToolChoice::Named("get_weather".into()), false, &one),
            (ToolChoice::Required, false, &one),
            (ToolChoice::Required, true, &two),
        ] {
            // One call a harmony turn: `<|call|>` ends it.
            if parallel && format == ToolCallFormat::Harmony {
                continue;
            }
            let c = tool_call_constraint_in(format, &[], &tools(), &choice, parallel).unwrap();
            let g = f.compile(&c).unwrap_or_else(|e| panic!("{format:?}: {e}"));
            let mut m = g.start();
            if matches!(choice, ToolChoice::Named(_)) {
                let forced = String::from_utf8(m.forced_bytes()).unwrap();
                assert!(
                    !forced.is_empty() && one.starts_with(&forced),
                    "{format:?}: forced {forced:?}"
                );
            }
            for t in tok.encode(text, false).unwrap() {
                m.commit(t)
                    .unwrap_or_else(|e| panic!("{format:?} {choice:?}: {text:?} at {t}: {e}"));
            }
            assert!(
                m.is_accepting() || m.is_finished(),
                "{format:?}: {text:?} not complete"
            );
            let (content, calls) = parse(format, text);
            assert_eq!(content, "", "{format:?}");
            assert_eq!(
                calls[0],
                ("get_weather".to_string(), weather.clone()),
                "{format:?}"
            );
            assert_eq!(calls.len(), if parallel { 2 } else { 1 }, "{format:?}");
        }
    }
}

#[test]
fn random_walks_through_each_format_parse_back() {
    let (tok, f) = factory();
    let eos = f.tok_trie().eos_tokens().to_vec();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for format in ALL {
        let c = tool_call_constraint_in(
            format,
            &[],
            &tools(),
            &ToolChoice::Named("add".into()),
            false,
        )
        .unwrap();
        let g = f.compile(&c).unwrap();
        for walk in 0..8 {
            let mut m = g.start();
            let mut mask = vec![0u32; f.vocab_size().div_ceil(32)];
            let mut ids = Vec::new();
            let mut text_ids = Vec::new();
            for _ in 0..200 {
                m.fill_mask(&mut mask).unwrap();
                ids.clear();
                for (w, &bits) in mask.iter().enumerate() {
                    let mut b = bits;
                    while b != 0 {
                        ids.push(w as u32 * 32 + b.trailing_zeros());
                        b &= b - 1;
                    }
                }
                assert!(!ids.is_empty(), "{format:?}: empty mask");
                // EOS as soon as allowed; else a random allowed token.
                let t = match ids.iter().find(|t| eos.contains(t)) {
                    Some(&t) => t,
                    None => ids[next(ids.len())],
                };
                if eos.contains(&t) {
                    break;
                }
                m.commit(t).unwrap();
                text_ids.push(t);
                if m.is_finished() {
                    break;
                }
            }
            let text = tok.decode(&text_ids, false).unwrap();
            if walk == 0 {
                eprintln!("{format:?}: {text:?}");
            }
            let (content, calls) = parse(format, &text);
            assert_eq!(content, "", "{format:?} walk {walk}: {text:?}");
            assert_eq!(calls.len(), 1, "{format:?} walk {walk}: {text:?}");
            let (name, args) = &calls[0];
            assert_eq!(name, "add");
            for k in ["a", "b"] {
                let v = args[k].as_u64().unwrap_or(999);
                assert!(v <= 99, "{format:?} walk {walk}: {text:?}");
            }
        }
    }
}

#[test]
fn a_marker_that_is_a_control_token_is_asked_for_as_the_token() {
    // Qwen's vocabulary has no `[TOOL_CALLS]`: a control token of it stands in.
    let (tok, f) = factory();
    let id = tok.encode("<|im_start|>", true).unwrap()[0];
    assert!(tok.is_special(id));
    let markers = [("[TOOL_CALLS]", id), ("[ARGS]", id)];
    let args = json!({"a": 1, "b": 2});
    for format in [ToolCallFormat::MistralArray, ToolCallFormat::MistralArgs] {
        let c = tool_call_constraint_in(format, &markers, &tools(), &ToolChoice::Required, false)
            .unwrap();
        let g = f.compile(&c).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        let mut m = g.start();
        // The written call with its markers as the token.
        let text = format.write_call("add", &args);
        let mut ids = Vec::new();
        for (k, piece) in text.split("[TOOL_CALLS]").enumerate() {
            if k > 0 {
                ids.push(id);
            }
            for (j, part) in piece.split("[ARGS]").enumerate() {
                if j > 0 {
                    ids.push(id);
                }
                ids.extend(tok.encode(part, false).unwrap());
            }
        }
        for t in ids {
            m.commit(t).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        }
        assert!(m.is_accepting() || m.is_finished(), "{format:?}");
        // The marker's text is not a way in.
        let mut m = g.start();
        let first = tok.encode("[", false).unwrap()[0];
        assert!(m.commit(first).is_err(), "{format:?}: text for the marker");
    }
}

/// The tokens a mask allows.
fn allowed_ids(mask: &[u32]) -> Vec<u32> {
    let mut ids = Vec::new();
    for (w, &bits) in mask.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            ids.push(w as u32 * 32 + b.trailing_zeros());
            b &= b - 1;
        }
    }
    ids
}

/// `auto` with strict functions in every format that constrains it: free text ends
/// at EOS; text then a written call is accepted and parses back to the text and the
/// call; once the format's marker opens a call, free text is refused and random walks
/// make valid calls; arguments against the schema are refused, tagged or bare.
#[test]
fn auto_with_strict_functions_constrains_calls_in_each_format() {
    let (tok, f) = factory();
    let eos = f.tok_trie().eos_tokens().to_vec();
    let mut mask = vec![0u32; f.vocab_size().div_ceil(32)];
    let commit_all = |m: &mut sloserve_grammar::GrammarMatcher, text: &str| {
        tok.encode(text, false)
            .unwrap()
            .into_iter()
            .try_for_each(|t| m.commit(t).map_err(|e| format!("{text:?} at {t}: {e}")))
    };
    let mut seed: u64 = 0x51f1_5eed_d00d_f00d;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for format in ALL.into_iter().filter(|f| f.constrains_auto()) {
        let c = tool_call_constraint_in(format, &[], &tools(), &ToolChoice::Auto, true).unwrap();
        let g = f.compile(&c).unwrap_or_else(|e| panic!("{format:?}: {e}"));

        // Free text, then EOS.
        let mut m = g.start();
        commit_all(&mut m, "The weather in Paris is mild; no tool is needed.").unwrap();
        m.fill_mask(&mut mask).unwrap();
        let ids = allowed_ids(&mask);
        assert!(
            eos.iter().any(|e| ids.contains(e)),
            "{format:?}: EOS refused"
        );
        assert!(
            ids.len() > tok.vocab_size() * 9 / 10,
            "{format:?}: text narrowed"
        );

        // Text, then a call as the format writes it.
        // (Llama 3's is written bare: after text, behind its optional marker.)
        let tagged = |c: String| match c.starts_with(format.open()) {
            true => c,
            false => format!("{}{c}", format.open()),
        };
        let call = tagged(format.write_call("get_weather", &json!({"city": "Paris", "days": 2})));
        let text = format!("Let me check. {call}");
        let mut m = g.start();
        commit_all(&mut m, &text).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert!(m.is_accepting(), "{format:?}: {text:?} not complete");
        let (content, calls) = parse(format, &text);
        assert_eq!(content, "Let me check.", "{format:?}");
        assert_eq!(
            calls,
            [(
                "get_weather".to_string(),
                json!({"city": "Paris", "days": 2})
            )],
            "{format:?}"
        );

        // Arguments against the schema are refused (`a` is at most 99).
        let bad = format!(
            "Sum: {}",
            tagged(format.write_call("add", &json!({"a": 100, "b": 1})))
        );
        assert!(
            commit_all(&mut g.start(), &bad).is_err(),
            "{format:?}: {bad:?} accepted"
        );
        if format.bare_calls() {
            let lead = if format == ToolCallFormat::MistralArray {
                "["
            } else {
                ""
            };
            let key = format.arguments_key();
            let bare = format!("{lead}{{\"name\": \"add\", \"{key}\": {{\"a\": 100");
            assert!(
                commit_all(&mut g.start(), &bare).is_err(),
                "{format:?}: bare {bare:?} accepted"
            );
            let ok = format!("{lead}{{\"name\": \"add\", \"{key}\": {{\"a\": 1, \"b\": 2}}}}");
            commit_all(&mut g.start(), &ok).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        }

        // After the marker: no free text; walks make valid calls (to `add` alone, whose
        // arguments are small integers: a raw XML string rarely ends in a walk).
        let c = tool_call_constraint_in(format, &[], &tools()[1..], &ToolChoice::Auto, true);
        let g = f.compile(&c.unwrap()).unwrap();
        let prefix = format!("Checking. {}", format.open());
        for walk in 0..4 {
            let mut m = g.start();
            commit_all(&mut m, &prefix).unwrap();
            if walk == 0 {
                let hello = tok.encode("hello", false).unwrap()[0];
                m.fill_mask(&mut mask).unwrap();
                assert!(
                    !allowed_ids(&mask).contains(&hello),
                    "{format:?}: text in a call"
                );
            }
            let mut ids = Vec::new();
            for _ in 0..300 {
                m.fill_mask(&mut mask).unwrap();
                let allowed = allowed_ids(&mask);
                if allowed.iter().any(|t| eos.contains(t)) {
                    break;
                }
                // Half the time a short token that can close something, so that
                // strings and blocks end.
                let closing: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| {
                        let b = tok.token_bytes(t);
                        b.len() <= 3 && b.iter().any(|c| b"\"}]\n<>`".contains(c))
                    })
                    .collect();
                let t = if !closing.is_empty() && next(2) == 0 {
                    closing[next(closing.len())]
                } else {
                    allowed[next(allowed.len())]
                };
                m.commit(t).unwrap();
                ids.push(t);
            }
            let text = format!("{prefix}{}", tok.decode(&ids, false).unwrap());
            let (content, calls) = parse(format, &text);
            // (A token may end the call and begin free text after it.)
            assert!(content.starts_with("Checking."), "{format:?}: {text:?}");
            assert!(!calls.is_empty(), "{format:?}: {text:?}");
            for (name, args) in calls {
                match name.as_str() {
                    "add" => assert!(
                        ["a", "b"]
                            .iter()
                            .all(|k| args[k].as_u64().is_some_and(|v| v <= 99)),
                        "{format:?}: {text:?}"
                    ),
                    "get_weather" => assert!(args["city"].is_string(), "{format:?}: {text:?}"),
                    n => panic!("{format:?}: {n} in {text:?}"),
                }
            }
        }
    }
    // Harmony's is refused (its calls are parsed unconstrained).
    assert!(tool_call_constraint_in(
        ToolCallFormat::Harmony,
        &[],
        &tools(),
        &ToolChoice::Auto,
        true
    )
    .is_err());
}

/// `auto` with a marker that is a control token: text, the token, the call.
#[test]
fn auto_asks_for_a_control_token_marker_as_the_token() {
    let (tok, f) = factory();
    let id = tok.encode("<|im_start|>", true).unwrap()[0];
    let markers = [("[TOOL_CALLS]", id), ("[ARGS]", id)];
    let c = tool_call_constraint_in(
        ToolCallFormat::MistralArgs,
        &markers,
        &tools(),
        &ToolChoice::Auto,
        false,
    )
    .unwrap();
    let g = f.compile(&c).unwrap();
    let mut m = g.start();
    let enc = |s: &str| tok.encode(s, false).unwrap();
    let ids: Vec<u32> = [
        enc("Adding."),
        vec![id],
        enc("add"),
        vec![id],
        enc("{\"a\": 1, \"b\": 2}"),
    ]
    .concat();
    for t in ids {
        m.commit(t).unwrap();
    }
    assert!(m.is_accepting());
    // Not after a wrong name.
    let mut m = g.start();
    let bad: Vec<u32> = [enc("Adding."), vec![id], enc("nope")].concat();
    assert!(bad.into_iter().try_for_each(|t| m.commit(t)).is_err());
}
