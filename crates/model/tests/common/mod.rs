//! Shared helpers for the model tests: paths to the default model and to the llama.cpp
//! reference records in `tests/data/`, and a plain greedy loop straight on a runner.
#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Content;
use serde::Deserialize;
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions, DEFAULT_MODEL_PATH};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model_path() -> PathBuf {
    let p = repo_root().join(DEFAULT_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model` first",
        p.display()
    );
    p
}

/// The default model's GGUF metadata (no tensors loaded).
pub fn load_content() -> Content {
    let mut file = std::fs::File::open(model_path()).expect("open the default model");
    Content::read(&mut file).expect("model file is valid GGUF")
}

/// A reference file in this crate's `tests/data/` (see its README.md).
pub fn reference_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The JSON lines of a reference file; panics if it cannot be read.
pub fn reference_json(name: &str) -> Vec<serde_json::Value> {
    let path = reference_path(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read reference file {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line is JSON"))
        .collect()
}

#[derive(Debug, Deserialize)]
pub struct TopLogprob {
    pub id: u32,
    pub logprob: f32,
}

#[derive(Debug, Deserialize)]
pub struct GreedyRecord {
    pub id: String,
    pub kind: String,
    #[serde(default)]
    pub rendered_prompt: String,
    pub prompt_token_ids: Vec<u32>,
    pub greedy_token_ids: Vec<u32>,
    pub top5_logprobs_per_step: Vec<Vec<TopLogprob>>,
}

pub fn read_records(name: &str) -> Vec<GreedyRecord> {
    reference_json(name)
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("a greedy record"))
        .collect()
}

/// Which share of a reference file's records a test checks: `make test` checks every
/// other record (from the first), `make test-slow` the rest, so that the two suites
/// together check every record while `make test` stays within CI's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    MakeTest,
    Slow,
}

impl Share {
    /// This share's records, in order.
    pub fn of<T>(self, records: Vec<T>) -> Vec<T> {
        let keep = usize::from(self == Share::Slow);
        records
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == keep)
            .map(|(_, r)| r)
            .collect()
    }
}

pub fn load_runner(precision: Precision) -> LlamaRunner {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(256 << 20),
        ..Default::default()
    };
    LlamaRunner::load(model_path(), &opts).expect("load the default model")
}

pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = row
        .iter()
        .map(|x| ((x - max) as f64).exp())
        .sum::<f64>()
        .ln() as f32
        + max;
    row.iter().map(|x| x - lse).collect()
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of one sequence (blocks 0..), prefilling in chunks of `chunk`
/// tokens (0: one piece), stopping after id 2 (the default model's `<|im_end|>`).
/// Returns the generated ids and each step's logits row.
pub fn greedy(
    runner: &mut LlamaRunner,
    prompt: &[u32],
    steps: usize,
    chunk: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_until(runner, prompt, steps, chunk, &[2])
}

/// `greedy`, stopping after any id in `stops` (kept, as llama.cpp's records keep it).
pub fn greedy_until(
    runner: &mut LlamaRunner,
    prompt: &[u32],
    steps: usize,
    chunk: usize,
    stops: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let bs = runner.info().block_size;
    let table: Vec<u32> = (0..((prompt.len() + steps).div_ceil(bs)) as u32).collect();
    let mut batch = Batch::default();
    let mut logits = Logits::default();
    let chunk = if chunk == 0 { prompt.len() } else { chunk };
    let mut done = 0;
    while done < prompt.len() {
        let n = chunk.min(prompt.len() - done);
        batch.clear();
        let end = done + n;
        batch.push(
            &prompt[done..end],
            done,
            &table[..end.div_ceil(bs)],
            end == prompt.len(),
        );
        runner.execute(&batch, &mut logits).unwrap();
        done = end;
    }
    let (mut out, mut rows) = (Vec::new(), Vec::new());
    for (step, ctx) in (0..steps).zip(prompt.len()..) {
        let row = logits.row(0).to_vec();
        let tok = argmax(&row);
        out.push(tok);
        rows.push(row);
        if step + 1 == steps || stops.contains(&tok) {
            break;
        }
        batch.clear();
        batch.push(&[tok], ctx, &table[..(ctx + 1).div_ceil(bs)], true);
        runner.execute(&batch, &mut logits).unwrap();
    }
    (out, rows)
}

/// Largest |ours - reference| over the reference's top-5 logprobs of one step.
pub fn top5_error(row: &[f32], reference: &[TopLogprob]) -> f32 {
    let lp = log_softmax(row);
    reference
        .iter()
        .map(|t| (lp[t.id as usize] - t.logprob).abs())
        .fold(0.0, f32::max)
}

/// The second test model (Gemma 3 270M Q4_K_M), relative to the repository root.
pub const GEMMA3_MODEL_PATH: &str = "models/gemma-3-270m-q4_k_m.gguf";

pub fn gemma3_path() -> PathBuf {
    let p = repo_root().join(GEMMA3_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model-gemma3` (scripts/fetch-model.sh gemma3-270m) first",
        p.display()
    );
    p
}

