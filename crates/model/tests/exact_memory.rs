//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M in exact precision holds the file's blocks
//! (dequantized inside the f32 GEMM), not an f32 copy: the process's resident memory
//! after load stays within 1.15x the file plus the KV cache asked for plus 300 MB
//! (an f32 copy, 4 bytes a weight, is about 5x the file). One test in this file, so
//! the process measures one load only.

mod common;

use common::{qwen05_path, status_kb};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

#[test]
fn exact_precision_holds_the_files_blocks() {
    let path = qwen05_path();
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let kv = 64u64 << 20;
    let opts = RunnerOptions {
        precision: Precision::Exact,
        kv_cache_memory: Some(kv as usize),
        ..Default::default()
    };
    let before = status_kb("VmRSS:") as f64 * 1024.0;
    let runner = LlamaRunner::load(&path, &opts).expect("load the 0.5B");
    let rss = status_kb("VmRSS:") as f64 * 1024.0;
    let peak = status_kb("VmHWM:") as f64 * 1024.0;
    let held = runner.model().held_bytes();
    let bound = 1.15 * file + kv as f64 + 300e6;
    let mb = |b: f64| b / 1e6;
    println!(
        "exact: file {:.0} MB; held {held:?} = {:.0} MB; RSS before {:.0}, after {:.0}, peak {:.0} MB; bound {:.0} MB",
        mb(file),
        mb(held.total() as f64),
        mb(before),
        mb(rss),
        mb(peak),
        mb(bound)
    );
    if !sloserve_model::kernels::cpu::has_avx2() {
        eprintln!("no AVX2: exact precision holds f32 weights, bound not checked");
        return;
    }
    assert!(
        rss <= bound,
        "resident {:.0} MB > {:.0} MB",
        mb(rss),
        mb(bound)
    );
    assert!(
        peak <= bound,
        "peak {:.0} MB > {:.0} MB",
        mb(peak),
        mb(bound)
    );
    // Only norms, biases and any f32 tensors of the file stay f32.
    assert!(held.f32 as f64 <= 0.01 * file, "{held:?}: no f32 copies");
    assert!(held.total() as f64 <= 1.01 * file, "{held:?} vs {file}");
}
