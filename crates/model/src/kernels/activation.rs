//! The gated activations of the feed-forward, element-wise (over the pool when large):
//! `silu_mul` (SwiGLU) and `gelu_mul` (GEGLU with the tanh GELU, rounded through f16
//! exactly as llama.cpp's CPU backend computes it).

use std::sync::OnceLock;

use crate::kernels::pool::parallel_rows;
use half::f16;

/// Elements per parallel task; a decode step's few thousand run on the caller alone.
const CHUNK: usize = 16 * 1024;

/// `gate[i] = f(gate[i], up[i])` for every `i`, in chunks over the pool.
fn zip_map(gate: &mut [f32], up: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    let n = gate.len().min(up.len());
    // Rows of one element, CHUNK of them a task.
    parallel_rows(&mut gate[..n], 1, CHUNK, &|lo, g| {
        for (g, u) in g.iter_mut().zip(&up[lo..]) {
            *g = f(*g, *u);
        }
    });
}

/// `gate[i] = silu(gate[i]) * up[i]`, where `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    zip_map(gate, up, |g, u| g / (1.0 + (-g).exp()) * u);
}

/// The tanh approximation of GELU in f32 (ggml's `ggml_gelu_f32`).
pub fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, rounded to f16 (ggml's `ggml_table_gelu_f16`).
fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// GELU as llama.cpp's CPU backend computes it (`GGML_GELU_FP16`): 0 at or below -10,
/// x at or above 10, else the f16 table at x rounded to f16.
#[inline]
fn gelu_ggml(table: &[f16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        table[f16::from_f32(x).to_bits() as usize].to_f32()
    }
}

/// `gate[i] = gelu(gate[i]) * up[i]` (ggml's `ggml_vec_geglu_f32`).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    zip_map(gate, up, |g, u| gelu_ggml(table, g) * u);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_by_silu() {
        let mut gate = [0.0, 1.0, -1.0, 30.0, -30.0];
        silu_mul(&mut gate, &[2.0, 2.0, 2.0, 0.5, 1.0]);
        let want = [0.0, 1.462_117_2, -0.537_882_8, 15.0, 0.0];
        for (g, w) in gate.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn gates_by_gelu_rounded_through_f16() {
        // Inside (-10, 10): the f16 table at x rounded to f16; outside: 0 or x.
        let via_f16 = |x: f32| f16::from_f32(gelu_f32(f16::from_f32(x).to_f32())).to_f32();
        let mut gate = [0.0, 1.0, -1.0, 12.0, -12.0, 0.1001];
        gelu_mul(&mut gate, &[2.0, 1.0, 1.0, 0.5, 1.0, 1.0]);
        assert_eq!(gate[0], 0.0);
        assert_eq!(gate[1], via_f16(1.0));
        assert_ne!(gate[1], gelu_f32(1.0));
        assert_eq!(gate[2], via_f16(-1.0));
        assert_eq!(gate[3], 6.0);
        assert_eq!(gate[4], 0.0);
        assert_eq!(gate[5], via_f16(0.1001));
        // gelu(1) = 0.5 * (1 + tanh(0.79788456 * 1.044715)).
        assert!((gelu_f32(1.0) - 0.841_192).abs() < 1e-5);
    }
}
