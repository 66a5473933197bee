//! Mask time per token for the schema suite on the Qwen vocabulary (151,936
//! tokens): seeded walks over each schema's allowed tokens, each `fill_mask` timed;
//! then the whole constrained draw in the engine's `Sampler` (mask, then the draw
//! over the allowed tokens) against the unconstrained draw on a random row: greedy,
//! temperature 0.8, and temperature 0.8 with top-p 0.9.
//! Run: `make bench-grammar` (or `cargo bench -p sloserve-grammar --bench mask`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};

use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_engine::{Sampler, SamplingParams};
use sloserve_grammar::{
    tool_call_constraint, Constraint, GrammarMatcher, ToolChoice, ToolFunction,
};

/// Times each `fill_mask` of the matcher it wraps.
struct Timed(GrammarMatcher, Arc<Mutex<Vec<f64>>>, Arc<Mutex<Vec<f64>>>);

impl TokenConstraint for Timed {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        let t = Instant::now();
        let r = self.0.fill_mask(allowed);
        self.1.lock().unwrap().push(t.elapsed().as_secs_f64());
        r
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        let t = Instant::now();
        let r = self.0.commit(token);
        self.2.lock().unwrap().push(t.elapsed().as_secs_f64());
        r
    }
    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p) as usize] * 1e6
}

