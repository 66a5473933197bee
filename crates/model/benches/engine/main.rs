//! Engine benchmark, in process (`cargo bench -p sloserve-model --bench engine
//! [-- --quick]`): the default model in fast precision behind `Engine`, no HTTP.
//!
//! (a) throughput: N requests x 512 prompt tokens x 128 output tokens submitted at
//!     once (`batch` profile): total and output tok/s.
//! (b) prefix cache: one warm request, then 32 requests sharing a 400-token prefix
//!     plus 40 unique tokens (16 output tokens) submitted at once (`interactive`
//!     profile): TTFT p50/p95 with `enable_prefix_cache` on and off.
//! (c) SLO classes: (a)'s workload as class `batch`, plus an interactive stream
//!     (100-token prompts, 16 output tokens, one every `interval`, at most 32)
//!     arriving while it runs (`mixed` profile): interactive TTFT p50/p95 with SLO
//!     classes on and with plain FCFS (`slo_classes = false`). `interval` is 1 s, or
//!     longer where the interactive stream would otherwise take more than a quarter
//!     of (a)'s measured token rate (on a slow shared CPU an unbounded interactive
//!     queue would measure nothing but its own growth).
//!
//! (d) decode as `llama-batched-bench -npp 128 -ntg 64 -npl 32` measures it: 32
//!     requests x 128 prompt x 64 output submitted at once (`batch` profile: the
//!     whole prefill fits one step); generated tok/s = tokens after the first /
//!     time from the first token to the last (llama.cpp's S_TG).
//!
//! Full: (a) 64 requests, (b) 32. `--quick`: (a) and (c) 8 requests x 512 x 32,
//! (b) 8 requests x 8 output tokens, at most 4 interactive arrivals.
//!
//! Prompts are real-ish English (words drawn by a seeded generator) tokenized with
//! the model's tokenizer; every prompt starts with its own header so that only the
//! prefixes meant to be shared are. EOS is ignored so output lengths are fixed.
//! Prints a table and writes `target/bench/engine.json`.
//!
//! Flags: `--quick` (smaller counts, for a sanity check), `--only a|b|c|d` (any
//! subset, e.g. `--only ab`), `--batch-aging-ms N` (overrides the `mixed` profile's
//! `batch_aging_ms` in (c)), `--interval-ms N` (fixes (c)'s interactive
//! inter-arrival time), `--skip-fcfs` (only (c)'s SLO-classes half).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sloserve_engine::{Completion, EngineConfig, Profile, RequestStream, SloClass};
use sloserve_model::gguf::GgufFile;
use sloserve_model::tokenizer::Tokenizer;

mod harness;
mod prompts;
use harness::*;
use prompts::Prompts;

// ---------------------------------------------------------------------------------
// Phases

struct Sizes {
    a_requests: usize,
    a_prompt: usize,
    a_output: usize,
    b_requests: usize,
    b_prefix: usize,
    b_unique: usize,
    b_output: usize,
    c_prompt: usize,
    c_output: usize,
    /// Shortest gap between interactive arrivals; stretched so that the interactive
    /// stream stays a modest share of what the engine can serve (see `main`).
    c_interval: Duration,
    c_max_interactive: usize,
    /// `--batch-aging-ms N`: overrides the `mixed` profile's `batch_aging_ms` in (c).
    c_batch_aging_ms: Option<u64>,
}

