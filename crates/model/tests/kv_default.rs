//! `--kv-cache-memory` unset: the runner sizes the KV pool from the machine's
//! available memory (`memory_plan`'s rule), and the pool, gigabytes on a machine
//! with room, is not resident until it fills: after load the process holds about
//! the file, as with a small pool asked for. One test in this file, so the process
//! measures one load only.

mod common;

use common::{qwen05_path, status_kb};
use sloserve_engine::ModelRunner;
use sloserve_model::memory_plan::{DEFAULT_KV_MAX, DEFAULT_KV_MIN, MARGIN_BYTES};
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

#[test]
fn the_default_pool_comes_from_available_memory_and_is_not_resident() {
    let path = qwen05_path();
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let available = sloserve_model::memory_plan::mem_available().expect("/proc/meminfo") as f64;
    let opts = RunnerOptions {
        precision: Precision::Fast,
        kv_cache_memory: None,
        ..Default::default()
    };
    let runner = LlamaRunner::load(&path, &opts).expect("load the 0.5B");
    let rss = status_kb("VmRSS:") as f64 * 1024.0;
    let info = runner.info();
    let pool = (info.num_kv_blocks * info.block_size * info.kv_bytes_per_token) as f64;
    let held = runner.model().held_bytes().total() as f64;
    let mb = |b: f64| b / 1e6;
    println!(
        "available {:.0} MB at start; weights {:.0} MB; KV pool {:.0} MB ({} blocks); RSS after load {:.0} MB",
        mb(available),
        mb(held),
        mb(pool),
        info.num_kv_blocks,
        mb(rss)
    );
    // The rule: half of what the weights and the margin leave, within its bounds
    // (the pool rounds down to whole blocks; memory moved a little since start).
    let per_block = (info.block_size * info.kv_bytes_per_token) as f64;
    assert!(pool <= DEFAULT_KV_MAX as f64, "{pool}");
    assert!(pool + per_block >= DEFAULT_KV_MIN as f64, "{pool}");
    let rule = ((available - held - MARGIN_BYTES as f64) / 2.0).min(DEFAULT_KV_MAX as f64);
    assert!(
        (pool - rule).abs() <= 0.1 * rule + per_block,
        "pool {:.0} MB, the rule gives about {:.0} MB",
        mb(pool),
        mb(rule)
    );
    // Not resident: the process after load is the file's size and the margin,
    // whatever the pool (the fast-precision bound of qwen_memory.rs less its KV).
    let bound = 1.15 * file + 300e6;
    assert!(
        rss <= bound,
        "resident {:.0} MB > {:.0} MB with a {:.0} MB pool",
        mb(rss),
        mb(bound),
        mb(pool)
    );
}
