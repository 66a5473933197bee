//! Grammar fast-forward on a real instruction model (Qwen2.5-Coder-0.5B-Instruct
//! Q4_K_M, fast precision): a json_schema reply (greedy and seeded sampling) and a
//! named tool call, run concurrently on an engine with fast-forward off and on,
//! give the same tokens, and with it on the forced tokens went in as drafts, most
//! were accepted, and the engine took fewer steps (52 -> 32 at this commit).
//! N-gram speculation is off in both runs, so the steps saved are fast-forward's.
//! One test in this file (one 0.5B load at a time).

mod common;

use common::repo_root;
use serde_json::json;
use sloserve_engine::sampler::constraint::SharedConstraint;
use sloserve_engine::{Engine, EngineConfig, EngineStats, Event, FinishReason, Request, SloClass};
use sloserve_grammar::{
    from_response_format, tool_call_constraint, GrammarFactory, ToolChoice, ToolFunction,
};
use sloserve_model::gguf::GgufFile;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

const MODEL: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// A Qwen chat prompt (system, user, the assistant's turn opened).
fn chat(tok: &Tokenizer, system: &str, user: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    tok.encode(&text, true).expect("tokenize")
}

/// The requests: (name, request), each with its compiled grammar.
fn requests(tok: &Tokenizer, f: &GrammarFactory) -> Vec<(&'static str, Request)> {
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24},
            "population_millions": {"type": "number"},
            "is_capital": {"type": "boolean"},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}
        },
        "required": ["city", "country", "population_millions", "is_capital", "landmarks"],
        "additionalProperties": false
    });
    let rf = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema}});
    let city: SharedConstraint = f
        .compile(&from_response_format(&rf).unwrap().unwrap())
        .unwrap();
    let tools = vec![ToolFunction {
        name: "get_current_weather".into(),
        parameters: Some(json!({
            "type": "object",
            "properties": {
                "location": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            },
            "required": ["location", "unit"],
            "additionalProperties": false
        })),
    }];
    let named = ToolChoice::Named("get_current_weather".into());
    let call: SharedConstraint = f
        .compile(&tool_call_constraint(&tools, &named, false).unwrap())
        .unwrap();
    let json_prompt = chat(
        tok,
        "You are a helpful assistant. Answer in JSON.",
        "Describe Paris as a JSON object.",
    );
    let tool_prompt = chat(
        tok,
        "You are a helpful assistant with a tool get_current_weather(location, unit). \
         Call it in <tool_call></tool_call> tags as JSON with \"name\" and \"arguments\".",
        "What is the weather like in Lisbon, in celsius?",
    );
    let eos = tok.stop_token_ids();
    let make = |prompt: &Vec<u32>, g: &SharedConstraint, max_tokens: usize, temperature: f32| {
        let mut r = Request::greedy(prompt.clone(), max_tokens).with_class(SloClass::Interactive);
        r.stop.eos_token_ids = eos.clone();
        r.sampling.temperature = temperature;
        r.sampling.seed = Some(7);
        r.sampling.repetition_penalty = 1.2;
        r.constraint = Some(g.clone());
        r
    };
    vec![
        ("json_schema, greedy", make(&json_prompt, &city, 120, 0.0)),
        ("json_schema, sampled", make(&json_prompt, &city, 120, 0.8)),
        (
            "named tool call, greedy",
            make(&tool_prompt, &call, 60, 0.0),
        ),
    ]
}