/// (a) everything at once on the `batch` profile.
fn phase_a(p: &Prompts, z: &Sizes) -> serde_json::Value {
    let cfg = Profile::load("batch").unwrap();
    eprintln!(
        "[a] throughput: {} requests x {} prompt x {} output tokens, profile batch (load {})",
        z.a_requests,
        z.a_prompt,
        z.a_output,
        load_avg()
    );
    let prompts: Vec<Vec<u32>> = (0..z.a_requests)
        .map(|i| p.unique(&format!("Batch job {i}"), 1000 + i as u64, z.a_prompt))
        .collect();
    let engine = start(cfg.clone());
    let t0 = Instant::now();
    let streams = submit_all(&engine, prompts, z.a_output, SloClass::Batch);
    let done = collect_all("a", &engine, streams, t0);
    let wall = t0.elapsed().as_secs_f64();
    done.iter().for_each(|c| check(c, z.a_output));
    let st = engine.stats();
    stop(engine);
    let prompt_tokens = z.a_requests * z.a_prompt;
    let output_tokens = z.a_requests * z.a_output;
    let t = ttfts(&done);
    let r = json!({
        "profile": "batch",
        "requests": z.a_requests,
        "prompt_tokens_each": z.a_prompt,
        "output_tokens_each": z.a_output,
        "wall_s": wall,
        "total_tok_s": (prompt_tokens + output_tokens) as f64 / wall,
        "output_tok_s": output_tokens as f64 / wall,
        "ttft_p50_ms": pct_ms(&t, 50.0),
        "ttft_p95_ms": pct_ms(&t, 95.0),
        "steps": st.counters.steps,
        "preemptions": st.counters.preemptions,
        "load_avg_after": load_avg(),
    });
    eprintln!(
        "[a] done in {wall:.1} s: {:.0} total tok/s, {:.1} output tok/s",
        r["total_tok_s"].as_f64().unwrap(),
        r["output_tok_s"].as_f64().unwrap()
    );
    r
}

/// (b) shared prefix with the cache on or off, `interactive` profile.
fn phase_b(p: &Prompts, z: &Sizes, cache: bool) -> serde_json::Value {
    let cfg = EngineConfig {
        enable_prefix_cache: cache,
        ..Profile::load("interactive").unwrap()
    };
    let on = if cache { "on" } else { "off" };
    eprintln!(
        "[b] prefix cache {on}: 1 warm + {} requests x ({} shared + {} unique) prompt, {} output (load {})",
        z.b_requests,
        z.b_prefix,
        z.b_unique,
        z.b_output,
        load_avg()
    );
    let prefix = p.unique("System", 7, z.b_prefix);
    let prompt = |i: usize| {
        let mut t = prefix.clone();
        t.extend(p.body(5000 + i as u64, z.b_unique));
        t
    };
    let engine = start(cfg);
    let warm = engine
        .submit(request(
            prompt(usize::MAX / 2),
            z.b_output,
            SloClass::Interactive,
        ))
        .unwrap()
        .collect_blocking();
    check(&warm, z.b_output);
    let t0 = Instant::now();
    let streams: Vec<_> = (0..z.b_requests)
        .map(|i| {
            engine
                .submit(request(prompt(i), z.b_output, SloClass::Interactive))
                .unwrap()
        })
        .collect();
    let done = collect_all("b", &engine, streams, t0);
    let wall = t0.elapsed().as_secs_f64();
    done.iter().for_each(|c| check(c, z.b_output));
    let st = engine.stats();
    stop(engine);
    let t = ttfts(&done);
    let cached: usize = done.iter().map(|c| c.finish.cached_prompt_tokens).sum();
    let r = json!({
        "profile": "interactive",
        "prefix_cache": cache,
        "requests": z.b_requests,
        "shared_prefix_tokens": z.b_prefix,
        "unique_tokens": z.b_unique,
        "output_tokens_each": z.b_output,
        "wall_s": wall,
        "ttft_p50_ms": pct_ms(&t, 50.0),
        "ttft_p95_ms": pct_ms(&t, 95.0),
        "cached_prompt_tokens": cached,
        "prompt_tokens_computed": st.counters.prompt_tokens_computed,
        "load_avg_after": load_avg(),
    });
    eprintln!(
        "[b] cache {on} done in {wall:.1} s: TTFT p50 {:.0} ms, p95 {:.0} ms, {cached} prompt tokens from the cache",
        r["ttft_p50_ms"].as_f64().unwrap(),
        r["ttft_p95_ms"].as_f64().unwrap()
    );
    r
}

