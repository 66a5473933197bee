//! Model-core benchmark (`cargo bench -p sloserve-model --bench forward [-- --quick]`):
//! prefill tok/s of a 512-token prompt and decode tok/s at batch 1, 8 and 32 for the
//! default model, driving `LlamaRunner` directly with `Batch`es (no engine).
//!
//! Decode at batch B: B sequences, each prefilled once with 64 tokens over its own
//! block table (untimed), then runs of 32 timed steps in which every sequence decodes
//! one token (context 64 -> 96; each run rewrites the same positions). Each case reports the median of several timed runs after one
//! untimed warm-up run. Fast precision is the main subject; exact precision is
//! measured for reference with fewer runs. Prints a table and writes
//! `target/bench/forward.json`.
//!
//! Flags: `--quick` (fewer runs), `--fast-only`, `--only CASE` (e.g. `decode_b32`, for
//! profiling one case; `decode_bN` for any batch size N), `--model PATH` (another GGUF file, e.g.
//! `models/gemma-3-270m-q4_k_m.gguf`; results go to `forward-<file stem>.json`),
//! `--quantize q8_0|q4_0|q4_1|f16` (re-quantize the weights at load; the JSON name
//! gets `-<type>`), `--decode CONTEXT:STEPS` (another decode shape, e.g. `128:64`,
//! llama-batched-bench's `-npp 128 -ntg 64`), `--kv-cache-type f16,q8_0` (KV cache
//! types compared in one sitting: fast precision, decode only, one runner per type
//! prefilled once, their timed runs interleaved; the JSON name gets `-kv`).

use std::path::Path;
use std::time::Instant;

use sloserve_engine::{Batch, KvCacheType, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions, WeightType};

#[path = "common.rs"]
mod common;
use common::{load_avg, median, model_path, repo_root, target_dir};

const PREFILL_LEN: usize = 512;
/// The decode cases' default shape (`--decode CONTEXT:STEPS` sets another).
const DECODE: Decode = Decode {
    context: 64,
    steps: 32,
};
const DECODE_BATCHES: [usize; 3] = [1, 8, 32];
const BLOCK: usize = 16;

/// Deterministic token ids spread over the vocabulary (speed does not depend on them).
fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| 100 + ((i * 7919 + seed * 104_729) % 20_000) as u32)
        .collect()
}

struct Case {
    precision: &'static str,
    name: String,
    batch: usize,
    tokens_per_run: usize,
    tok_s: Vec<f64>,
}

impl Case {
    fn json(&self) -> serde_json::Value {
        let min = self.tok_s.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = self.tok_s.iter().cloned().fold(0.0, f64::max);
        serde_json::json!({
            "precision": self.precision,
            "case": self.name,
            "batch": self.batch,
            "tokens_per_run": self.tokens_per_run,
            "runs": self.tok_s.len(),
            "median_tok_s": median(&self.tok_s),
            "min_tok_s": min,
            "max_tok_s": max,
            "tok_s": self.tok_s,
        })
    }
}

/// One prefill of `PREFILL_LEN` tokens in one piece; returns tok/s.
fn prefill_once(r: &mut LlamaRunner, batch: &mut Batch, out: &mut Logits) -> f64 {
    let p = tokens(1, PREFILL_LEN);
    let table: Vec<u32> = (0..PREFILL_LEN.div_ceil(BLOCK) as u32).collect();
    batch.clear();
    batch.push(&p, 0, &table, true);
    let t0 = Instant::now();
    r.execute(batch, out).expect("prefill");
    PREFILL_LEN as f64 / t0.elapsed().as_secs_f64()
}

/// A decode case's shape: each sequence is prefilled with `context` tokens, then
/// decodes `steps` tokens per timed run.
#[derive(Clone, Copy)]
struct Decode {
    context: usize,
    steps: usize,
}

impl Decode {
    /// `CONTEXT:STEPS`, both at least 1.
    fn parse(s: &str) -> Option<Decode> {
        let (c, n) = s.split_once(':')?;
        let d = Decode {
            context: c.parse().ok()?,
            steps: n.parse().ok()?,
        };
        (d.context > 0 && d.steps > 0).then_some(d)
    }
}

/// Block tables of B sequences, each long enough for the prefill and the decode steps.
fn decode_tables(b: usize, d: Decode) -> Vec<Vec<u32>> {
    let per_seq = (d.context + d.steps).div_ceil(BLOCK);
    (0..b)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect()
}

/// Prefills B sequences with `d.context` tokens each (untimed setup).
fn decode_setup(
    r: &mut LlamaRunner,
    tables: &[Vec<u32>],
    d: Decode,
    batch: &mut Batch,
    out: &mut Logits,
) {
    // In groups, so that no single batch is huge.
    for (g, group) in tables.chunks(8).enumerate() {
        batch.clear();
        for (k, t) in group.iter().enumerate() {
            let p = tokens(g * 8 + k + 2, d.context);
            batch.push(&p, 0, &t[..d.context.div_ceil(BLOCK)], true);
        }
        r.execute(batch, out).expect("decode prefill");
    }
}