/// Runs every request concurrently on a fresh engine; their tokens and the
/// engine's counters.
fn run(grammar_max_forced: usize) -> (Vec<Vec<u32>>, EngineStats) {
    let path = repo_root().join(MODEL);
    assert!(
        path.exists(),
        "{} is missing: run `make model-qwen0.5b`",
        path.display()
    );
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: Some(64 << 20),
        max_model_len: Some(2048),
        ..Default::default()
    };
    let runner = LlamaRunner::load(&path, &opts).expect("load the 0.5B");
    let file = GgufFile::open(&path).expect("open the 0.5B");
    let tok = Tokenizer::from_gguf(&file.content).expect("tokenizer");
    let f = GrammarFactory::from_tokenizer(&tok, runner_vocab(&file)).expect("grammar");
    let cfg = EngineConfig {
        grammar_max_forced,
        spec_max_draft: 0,
        ..EngineConfig::default()
    };
    let engine = Engine::start(Box::new(runner), cfg).expect("start the engine");
    let streams: Vec<_> = requests(&tok, &f)
        .into_iter()
        .map(|(_, r)| engine.submit(r).expect("submit"))
        .collect();
    let outs = streams
        .into_iter()
        .map(|mut s| {
            let mut tokens = Vec::new();
            while let Some(ev) = s.blocking_recv() {
                match ev {
                    Event::Token { id, .. } => tokens.push(id),
                    Event::PromptLogprobs(_) | Event::Pooled(_) => {}
                    Event::Finished(f) => {
                        assert!(
                            matches!(f.reason, FinishReason::Stop | FinishReason::Length),
                            "finished {:?}",
                            f.reason
                        );
                        assert_eq!(f.completion_tokens, tokens.len());
                        break;
                    }
                }
            }
            tokens
        })
        .collect();
    let stats = engine.stats();
    engine.shutdown();
    (outs, stats)
}

/// The model's logits width (the output matrix's rows; token_embd when tied).
fn runner_vocab(file: &GgufFile) -> usize {
    ["output.weight", "token_embd.weight"]
        .iter()
        .find_map(|n| file.content.tensor_infos.get(*n))
        .map(|t| *t.shape.dims().last().unwrap())
        .expect("an output matrix")
}

#[test]
#[ignore = "slow: make test-slow (fast_forward_tests and batch_consistency keep the property in make test)"]
fn fast_forward_changes_no_token_and_saves_steps() {
    let (plain, off) = run(0);
    let (ff, on) = run(16);
    let path = repo_root().join(MODEL);
    let file = GgufFile::open(&path).expect("open the 0.5B");
    let tok = Tokenizer::from_gguf(&file.content).expect("tokenizer");
    let f = GrammarFactory::from_tokenizer(&tok, runner_vocab(&file)).expect("grammar");
    for (((name, _), a), b) in requests(&tok, &f).iter().zip(&plain).zip(&ff) {
        let text = tok.decode(a, true).unwrap_or_default();
        println!("{name}: {} tokens: {text}", a.len());
        assert!(a.len() >= 10, "{name}: only {} tokens: {text:?}", a.len());
        assert_eq!(
            a,
            b,
            "{name}: tokens differ with fast-forward (first at {:?}); without: {text:?}",
            a.iter().zip(b).position(|(x, y)| x != y)
        );
    }
    let call = tok.decode(&plain[2], true).unwrap();
    assert!(
        call.contains("\"name\": \"get_current_weather\""),
        "not a call: {call}"
    );
    let (f_off, f_on) = (
        off.counters.forced[SloClass::Interactive],
        on.counters.forced[SloClass::Interactive],
    );
    println!(
        "steps {} -> {}; forced {f_on:?}; tokens {}",
        off.counters.steps,
        on.counters.steps,
        plain.iter().map(Vec::len).sum::<usize>()
    );
    assert_eq!(f_off.drafted_tokens, 0, "fast-forward ran while off");
    // The tokenizer's tokenization of the forced text alone is not always the one
    // the model draws in context: the rest of that run is rejected, so acceptance
    // is under 1 (63 of 97 at this commit; 61 of 103 with the trie's greedy one).
    assert!(
        f_on.accepted_tokens * 2 > f_on.drafted_tokens,
        "forced tokens were mostly rejected: {f_on:?}"
    );
    assert!(
        on.counters.steps * 10 < off.counters.steps * 8,
        "fast-forward saved under 20% of the steps: {} -> {} ({f_on:?})",
        off.counters.steps,
        on.counters.steps
    );
}
