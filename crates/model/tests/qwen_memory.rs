//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Q5_0, Q8_0, Q6_K, Q4_K) is held once: the
//! process's resident memory after load, and its peak during load, stay within
//! 1.15x the file plus the KV cache asked for plus 300 MB, in fast precision. One
//! test in this file, so the process measures one load only. No matrix is held whole
//! in the file's form beside its panels while it is packed (the peak over the resident
//! memory after load stays under half the largest matrix: the tied output).

mod common;

use common::load_qwen05_measured;
use sloserve_model::{GgufFile, Precision};

#[test]
fn resident_memory_after_load_is_about_the_file() {
    let m = load_qwen05_measured(Precision::Fast, 64 << 20);
    m.assert_within_bound();
    // The 5-bit types (most of this file is Q5_0) take one byte a value in the
    // panels: 1.0625 bytes a weight against the file's 0.6875.
    let (held, file) = (m.runner.model().held_bytes(), m.file);
    assert!(
        (held.total() as f64) <= 1.25 * file,
        "weights held in {:.0} MB, the file is {:.0} MB",
        held.total() as f64 / 1e6,
        file / 1e6
    );
    assert!(held.f32 as f64 <= 0.01 * file, "{held:?}: no f32 copies");
    let gguf = GgufFile::open(common::qwen05_path()).expect("open the 0.5B");
    let largest = gguf
        .content
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size())
        .max()
        .unwrap_or(0) as f64;
    assert!(
        m.peak - m.rss < 0.5 * largest,
        "peak {:.0} MB during load, {:.0} MB after: a transient copy (largest matrix {:.0} MB)",
        m.peak / 1e6,
        m.rss / 1e6,
        largest / 1e6
    );
}
