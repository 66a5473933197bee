//! `forced_tokens` (grammar fast-forward) on the Qwen vocabulary: a named tool
//! call's opening is forced up to its last token; asking for forced tokens never
//! advances the matcher (every mask along a walk equals that of a matcher never
//! asked); the forced tokens are exactly the text the grammar forces next, and a
//! matcher committing them allows what it allowed after the walked tokens.

mod common;

use common::{factory, walk, MODELS};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_grammar::{from_response_format, tool_call_constraint, ToolChoice, ToolFunction};

fn weather() -> Vec<ToolFunction> {
    vec![ToolFunction {
        name: "get_weather".into(),
        parameters: Some(json!({
            "type": "object",
            "properties": {"location": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"], "additionalProperties": false
        })),
    }]
}

#[test]
fn a_named_tool_calls_opening_is_forced() {
    let (tok, f) = factory(MODELS[2].1);
    let c =
        tool_call_constraint(&weather(), &ToolChoice::Named("get_weather".into()), false).unwrap();
    let mut m = f.compile(&c).unwrap().start();
    let forced = m.forced_tokens();
    let text = tok.decode(&forced, false).unwrap();
    let whole = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"";
    assert!(
        forced.len() >= 8 && whole.starts_with(&text) && text.len() < whole.len(),
        "{forced:?} = {text:?}"
    );
    // Asking twice gives the same: nothing was consumed.
    assert_eq!(m.forced_tokens(), forced);
}

/// Walks `steps` tokens with one matcher asked for its forced tokens before every
/// mask and one never asked; the masks are equal at every step, each forced run
/// starts with an allowed token, and committing it on a third matcher (the walk
/// so far, then the run) is accepted.
#[test]
fn asking_for_forced_tokens_never_advances_the_matcher() {
    let (tok, f) = factory(MODELS[2].1);
    let eos = f.tok_trie().eos_tokens().to_vec();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                       "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false
    });
    let rf = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}});
    let schema_c = from_response_format(&rf).unwrap().unwrap();
    let tool_c = tool_call_constraint(&weather(), &ToolChoice::Required, true).unwrap();
    let mut runs = 0;
    for c in [schema_c, tool_c] {
        let g = f.compile(&c).unwrap();
        for seed in 0..4 {
            let mut rng = StdRng::seed_from_u64(seed);
            let w = walk(&mut g.start(), &tok, &eos, &mut rng, 6, 0.3, 400);
            let (mut asked, mut plain) = (g.start(), g.start());
            let words = asked.vocab_size().div_ceil(32);
            let (mut ma, mut mp) = (vec![0u32; words], vec![0u32; words]);
            for (n, &t) in w.tokens.iter().enumerate() {
                let forced = asked.forced_tokens();
                asked.fill_mask(&mut ma).unwrap();
                plain.fill_mask(&mut mp).unwrap();
                assert_eq!(ma, mp, "seed {seed}: masks differ at token {n}");
                if let Some(&first) = forced.first() {
                    runs += 1;
                    assert!(ma[first as usize / 32] & (1 << (first % 32)) != 0);
                    let mut check = g.start();
                    for &u in &w.tokens[..n] {
                        check.commit(u).unwrap();
                    }
                    for &u in &forced {
                        check
                            .commit(u)
                            .unwrap_or_else(|e| panic!("forced {u}: {e}"));
                    }
                }
                asked.commit(t).unwrap();
                plain.commit(t).unwrap();
            }
            assert_eq!(asked.is_finished(), plain.is_finished());
        }
    }
    assert!(runs > 20, "forced runs seen: {runs}");
}
