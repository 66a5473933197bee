//! Benchmark harness: paths, starting and stopping the engine on the default model,
//! requests, percentiles, and collecting streams with a progress line.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sloserve_engine::{
    Completion, Engine, EngineConfig, EngineHandle, FinishReason, Request, RequestStream, SloClass,
};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

#[path = "../common.rs"]
mod common;
pub use common::{load_avg, model_path, target_dir};

pub const KV_BYTES: usize = 2 << 30;

pub fn start(cfg: EngineConfig) -> EngineHandle {
    let opts = RunnerOptions {
        precision: Precision::Fast,
        block_size: 16,
        kv_cache_memory: Some(KV_BYTES),
        max_model_len: None,
        quantize: None,
        ..Default::default()
    };
    let runner = LlamaRunner::load(model_path(), &opts).expect("load the default model");
    Engine::start(Box::new(runner), cfg).expect("start the engine")
}

pub fn stop(engine: EngineHandle) {
    engine.shutdown();
    engine.wait_stopped(Some(Duration::from_secs(60)));
}

pub fn request(prompt: Vec<u32>, max_tokens: usize, class: SloClass) -> Request {
    let mut r = Request::greedy(prompt, max_tokens).with_class(class);
    r.stop.ignore_eos = true;
    r
}

/// Submits every prompt at once as a greedy request of `max_tokens` in `class`.
pub fn submit_all(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    class: SloClass,
) -> Vec<RequestStream> {
    prompts
        .into_iter()
        .map(|pr| engine.submit(request(pr, max_tokens, class)).unwrap())
        .collect()
}

pub fn check(c: &Completion, max_tokens: usize) {
    assert_eq!(
        c.finish.reason,
        FinishReason::Length,
        "request failed: {:?}",
        c.finish.reason
    );
    assert_eq!(c.tokens.len(), max_tokens);
}

/// Nearest-rank percentile of `v` (seconds) in milliseconds.
pub fn pct_ms(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1] * 1e3
}

pub fn ttfts(cs: &[Completion]) -> Vec<f64> {
    cs.iter()
        .map(|c| c.finish.timings.ttft().unwrap_or_default().as_secs_f64())
        .collect()
}

/// Collects streams in order while a thread prints the engine's progress every 15 s.
pub fn collect_all(
    label: &'static str,
    engine: &EngineHandle,
    streams: Vec<RequestStream>,
    t0: Instant,
) -> Vec<Completion> {
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (engine, done) = (engine.clone(), done.clone());
        std::thread::spawn(move || {
            let mut next = Instant::now() + Duration::from_secs(15);
            while !done.load(Ordering::Acquire) {
                if Instant::now() >= next {
                    let st = engine.stats();
                    let c = st.counters;
                    eprintln!(
                        "  [{label}] {:>4.0} s: {} finished, {} running, {} waiting, {} prefilled, {} generated (load {})",
                        t0.elapsed().as_secs_f64(),
                        c.requests_finished_length + c.requests_finished_stop,
                        st.running.interactive + st.running.batch,
                        st.waiting.interactive + st.waiting.batch,
                        c.prefill_tokens,
                        c.generation_tokens,
                        load_avg()
                    );
                    next += Duration::from_secs(15);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let out = streams
        .into_iter()
        .map(RequestStream::collect_blocking)
        .collect();
    done.store(true, Ordering::Release);
    monitor.join().unwrap();
    out
}
