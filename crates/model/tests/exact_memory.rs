//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M in exact precision holds the file's blocks
//! (dequantized inside the f32 GEMM), not an f32 copy: the process's resident memory
//! after load stays within 1.15x the file plus the KV cache asked for plus 300 MB
//! (an f32 copy, 4 bytes a weight, is about 5x the file). One test in this file, so
//! the process measures one load only.

mod common;

use common::load_qwen05_measured;
use sloserve_model::Precision;

#[test]
fn exact_precision_holds_the_files_blocks() {
    let m = load_qwen05_measured(Precision::Exact, 64 << 20);
    if !sloserve_model::kernels::cpu::has_avx2() {
        eprintln!("no AVX2: exact precision holds f32 weights, bound not checked");
        return;
    }
    m.assert_within_bound();
    // Only norms, biases and any f32 tensors of the file stay f32.
    let (held, file) = (m.runner.model().held_bytes(), m.file);
    assert!(held.f32 as f64 <= 0.01 * file, "{held:?}: no f32 copies");
    assert!(held.total() as f64 <= 1.01 * file, "{held:?} vs {file}");
}
