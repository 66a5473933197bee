//! Per-token benchmark (`cargo bench -p sloserve-model --bench token [-- --quick]`):
//! `forward + sample` of one decoding sequence (batch 1) on the default model, with
//! the sampler timed apart for each sampling setting, then the sampler alone on
//! synthetic logits rows of 49,152 (SmolLM2) and 151,936 (Qwen) tokens.
//!
//! Each case is measured for three samplers in one binary, runs interleaved:
//! `before` (the sampler as of dc9079b, frozen in `token_baseline/`: a full
//! log-softmax per token), `lean` (`Sampler::sample_lean`, the engine's call now)
//! and, for the synthetic rows, `full` (`Sampler::sample`: the new passes, the
//! logprob always computed).
//!
//! Model part: a 64-token prompt, then runs of 32 decode steps per setting, each
//! step timing `LlamaRunner::execute` and the sampler call on its row and feeding
//! the sampled token back. Synthetic part: 300 calls per run on a fixed row. Every
//! figure is the median over the runs of the per-run mean, after one untimed
//! warm-up run. Prints a table and writes `target/bench/token.json`.
//!
//! Flags: `--quick` (fewer runs), `--model PATH` (another GGUF file),
//! `--synthetic-only` (no model).

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sloserve_engine::{Batch, Logits, ModelRunner, Sampler, SamplingParams};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

#[path = "common.rs"]
mod common;
use common::{load_avg, median, model_path, target_dir};
#[allow(dead_code)]
#[path = "token_baseline/mod.rs"]
mod baseline;

const BLOCK: usize = 16;
const CONTEXT: usize = 64;
const STEPS: usize = 32;
const SYNTHETIC_CALLS: usize = 300;
const VOCABS: [usize; 2] = [49_152, 151_936];

/// One of the samplers compared, with its state for one setting.
enum Subject {
    Before(baseline::Sampler),
    Lean(Sampler),
    Full(Sampler),
}

impl Subject {
    fn new(variant: &str, p: &SamplingParams, vocab: usize) -> Subject {
        match variant {
            "before" => Subject::Before(baseline::Sampler::new(
                baseline::SamplingParams {
                    temperature: p.temperature,
                    top_k: p.top_k,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    seed: p.seed,
                    presence_penalty: p.presence_penalty,
                    frequency_penalty: p.frequency_penalty,
                    logprobs: p.logprobs,
                },
                vocab,
            )),
            "lean" => Subject::Lean(Sampler::new(p.clone(), vocab)),
            _ => Subject::Full(Sampler::new(p.clone(), vocab)),
        }
    }

    /// The sampled token id (the rest of the result is built and dropped).
    #[inline(never)]
    fn sample(&mut self, row: &[f32]) -> u32 {
        match self {
            Subject::Before(s) => std::hint::black_box(s.sample(row)).id,
            Subject::Lean(s) => std::hint::black_box(s.sample_lean(row)).id,
            Subject::Full(s) => std::hint::black_box(s.sample(row)).id,
        }
    }
}

/// The sampling settings measured: (name, parameters).
fn settings() -> Vec<(&'static str, SamplingParams)> {
    let warm = |f: fn(&mut SamplingParams)| {
        let mut p = SamplingParams {
            temperature: 0.8,
            seed: Some(1),
            ..Default::default()
        };
        f(&mut p);
        p
    };
    vec![
        ("greedy", SamplingParams::greedy()),
        ("temperature_1", {
            let mut p = warm(|_| {});
            p.temperature = 1.0;
            p
        }),
        ("temperature_0.8", warm(|_| {})),
        ("top_k_40", warm(|p| p.top_k = 40)),
        ("top_p_0.9", warm(|p| p.top_p = 0.9)),
        (
            "top_k_50_top_p_0.95_min_p_0.05",
            warm(|p| {
                p.top_k = 50;
                p.top_p = 0.95;
                p.min_p = 0.05;
            }),
        ),
        ("logprobs_5", warm(|p| p.logprobs = Some(5))),
        (
            "greedy_logprobs_0",
            SamplingParams {
                logprobs: Some(0),
                ..SamplingParams::greedy()
            },
        ),
    ]
}

/// Microseconds, per-run means.
struct Row {
    part: String,
    setting: &'static str,
    variant: &'static str,
    forward_us: Vec<f64>,
    sample_us: Vec<f64>,
}

impl Row {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "part": self.part,
            "setting": self.setting,
            "variant": self.variant,
            "median_forward_us": (!self.forward_us.is_empty()).then(|| median(&self.forward_us)),
            "median_sample_us": median(&self.sample_us),
            "forward_us": self.forward_us,
            "sample_us": self.sample_us,
        })
    }
}

/// One run of `STEPS` decode steps from position `CONTEXT`; returns the mean
/// forward and sample microseconds per token.
fn decode_run(
    r: &mut LlamaRunner,
    s: &mut Subject,
    table: &[u32],
    batch: &mut Batch,
    out: &mut Logits,
) -> (f64, f64) {
    let (mut fwd, mut smp) = (0.0f64, 0.0f64);
    let mut next = 200u32;
    for step in 0..STEPS {
        let pos = CONTEXT + step;
        batch.clear();
        batch.push(&[next], pos, &table[..(pos + 1).div_ceil(BLOCK)], true);
        let t0 = Instant::now();
        r.execute(batch, out).expect("decode step");
        let t1 = Instant::now();
        next = s.sample(out.row(0));
        let t2 = Instant::now();
        fwd += (t1 - t0).as_secs_f64();
        smp += (t2 - t1).as_secs_f64();
    }
    (fwd * 1e6 / STEPS as f64, smp * 1e6 / STEPS as f64)
}