/// (c) interactive arrivals over (a)'s batch workload, `mixed` profile, SLO classes
/// on or off (FCFS).
fn phase_c(p: &Prompts, z: &Sizes, interval: Duration, slo: bool) -> serde_json::Value {
    let mixed = Profile::load("mixed").unwrap();
    let cfg = EngineConfig {
        slo_classes: slo,
        batch_aging_ms: z.c_batch_aging_ms.unwrap_or(mixed.batch_aging_ms),
        ..mixed
    };
    let aging_ms = cfg.batch_aging_ms;
    let mode = if slo { "SLO classes" } else { "FCFS" };
    eprintln!(
        "[c] {mode}: {} batch requests x {} x {} + up to {} interactive {} x {} every {:.2?} (load {})",
        z.a_requests,
        z.a_prompt,
        z.a_output,
        z.c_max_interactive,
        z.c_prompt,
        z.c_output,
        interval,
        load_avg()
    );
    let batch_prompts: Vec<Vec<u32>> = (0..z.a_requests)
        .map(|i| p.unique(&format!("Batch job {i}"), 1000 + i as u64, z.a_prompt))
        .collect();
    let inter_prompts: Vec<Vec<u32>> = (0..z.c_max_interactive)
        .map(|i| p.unique(&format!("Chat {i}"), 9000 + i as u64, z.c_prompt))
        .collect();
    let engine = start(cfg);
    let t0 = Instant::now();
    let streams = submit_all(&engine, batch_prompts, z.a_output, SloClass::Batch);
    // Interactive arrivals until the batch work is done.
    let batch_done = Arc::new(AtomicBool::new(false));
    let arrivals = {
        let engine = engine.clone();
        let batch_done = batch_done.clone();
        let out = z.c_output;
        std::thread::spawn(move || {
            let mut streams = Vec::new();
            let mut next = Instant::now() + interval / 2;
            for pr in inter_prompts {
                while Instant::now() < next {
                    if batch_done.load(Ordering::Acquire) {
                        return streams;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                next += interval;
                streams.push(
                    engine
                        .submit(request(pr, out, SloClass::Interactive))
                        .unwrap(),
                );
            }
            streams
        })
    };
    let done = collect_all("c", &engine, streams, t0);
    let batch_wall = t0.elapsed().as_secs_f64();
    batch_done.store(true, Ordering::Release);
    let inter: Vec<Completion> = arrivals
        .join()
        .unwrap()
        .into_iter()
        .map(RequestStream::collect_blocking)
        .collect();
    done.iter().for_each(|c| check(c, z.a_output));
    inter.iter().for_each(|c| check(c, z.c_output));
    let st = engine.stats();
    stop(engine);
    let ti = ttfts(&inter);
    let tb = ttfts(&done);
    let r = json!({
        "profile": "mixed",
        "slo_classes": slo,
        "batch_requests": z.a_requests,
        "interactive_requests": inter.len(),
        "interactive_prompt_tokens": z.c_prompt,
        "interactive_output_tokens": z.c_output,
        "interval_s": interval.as_secs_f64(),
        "batch_aging_ms": aging_ms,
        "interactive_ttft_p50_ms": pct_ms(&ti, 50.0),
        "interactive_ttft_p95_ms": pct_ms(&ti, 95.0),
        "batch_ttft_p50_ms": pct_ms(&tb, 50.0),
        "batch_wall_s": batch_wall,
        "batch_output_tok_s": (z.a_requests * z.a_output) as f64 / batch_wall,
        "preemptions": st.counters.preemptions,
        "load_avg_after": load_avg(),
    });
    eprintln!(
        "[c] {mode} done in {batch_wall:.1} s: {} interactive, TTFT p50 {:.0} ms, p95 {:.0} ms, {} preemptions",
        inter.len(),
        r["interactive_ttft_p50_ms"].as_f64().unwrap(),
        r["interactive_ttft_p95_ms"].as_f64().unwrap(),
        st.counters.preemptions
    );
    r
}

/// (d) batched decode at 32 sequences, as llama-batched-bench reports it (S_TG).
fn phase_d(p: &Prompts) -> serde_json::Value {
    let (n, prompt, output) = (32, 128, 64);
    let cfg = Profile::load("batch").unwrap();
    eprintln!(
        "[d] batched decode: {n} requests x {prompt} prompt x {output} output, profile batch (load {})",
        load_avg()
    );
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| p.unique(&format!("Decode job {i}"), 5000 + i as u64, prompt))
        .collect();
    let engine = start(cfg);
    let t0 = Instant::now();
    let streams = submit_all(&engine, prompts, output, SloClass::Batch);
    let done = collect_all("d", &engine, streams, t0);
    done.iter().for_each(|c| check(c, output));
    stop(engine);
    let first = done
        .iter()
        .filter_map(|c| c.finish.timings.first_token)
        .max()
        .unwrap();
    let last = done
        .iter()
        .filter_map(|c| c.finish.timings.last_token)
        .max()
        .unwrap();
    let decode_s = last.saturating_duration_since(first).as_secs_f64();
    let generated = n * (output - 1);
    let r = json!({
        "profile": "batch",
        "requests": n,
        "prompt_tokens_each": prompt,
        "output_tokens_each": output,
        "prefill_s": first.saturating_duration_since(t0).as_secs_f64(),
        "decode_s": decode_s,
        "generated_tok_s": generated as f64 / decode_s,
        "load_avg_after": load_avg(),
    });
    eprintln!(
        "[d] done: {:.1} generated tok/s over {decode_s:.1} s of decode",
        r["generated_tok_s"].as_f64().unwrap()
    );
    r
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "abcd".into());
    let aging = args
        .iter()
        .position(|a| a == "--batch-aging-ms")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse::<u64>()
                .expect("--batch-aging-ms takes milliseconds")
        });
    let z = if quick {
        Sizes {
            a_requests: 8,
            a_prompt: 512,
            a_output: 32,
            b_requests: 8,
            b_prefix: 400,
            b_unique: 40,
            b_output: 8,
            c_prompt: 100,
            c_output: 16,
            c_interval: Duration::from_millis(500),
            c_max_interactive: 4,
            c_batch_aging_ms: aging,
        }
    } else {
        Sizes {
            a_requests: 64,
            a_prompt: 512,
            a_output: 128,
            b_requests: 32,
            b_prefix: 400,
            b_unique: 40,
            b_output: 16,
            c_prompt: 100,
            c_output: 16,
            c_interval: Duration::from_millis(1000),
            c_max_interactive: 32,
            c_batch_aging_ms: aging,
        }
    };
    let threads = rayon::current_num_threads();
    let load_before = load_avg();
    eprintln!(
        "engine bench: fast precision, {threads} rayon threads, load {load_before}{}",
        if quick { ", --quick" } else { "" }
    );
    let file = GgufFile::open(model_path()).expect("open the default model");
    let p = Prompts {
        tok: Tokenizer::from_gguf(&file.content).expect("tokenizer"),
    };
    drop(file);
    let t_all = Instant::now();

    let a = only.contains('a').then(|| phase_a(&p, &z));
    let (b_on, b_off) = if only.contains('b') {
        (Some(phase_b(&p, &z, true)), Some(phase_b(&p, &z, false)))
    } else {
        (None, None)
    };
    // The interactive stream should be a modest share of the engine's capacity (on a
    // slow, shared machine one 100-token request per second can exceed all of it, and
    // then its queue only grows): at most a quarter of (a)'s measured token rate
    // (200 tok/s assumed when (a) did not run).
    let capacity = a
        .as_ref()
        .and_then(|a| a["total_tok_s"].as_f64())
        .unwrap_or(200.0);
    let interval = match args.iter().position(|a| a == "--interval-ms") {
        Some(i) => Duration::from_millis(
            args.get(i + 1)
                .and_then(|v| v.parse().ok())
                .expect("--interval-ms takes milliseconds"),
        ),
        None => z.c_interval.max(Duration::from_secs_f64(
            (z.c_prompt + z.c_output) as f64 / (0.25 * capacity),
        )),
    };
    let skip_fcfs = args.iter().any(|a| a == "--skip-fcfs");
    let (c_slo, c_fcfs) = if only.contains('c') {
        (
            Some(phase_c(&p, &z, interval, true)),
            (!skip_fcfs).then(|| phase_c(&p, &z, interval, false)),
        )
    } else {
        (None, None)
    };
    let d = only.contains('d').then(|| phase_d(&p));
    let load_after = load_avg();

    let f = |v: &Option<serde_json::Value>, k: &str| {
        v.as_ref()
            .and_then(|v| v[k].as_f64())
            .map_or("-".to_string(), |x| format!("{x:.1}"))
    };
    println!();
    println!(
        "engine: SmolLM2-135M-Instruct Q4_1, fast, {threads} threads, {:.0} s; load {load_before} -> {load_after}{}",
        t_all.elapsed().as_secs_f64(),
        if quick { " (--quick)" } else { "" }
    );
    if let Some(av) = &a {
        println!(
            "(a) {} x {} prompt x {} output, batch profile: total {} tok/s, output {} tok/s, wall {} s (load after {})",
            z.a_requests,
            z.a_prompt,
            z.a_output,
            f(&a, "total_tok_s"),
            f(&a, "output_tok_s"),
            f(&a, "wall_s"),
            av["load_avg_after"].as_str().unwrap_or("?")
        );
    }
    if b_on.is_some() {
        println!(
            "(b) {} x ({} shared + {} unique), interactive profile:",
            z.b_requests, z.b_prefix, z.b_unique
        );
        println!(
            "    {:<14} {:>12} {:>12} {:>10}",
            "prefix cache", "TTFT p50 ms", "TTFT p95 ms", "wall s"
        );
        for (name, v) in [("on", &b_on), ("off", &b_off)] {
            println!(
                "    {:<14} {:>12} {:>12} {:>10}",
                name,
                f(v, "ttft_p50_ms"),
                f(v, "ttft_p95_ms"),
                f(v, "wall_s")
            );
        }
    }
    if c_slo.is_some() {
        println!(
            "(c) interactive {} prompt x {} output every {:.2?} over (a)'s batch load, mixed profile:",
            z.c_prompt, z.c_output, interval
        );
        println!(
            "    {:<14} {:>6} {:>12} {:>12} {:>14} {:>12}",
            "scheduling", "n", "TTFT p50 ms", "TTFT p95 ms", "batch out tok/s", "preemptions"
        );
        for (name, v) in [("SLO classes", &c_slo), ("FCFS", &c_fcfs)] {
            if v.is_none() {
                continue;
            }
            let n = v.as_ref().unwrap()["interactive_requests"].clone();
            let pre = v.as_ref().unwrap()["preemptions"].clone();
            println!(
                "    {:<14} {:>6} {:>12} {:>12} {:>14} {:>12}",
                name,
                n,
                f(v, "interactive_ttft_p50_ms"),
                f(v, "interactive_ttft_p95_ms"),
                f(v, "batch_output_tok_s"),
                pre
            );
        }
    }
    if d.is_some() {
        println!(
            "(d) 32 x 128 prompt x 64 output, batch profile: {} generated tok/s during decode (llama-batched-bench's S_TG)",
            f(&d, "generated_tok_s")
        );
    }
    let json = json!({
        "bench": "engine",
        "model": sloserve_model::DEFAULT_MODEL_PATH,
        "precision": "fast",
        "threads": threads,
        "quick": quick,
        "kv_cache_bytes": KV_BYTES,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "batch_aging_ms_override": aging,
        "a_throughput": a,
        "b_prefix_cache_on": b_on,
        "b_prefix_cache_off": b_off,
        "c_slo_classes": c_slo,
        "c_fcfs": c_fcfs,
        "d_batched_decode": d,
    });
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("create target/bench");
    // Partial or modified runs never overwrite the full results.
    let mut name = String::from("engine");
    if quick {
        name.push_str("-quick");
    }
    if only != "abcd" {
        name.push_str(&format!("-{only}"));
    }
    if let Some(ms) = aging {
        name.push_str(&format!("-aging{ms}"));
    }
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("write json");
    println!("wrote {}", path.display());
}
