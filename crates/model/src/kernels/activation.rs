//! `silu_mul`: the gated activation of the feed-forward (SwiGLU), `silu(gate) · up`,
//! element-wise over the rayon pool.

use rayon::prelude::*;

/// `gate[i] = silu(gate[i]) * up[i]`, where `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    gate.par_iter_mut().zip(up.par_iter()).for_each(|(g, u)| {
        *g = *g / (1.0 + (-*g).exp()) * u;
    });
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
}