fn model_part(path: &std::path::Path, runs: usize) -> Vec<Row> {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        block_size: BLOCK,
        kv_cache_memory: Some(64 << 20),
        max_model_len: None,
        quantize: None,
        ..Default::default()
    };
    let mut r =
        LlamaRunner::load(path, &opts).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let vocab = r.info().vocab_size;
    let name = path.file_stem().unwrap_or_default().to_string_lossy();
    eprintln!(
        "[model] {} (vocab {vocab}): {runs} runs x {STEPS} steps per setting",
        path.display()
    );
    let (mut batch, mut out) = (Batch::default(), Logits::default());
    let table: Vec<u32> = (0..(CONTEXT + STEPS).div_ceil(BLOCK) as u32).collect();
    let prompt: Vec<u32> = (0..CONTEXT as u32)
        .map(|i| 100 + (i * 7919) % 20_000)
        .collect();
    batch.push(&prompt, 0, &table[..CONTEXT.div_ceil(BLOCK)], true);
    r.execute(&batch, &mut out).expect("prefill");
    let mut rows = Vec::new();
    for (setting, p) in settings() {
        let variants = ["before", "lean"];
        let mut subjects: Vec<Subject> = variants
            .iter()
            .map(|v| Subject::new(v, &p, vocab))
            .collect();
        let mut times = vec![(Vec::new(), Vec::new()); variants.len()];
        for run in 0..=runs {
            for (s, t) in subjects.iter_mut().zip(&mut times) {
                let (f, x) = decode_run(&mut r, s, &table, &mut batch, &mut out);
                if run > 0 {
                    t.0.push(f);
                    t.1.push(x);
                }
            }
        }
        for (variant, (forward_us, sample_us)) in variants.into_iter().zip(times) {
            rows.push(Row {
                part: format!("model:{name}"),
                setting,
                variant,
                forward_us,
                sample_us,
            });
        }
    }
    rows
}

/// Logit-like values: a normal-ish bulk (sum of uniforms, sd ~2.5) and a few peaks.
fn synthetic_row(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut row: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.random_range(-2.2f32..2.2)).sum())
        .collect();
    for _ in 0..20 {
        let i = rng.random_range(0..n);
        row[i] = rng.random_range(10.0f32..16.0);
    }
    row
}

fn synthetic_part(runs: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for n in VOCABS {
        eprintln!("[synthetic] vocab {n}: {runs} runs x {SYNTHETIC_CALLS} calls per setting");
        let row = synthetic_row(n, n as u64);
        for (setting, p) in settings() {
            let variants = ["before", "lean", "full"];
            let mut subjects: Vec<Subject> =
                variants.iter().map(|v| Subject::new(v, &p, n)).collect();
            let mut times = vec![Vec::new(); variants.len()];
            for run in 0..=runs {
                for (s, t) in subjects.iter_mut().zip(&mut times) {
                    let t0 = Instant::now();
                    for _ in 0..SYNTHETIC_CALLS {
                        s.sample(std::hint::black_box(&row));
                    }
                    if run > 0 {
                        t.push(t0.elapsed().as_secs_f64() * 1e6 / SYNTHETIC_CALLS as f64);
                    }
                }
            }
            for (variant, sample_us) in variants.into_iter().zip(times) {
                rows.push(Row {
                    part: format!("synthetic:{n}"),
                    setting,
                    variant,
                    forward_us: Vec::new(),
                    sample_us,
                });
            }
        }
    }
    rows
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let runs = if quick { 3 } else { 7 };
    let path = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(model_path);
    let load_before = load_avg();
    let mut rows = Vec::new();
    if !args.iter().any(|a| a == "--synthetic-only") {
        rows.extend(model_part(&path, runs));
    }
    rows.extend(synthetic_part(runs));
    println!(
        "{:<36} {:<32} {:<7} {:>11} {:>10} {:>14}",
        "part", "setting", "variant", "forward_us", "sample_us", "fwd+sample_us"
    );
    for r in &rows {
        let f = (!r.forward_us.is_empty()).then(|| median(&r.forward_us));
        let s = median(&r.sample_us);
        println!(
            "{:<36} {:<32} {:<7} {:>11} {:>10.1} {:>14}",
            r.part,
            r.setting,
            r.variant,
            f.map_or("-".into(), |f| format!("{f:.1}")),
            s,
            f.map_or("-".into(), |f| format!("{:.1}", f + s)),
        );
    }
    let json = serde_json::json!({
        "bench": "token",
        "runs": runs,
        "load_avg_before": load_before,
        "load_avg_after": load_avg(),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    let dir = target_dir().join("bench");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join("token.json");
    match std::fs::write(
        &file,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => eprintln!("wrote {}", file.display()),
        Err(e) => eprintln!("could not write {}: {e}", file.display()),
    }
}