/// The first index of the row's maximum: a lane-wise max (which vectorises), then
/// its first position.
fn argmax(row: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let m = lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    row.iter().position(|&x| x == m).unwrap_or(0) as u32
}

/// `d.steps` timed decode steps of B rows (positions `d.context..`, so
/// every run overwrites the same KV slots over the same prefilled context); returns
/// tok/s.
#[inline(never)] // a symbol for callgrind --toggle-collect (docs/profile-decode.md)
fn decode_once(
    r: &mut LlamaRunner,
    tables: &[Vec<u32>],
    d: Decode,
    batch: &mut Batch,
    out: &mut Logits,
) -> f64 {
    let b = tables.len();
    let mut next: Vec<u32> = (0..b).map(|s| 200 + s as u32).collect();
    let t0 = Instant::now();
    for step in 0..d.steps {
        let pos = d.context + step;
        batch.clear();
        for (s, table) in tables.iter().enumerate() {
            batch.push(&[next[s]], pos, &table[..(pos + 1).div_ceil(BLOCK)], true);
        }
        r.execute(batch, out).expect("decode step");
        // Feed back the argmax, like greedy decoding (vectorised, as the engine's
        // sampler does it: a scalar scan of 32 x 49,152 logits was 2% of a step).
        for (s, n) in next.iter_mut().enumerate() {
            *n = argmax(out.row(s));
        }
    }
    (b * d.steps) as f64 / t0.elapsed().as_secs_f64()
}

