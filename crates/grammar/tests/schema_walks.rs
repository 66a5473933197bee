//! The schema suite (tests/schemas/*.json) on the three real tokenizers: seeded
//! walks draw only allowed tokens until the grammar finishes; the decoded text must
//! parse and validate against the schema (the `jsonschema` crate, formats on).

mod common;

use common::{factory, schemas, walk, MODELS};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sloserve_grammar::Constraint;

fn validator(schema: &serde_json::Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("the suite's schema is invalid: {e}"))
}

fn run_suite(model: &str, file: &str) {
    let (tok, f) = factory(file);
    let eos = f.tok_trie().eos_tokens().to_vec();
    let suite = schemas();
    assert!(suite.len() >= 30, "{} schemas", suite.len());
    let mut failures = Vec::new();
    let mut mask_secs = Vec::new();
    let mut walks = 0;
    for (k, (name, schema)) in suite.iter().enumerate() {
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        let g = f
            .compile(&c)
            .unwrap_or_else(|e| panic!("{model}/{name}: compile: {e}"));
        let v = validator(schema);
        // (uniform draws first, then the chance of a uniform draw per step)
        for (w, (uniform, p)) in [(40, 0.3), (0, 0.5), (8, 0.1)].into_iter().enumerate() {
            let seed = (k * 10 + w) as u64;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut m = g.start();
            let out = walk(&mut m, &tok, &eos, &mut rng, uniform, p, 4000);
            walks += 1;
            mask_secs.extend(out.mask_secs.iter().copied());
            let text = tok.decode(&out.tokens, false).unwrap();
            if !out.finished {
                failures.push(format!("{name} walk {w}: not finished: {text:.200}"));
                continue;
            }
            let parsed = serde_json::from_str::<serde_json::Value>(&text).or_else(|e| {
                match e.to_string().contains("number out of range") {
                    true => serde_json::from_str(&common::clamp_exponents(&text)),
                    false => Err(e),
                }
            });
            match parsed {
                Err(e) => failures.push(format!("{name} walk {w}: not JSON ({e}): {text}")),
                Ok(doc) => {
                    let errs: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
                    if !errs.is_empty() {
                        failures.push(format!("{name} walk {w}: {errs:?}: {text}"));
                    }
                }
            }
        }
    }
    mask_secs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| mask_secs[((mask_secs.len() - 1) as f64 * p) as usize] * 1e6;
    eprintln!(
        "{model}: {walks} walks, {} masks, mask p50 {:.0} us p99 {:.0} us (debug test build)",
        mask_secs.len(),
        q(0.5),
        q(0.99)
    );
    assert!(
        failures.is_empty(),
        "{model}: {} invalid:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn schema_suite_smollm2_byte_level_bpe() {
    run_suite(MODELS[0].0, MODELS[0].1);
}

#[test]
fn schema_suite_gemma3_sentencepiece() {
    run_suite(MODELS[1].0, MODELS[1].1);
}

#[test]
fn schema_suite_qwen_byte_level_bpe() {
    run_suite(MODELS[2].0, MODELS[2].1);
}