pub fn load_gemma3(precision: Precision) -> LlamaRunner {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(128 << 20),
        max_model_len: Some(4096),
        ..Default::default()
    };
    LlamaRunner::load(gemma3_path(), &opts).expect("load Gemma 3 270M")
}

/// The family test model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, relative to the repository root.
pub const QWEN05_MODEL_PATH: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

pub fn qwen05_path() -> PathBuf {
    let p = repo_root().join(QWEN05_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model-qwen0.5b` (scripts/fetch-model.sh qwen0.5b) first",
        p.display()
    );
    p
}

pub fn load_qwen05(precision: Precision) -> LlamaRunner {
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(96 << 20),
        max_model_len: Some(4096),
        ..Default::default()
    };
    LlamaRunner::load(qwen05_path(), &opts).expect("load Qwen2.5-Coder 0.5B")
}

/// A `/proc/self/status` field in kB (`VmRSS:`, `VmHWM:`), for the memory tests.
pub fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number of kB")
}

/// One load of the 0.5B measured from `/proc/self/status` (the memory tests: one
/// per test binary, so the process measures that load only).
pub struct MeasuredLoad {
    pub runner: LlamaRunner,
    /// The file's bytes.
    pub file: f64,
    /// Resident bytes after load, and the peak during it.
    pub rss: f64,
    pub peak: f64,
    /// Issue #29's bound: 1.15 x the file + the KV cache asked for + 300 MB.
    pub bound: f64,
}

pub fn load_qwen05_measured(precision: Precision, kv: usize) -> MeasuredLoad {
    let path = qwen05_path();
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let opts = RunnerOptions {
        precision,
        kv_cache_memory: Some(kv),
        ..Default::default()
    };
    let before = status_kb("VmRSS:") as f64 * 1024.0;
    let runner = LlamaRunner::load(&path, &opts).expect("load the 0.5B");
    let m = MeasuredLoad {
        file,
        rss: status_kb("VmRSS:") as f64 * 1024.0,
        peak: status_kb("VmHWM:") as f64 * 1024.0,
        bound: 1.15 * file + kv as f64 + 300e6,
        runner,
    };
    let held = m.runner.model().held_bytes();
    let mb = |b: f64| b / 1e6;
    println!(
        "{precision:?}: file {:.0} MB; held {held:?} = {:.0} MB; RSS before {:.0}, after {:.0}, peak {:.0} MB; bound {:.0} MB",
        mb(file),
        mb(held.total() as f64),
        mb(before),
        mb(m.rss),
        mb(m.peak),
        mb(m.bound)
    );
    m
}

impl MeasuredLoad {
    /// Resident memory after load and its peak during load within the bound.
    pub fn assert_within_bound(&self) {
        let mb = |b: f64| b / 1e6;
        assert!(
            self.rss <= self.bound,
            "resident {:.0} MB > {:.0} MB",
            mb(self.rss),
            mb(self.bound)
        );
        assert!(
            self.peak <= self.bound,
            "peak {:.0} MB > {:.0} MB",
            mb(self.peak),
            mb(self.bound)
        );
    }
}
