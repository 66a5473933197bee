//! What every model benchmark needs: paths, the load average, the median.
#![allow(dead_code)] // each bench uses its own subset

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model, or the file `SLOSERVE_BENCH_MODEL` names.
pub fn model_path() -> PathBuf {
    match std::env::var_os("SLOSERVE_BENCH_MODEL") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join(sloserve_model::DEFAULT_MODEL_PATH),
    }
}

/// Where results go: `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

pub fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}