fn run_precision(
    precision: Precision,
    label: &'static str,
    runs: usize,
    only: Option<&str>,
    path: &Path,
    quantize: Option<WeightType>,
    d: Decode,
) -> Vec<Case> {
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    let opts = RunnerOptions {
        precision,
        block_size: BLOCK,
        kv_cache_memory: Some(256 << 20),
        max_model_len: None,
        quantize,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut r =
        LlamaRunner::load(path, &opts).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    eprintln!(
        "[{label}] loaded {} in {:.1?}",
        path.display(),
        t0.elapsed()
    );
    let (mut batch, mut out) = (Batch::default(), Logits::default());
    let mut cases = Vec::new();

    if wanted(&format!("prefill_{PREFILL_LEN}")) {
        eprintln!("[{label}] prefill {PREFILL_LEN}: 1 warm-up + {runs} runs");
        prefill_once(&mut r, &mut batch, &mut out);
        let tok_s = (0..runs)
            .map(|_| prefill_once(&mut r, &mut batch, &mut out))
            .collect();
        cases.push(Case {
            precision: label,
            name: format!("prefill_{PREFILL_LEN}"),
            batch: 1,
            tokens_per_run: PREFILL_LEN,
            tok_s,
        });
    }
    // `--only decode_bN` measures any batch size N.
    let batches = match only.and_then(|o| o.strip_prefix("decode_b")?.parse().ok()) {
        Some(b) => vec![b],
        None => DECODE_BATCHES.to_vec(),
    };
    for b in batches {
        if !wanted(&format!("decode_b{b}")) {
            continue;
        }
        eprintln!(
            "[{label}] decode batch {b}: 1 warm-up + {runs} runs of {} steps",
            d.steps
        );
        let tables = decode_tables(b, d);
        decode_setup(&mut r, &tables, d, &mut batch, &mut out);
        decode_once(&mut r, &tables, d, &mut batch, &mut out);
        let tok_s = (0..runs)
            .map(|_| decode_once(&mut r, &tables, d, &mut batch, &mut out))
            .collect();
        cases.push(Case {
            precision: label,
            name: format!("decode_b{b}"),
            batch: b,
            tokens_per_run: b * d.steps,
            tok_s,
        });
    }
    cases
}

/// Decode at batch `b` for each KV cache type, the types' timed runs interleaved
/// (run 1 of each, then run 2 of each, ...) so that a change in the machine's load
/// falls on all of them alike.
fn run_kv_types(types: &[KvCacheType], runs: usize, b: usize, path: &Path, d: Decode) -> Vec<Case> {
    let (mut batch, mut out) = (Batch::default(), Logits::default());
    let tables = decode_tables(b, d);
    let mut runners: Vec<LlamaRunner> = types
        .iter()
        .map(|&kv| {
            let opts = RunnerOptions {
                precision: Precision::Fast,
                block_size: BLOCK,
                kv_cache_memory: Some((b * (d.context + d.steps + BLOCK) * 65_536).max(256 << 20)),
                kv_cache_type: kv,
                ..Default::default()
            };
            let mut r = LlamaRunner::load(path, &opts)
                .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
            let t0 = Instant::now();
            decode_setup(&mut r, &tables, d, &mut batch, &mut out);
            eprintln!(
                "[{}] {} bytes per token; prefilled {b} x {} tokens in {:.1?}",
                kv.name(),
                r.info().kv_bytes_per_token,
                d.context,
                t0.elapsed()
            );
            decode_once(&mut r, &tables, d, &mut batch, &mut out);
            r
        })
        .collect();
    let mut tok_s = vec![Vec::new(); types.len()];
    for run in 0..runs {
        for (i, r) in runners.iter_mut().enumerate() {
            tok_s[i].push(decode_once(r, &tables, d, &mut batch, &mut out));
            eprintln!("run {run} {}: {:.2} tok/s", types[i].name(), tok_s[i][run]);
        }
    }
    types
        .iter()
        .zip(tok_s)
        .map(|(kv, tok_s)| Case {
            precision: kv.name(),
            name: format!("decode_b{b}"),
            batch: b,
            tokens_per_run: b * d.steps,
            tok_s,
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let fast_only = args.iter().any(|a| a == "--fast-only");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let model = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1));
    let quantize: Option<WeightType> = args.iter().position(|a| a == "--quantize").map(|i| {
        match args.get(i + 1).map(|t| t.parse()) {
            Some(Ok(t)) => t,
            Some(Err(e)) => panic!("--quantize: {e}"),
            None => panic!("--quantize needs a type"),
        }
    });
    let decode = args
        .iter()
        .position(|a| a == "--decode")
        .map_or(DECODE, |i| {
            args.get(i + 1)
                .and_then(|s| Decode::parse(s))
                .unwrap_or_else(|| panic!("--decode takes CONTEXT:STEPS, e.g. 128:64"))
        });
    // A relative path may be from the repository root (cargo runs benches in the crate).
    let path = model.map_or_else(model_path, |m| {
        let p = std::path::PathBuf::from(m);
        if p.is_relative() && !p.exists() {
            repo_root().join(p)
        } else {
            p
        }
    });
    let stem = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let (fast_runs, exact_runs) = if quick { (2, 1) } else { (7, 3) };
    let threads = rayon::current_num_threads();
    let load_before = load_avg();
    eprintln!(
        "forward bench: {threads} rayon threads, {} CPUs, load {load_before}{}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if quick { ", --quick" } else { "" }
    );
    let kv_types: Option<Vec<KvCacheType>> =
        args.iter().position(|a| a == "--kv-cache-type").map(|i| {
            let list = args.get(i + 1).expect("--kv-cache-type needs types");
            list.split(',')
                .map(|t| t.parse().unwrap_or_else(|e| panic!("--kv-cache-type: {e}")))
                .collect()
        });
    let mut cases = match &kv_types {
        Some(types) => {
            let b = only
                .and_then(|o| o.strip_prefix("decode_b")?.parse().ok())
                .unwrap_or(1);
            run_kv_types(types, fast_runs, b, &path, decode)
        }
        None => Vec::new(),
    };
    if kv_types.is_none() {
        cases = run_precision(
            Precision::Fast,
            "fast",
            fast_runs,
            only,
            &path,
            quantize,
            decode,
        );
    }
    if !fast_only && kv_types.is_none() {
        cases.extend(run_precision(
            Precision::Exact,
            "exact",
            exact_runs,
            only,
            &path,
            quantize,
            decode,
        ));
    }
    let load_after = load_avg();

    println!();
    println!(
        "forward: {stem}{}, {threads} threads, block {BLOCK}; load {load_before} -> {load_after}",
        quantize.map_or(String::new(), |t| format!(" --quantize {t}"))
    );
    println!(
        "decode = {} steps after a {}-token prefill per sequence; median of N timed runs",
        decode.steps, decode.context
    );
    println!(
        "{:<6} {:<12} {:>5} {:>12} {:>12} {:>12} {:>4}",
        "prec", "case", "batch", "median tok/s", "min", "max", "N"
    );
    for c in &cases {
        let min = c.tok_s.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = c.tok_s.iter().cloned().fold(0.0, f64::max);
        println!(
            "{:<6} {:<12} {:>5} {:>12.1} {:>12.1} {:>12.1} {:>4}",
            c.precision,
            c.name,
            c.batch,
            median(&c.tok_s),
            min,
            max,
            c.tok_s.len()
        );
    }

    let json = serde_json::json!({
        "bench": "forward",
        "model": path.display().to_string(),
        "quantize": quantize.map(|t| t.name()),
        "threads": threads,
        "quick": quick,
        "block_size": BLOCK,
        "prefill_len": PREFILL_LEN,
        "decode_context": decode.context,
        "decode_steps": decode.steps,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "results": cases.iter().map(Case::json).collect::<Vec<_>>(),
    });
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("create target/bench");
    let mut name = "forward".to_string();
    if model.is_some() {
        name += &format!("-{stem}");
    }
    if let Some(t) = quantize {
        name += &format!("-{t}");
    }
    if kv_types.is_some() {
        name += &format!("-kv-{}", decode.context);
    }
    if quick {
        name += "-quick";
    }
    name += ".json";
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("write json");
    println!("wrote {}", path.display());
}