fn main() {
    let file = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".gguf"))
        .unwrap_or_else(|| common::MODELS[2].1.to_string());
    let t0 = Instant::now();
    let (tok, f) = common::factory(&file);
    eprintln!(
        "{file}: factory built in {:.2} s ({} tokens)",
        t0.elapsed().as_secs_f64(),
        f.vocab_size()
    );
    let eos = f.tok_trie().eos_tokens().to_vec();
    let mut all = Vec::new();
    let mut compile = Vec::new();
    println!(
        "{:<34} {:>6} {:>9} {:>9} {:>9}",
        "schema", "masks", "p50 us", "p99 us", "max us"
    );
    for (k, (name, schema)) in common::schemas().iter().enumerate() {
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        let t = Instant::now();
        let g = f.compile(&c).unwrap();
        compile.push(t.elapsed().as_secs_f64());
        let mut v = Vec::new();
        for w in 0..3u64 {
            let mut rng = StdRng::seed_from_u64(k as u64 * 10 + w);
            let mut m = g.start();
            let out = common::walk(&mut m, &tok, &eos, &mut rng, 8, 0.3, 2000);
            v.extend(out.mask_secs);
        }
        let n = v.len();
        let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
        println!(
            "{name:<34} {n:>6} {p50:>9.0} {p99:>9.0} {:>9.0}",
            v[n - 1] * 1e6
        );
        all.extend(v);
    }
    let n = all.len();
    println!(
        "ALL: {n} masks: p50 {:.0} us, p99 {:.0} us, max {:.0} us; compile p50 {:.1} ms max {:.1} ms",
        pct(&mut all, 0.5),
        pct(&mut all, 0.99),
        all[n - 1] * 1e6,
        pct(&mut compile, 0.5) / 1e3,
        compile.iter().cloned().fold(0.0, f64::max) * 1e3
    );

    // `tool_choice: auto` with strict tools: the mask over free text (the model's
    // own reply, before any `<tool_call>`), then over the call it makes.
    let tools: Vec<ToolFunction> = ["get_weather", "search", "add"]
        .iter()
        .zip(common::schemas())
        .map(|(n, (_, s))| ToolFunction {
            name: n.to_string(),
            parameters: Some(s),
        })
        .collect();
    let g = f
        .compile(&tool_call_constraint(&tools, &ToolChoice::Auto, true).unwrap())
        .unwrap();
    let reply = "Sure. The capital of France is Paris, a city of about two million people \
        on the Seine; its best-known landmark is the Eiffel Tower, built for the 1889 fair. \
        Let me check the weather there for you.\n<tool_call>\n";
    let words = f.vocab_size().div_ceil(32);
    let mut mask = vec![0u32; words];
    let (mut text_masks, mut call_masks) = (Vec::new(), Vec::new());
    for w in 0..5u64 {
        let mut m = g.start();
        for t in tok.encode(reply, false).unwrap() {
            let t0 = Instant::now();
            m.fill_mask(&mut mask).unwrap();
            text_masks.push(t0.elapsed().as_secs_f64());
            m.commit(t).unwrap();
        }
        let mut rng = StdRng::seed_from_u64(100 + w);
        call_masks.extend(common::walk(&mut m, &tok, &eos, &mut rng, 8, 0.3, 2000).mask_secs);
    }
    println!(
        "tool_choice auto (strict): free text {} masks p50 {:.0} us p99 {:.0} us; inside the call {} masks p50 {:.0} us p99 {:.0} us",
        text_masks.len(),
        pct(&mut text_masks, 0.5),
        pct(&mut text_masks, 0.99),
        call_masks.len(),
        pct(&mut call_masks, 0.5),
        pct(&mut call_masks, 0.99),
    );

    // The whole draw in the engine's sampler, constrained (31: a typical strict
    // schema) vs not, greedy and temperature 0.8, on random rows.
    let schema = common::schemas()
        .into_iter()
        .find(|(n, _)| n.starts_with("31"))
        .unwrap()
        .1;
    let g = f
        .compile(&Constraint::JsonSchema {
            schema,
            strict: true,
        })
        .unwrap();
    let vocab = f.vocab_size();
    let mut rng = StdRng::seed_from_u64(7);
    let rows: Vec<Vec<f32>> = (0..8)
        .map(|_| (0..vocab).map(|_| rng.random_range(-10.0..10.0)).collect())
        .collect();
    for (label, params) in [
        ("greedy", SamplingParams::greedy()),
        (
            "t=0.8",
            SamplingParams {
                temperature: 0.8,
                seed: Some(1),
                ..Default::default()
            },
        ),
        (
            "t=0.8 top_p=0.9",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                seed: Some(1),
                ..Default::default()
            },
        ),
    ] {
        let mut plain = Sampler::new(params.clone(), vocab);
        let mut tp = Vec::new();
        for i in 0..400 {
            let t = Instant::now();
            std::hint::black_box(plain.sample_lean(&rows[i % rows.len()]));
            tp.push(t.elapsed().as_secs_f64());
        }
        let mut tc = Vec::new();
        let masks = Arc::new(Mutex::new(Vec::new()));
        let commits = Arc::new(Mutex::new(Vec::new()));
        let mut done = 0;
        while tc.len() < 400 {
            let timed = Timed(g.start(), masks.clone(), commits.clone());
            let mut s = Sampler::new(params.clone(), vocab).with_constraint(Some(Box::new(timed)));
            for i in 0..2000 {
                let t = Instant::now();
                std::hint::black_box(s.sample_lean(&rows[i % rows.len()]));
                tc.push(t.elapsed().as_secs_f64());
                if s.constraint_end().is_some() {
                    done += 1;
                    break;
                }
            }
        }
        let mut mk = masks.lock().unwrap().clone();
        let mut cm = commits.lock().unwrap().clone();
        println!(
            "sampler {label} on random rows: unconstrained p50 {:.0} us p99 {:.0} us; constrained (schema 31, {done} docs, {} tokens) p50 {:.0} us p99 {:.0} us, of which the mask p50 {:.0} us p99 {:.0} us and the commit p50 {:.0} us p99 {:.0} us",
            pct(&mut tp, 0.5),
            pct(&mut tp, 0.99),
            tc.len(),
            pct(&mut tc, 0.5),
            pct(&mut tc, 0.99),
            pct(&mut mk, 0.5),
            pct(&mut mk, 0.99),
            pct(&mut cm, 0.5),
            pct(&mut cm, 0.99)
        );
    }
}
