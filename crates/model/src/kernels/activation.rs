//! The gated activations of the feed-forward, element-wise (over the pool when large):
//! `silu_mul` (SwiGLU), `gelu_mul` (GEGLU with the tanh GELU, rounded through f16
//! exactly as llama.cpp's CPU backend computes it) and `swiglu_oai_mul` (gpt-oss's
//! clamped SwiGLU), in place over two matrices or (`_rows`) from one stacked gate/up
//! matrix into a third; and `gelu`, the same GELU ungated in place (an encoder's
//! feed-forward).

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

/// `gate[i] = silu(gate[i]) * up[i]`, where `silu(g) = g / (1 + e^-g)`; with AVX2
/// eight at a time through `exp256` (within 2 ulp of libm's `expf`, which took
/// half of this function's time at batch 32).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    if !crate::kernels::cpu::has_avx2() {
        return zip_map(gate, up, silu_mul_one);
    }
    parallel_rows(&mut gate[..n], 1, CHUNK, &|lo, g| {
        let p = g.as_mut_ptr();
        // SAFETY: the CPU has AVX2 and FMA (checked above); `up[lo..]` holds at
        // least `g.len()` values since `lo + g.len() <= n <= up.len()`; out and
        // gate are the same run, each value read before it is written.
        unsafe { silu_mul_avx2(p, p, up[lo..lo + g.len()].as_ptr(), g.len()) }
    });
}

/// `out[r] = silu(gate_r) · up_r` for each row `r` of `gate_up` (`[rows, 2·width]`,
/// a row's gate then its up, as a stacked gate/up projection writes them): the
/// activation reads the projection in place, with no copy into two matrices.
pub fn silu_mul_rows(gate_up: &[f32], width: usize, out: &mut [f32]) {
    let avx2 = crate::kernels::cpu::has_avx2();
    gated_rows(gate_up, width, out, &|o, g, u| {
        if avx2 {
            // SAFETY: the CPU has AVX2 and FMA; g, u and o hold o.len() values.
            unsafe { silu_mul_avx2(o.as_mut_ptr(), g.as_ptr(), u.as_ptr(), o.len()) }
        } else {
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = silu_mul_one(*g, *u);
            }
        }
    });
}

/// `f(out, gate, up)` over one row.
type GatedRow<'a> = dyn Fn(&mut [f32], &[f32], &[f32]) + Sync + 'a;

/// `f(out_r, gate_r, up_r)` for each row of `gate_up` (`[rows, 2·width]`), rows
/// of at least `CHUNK` values a task over the pool.
fn gated_rows(gate_up: &[f32], width: usize, out: &mut [f32], f: &GatedRow<'_>) {
    assert!(
        gate_up.len() >= 2 * out.len(),
        "gate_up holds [rows, 2·width]"
    );
    let per_task = (CHUNK / width.max(1)).max(1);
    parallel_rows(out, width, per_task, &|r0, out| {
        for (r, o) in out.chunks_exact_mut(width).enumerate() {
            let (g, u) = gate_up[(r0 + r) * 2 * width..][..2 * width].split_at(width);
            f(o, g, u);
        }
    });
}

fn silu_mul_one(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `out[i] = silu(gate[i]) · up[i]` for `i < n`, eight lanes at a time and the tail
/// one by one; `out` may be `gate` (each value is read before it is written).
///
/// # Safety
/// The CPU must have AVX2 and FMA; each pointer holds `n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(out: *mut f32, gate: *const f32, up: *const f32, n: usize) {
    use crate::kernels::exp::exp256;
    use std::arch::x86_64::*;
    let whole = n / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    for i in (0..whole).step_by(8) {
        let g = _mm256_loadu_ps(gate.add(i));
        let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(up.add(i))));
    }
    for i in whole..n {
        *out.add(i) = silu_mul_one(*gate.add(i), *up.add(i));
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn silu_mul_avx2(_: *mut f32, _: *const f32, _: *const f32, _: usize) {
    unreachable!("guarded by has_avx2")
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

/// `x[i] = gelu(x[i])` (ggml's `ggml_vec_gelu_f32`: `gelu_mul` without the gate).
pub fn gelu(x: &mut [f32]) {
    let table = gelu_table();
    parallel_rows(x, 1, CHUNK, &|_, x| {
        for v in x.iter_mut() {
            *v = gelu_ggml(table, *v);
        }
    });
}

/// `out[r] = gelu(gate_r) · up_r` for each row of `gate_up`, as `silu_mul_rows`.
pub fn gelu_mul_rows(gate_up: &[f32], width: usize, out: &mut [f32]) {
    let table = gelu_table();
    gated_rows(gate_up, width, out, &|o, g, u| {
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = gelu_ggml(table, *g) * u;
        }
    });
}

/// ggml's `swiglu_oai` of one pair: `g = min(gate, limit)`, `u = clamp(up, -limit,
/// limit)`, `g / (1 + e^(-alpha·g)) · (u + 1)`, with libm's `expf` as there.
#[inline]
pub fn swiglu_oai_one(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let x = gate.min(limit);
    let y = up.clamp(-limit, limit);
    x / (1.0 + (alpha * -x).exp()) * (y + 1.0)
}

/// `gate[i] = swiglu_oai(gate[i], up[i])`.
pub fn swiglu_oai_mul(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    zip_map(gate, up, |g, u| swiglu_oai_one(g, u, alpha, limit));
}

/// `out[r] = swiglu_oai(gate_r, up_r)` for each row of `gate_up`, as `silu_mul_rows`.
pub fn swiglu_oai_mul_rows(gate_up: &[f32], width: usize, out: &mut [f32], alpha: f32, limit: f32) {
    gated_rows(gate_up, width, out, &|o, g, u| {
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = swiglu_oai_one(*g, *u, alpha, limit);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clamps: the gate only from above, the up from both sides, and (up + 1).
    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let f = |g, u| swiglu_oai_one(g, u, 1.702, 7.0);
        let sig = |x: f32| 1.0 / (1.0 + (-1.702 * x).exp());
        assert_eq!(f(0.0, 3.0), 0.0);
        assert_eq!(f(2.0, 0.5), 2.0 / (1.0 + (1.702f32 * -2.0).exp()) * 1.5);
        assert_eq!(f(9.0, 1.0), f(7.0, 1.0));
        assert!((f(9.0, 1.0) - 7.0 * sig(7.0) * 2.0).abs() < 1e-5);
        assert_eq!(f(1.0, 20.0), f(1.0, 7.0));
        assert_eq!(f(1.0, -20.0), f(1.0, -7.0));
        // A negative gate is not clamped from below.
        assert!((f(-3.0, 0.0) - -3.0 * sig(-3.0)).abs() < 1e-6);
        let (rows, width) = (3, 37);
        let gate_up: Vec<f32> = (0..rows * 2 * width)
            .map(|i| (i % 41) as f32 * 0.5 - 10.0)
            .collect();
        let mut out = vec![f32::NAN; rows * width];
        swiglu_oai_mul_rows(&gate_up, width, &mut out, 1.702, 7.0);
        for r in 0..rows {
            let mut g = gate_up[2 * r * width..][..width].to_vec();
            swiglu_oai_mul(&mut g, &gate_up[(2 * r + 1) * width..][..width], 1.702, 7.0);
            assert_eq!(g, out[r * width..][..width]);
        }
    }

    /// The vector path against the scalar one over the range a gate takes (and
    /// past exp's ends), with a tail that is not a whole vector.
    #[test]
    fn vector_silu_matches_the_scalar_one() {
        let gate: Vec<f32> = (0..4003).map(|i| (i as f32 - 2001.0) * 0.05).collect();
        let up: Vec<f32> = (0..4003).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut ours = gate.clone();
        silu_mul(&mut ours, &up);
        for ((o, g), u) in ours.iter().zip(&gate).zip(&up) {
            let want = silu_mul_one(*g, *u);
            assert!(
                (o - want).abs() <= 1e-6 * want.abs().max(1e-30),
                "{g}: {o} vs {want}"
            );
        }
        let mut far = [-100.0f32, -90.0, 90.0, 100.0, 0.0, -0.0, 1.0, 2.0];
        silu_mul(&mut far, &[1.0; 8]);
        assert_eq!(&far[..4], &[-0.0, -0.0, 90.0, 100.0]);
    }

    /// The row forms over a stacked `[rows, 2·width]` equal the in-place forms over
    /// the two halves, bit for bit.
    #[test]
    fn row_forms_equal_the_in_place_ones() {
        let (rows, width) = (5, 1003);
        let gate_up: Vec<f32> = (0..rows * 2 * width)
            .map(|i| ((i * 37) % 1000) as f32 * 0.01 - 5.0)
            .collect();
        let half = |r: usize, part: usize| gate_up[(2 * r + part) * width..][..width].to_vec();
        let gated = [
            (
                silu_mul as fn(&mut [f32], &[f32]),
                silu_mul_rows as fn(&[f32], usize, &mut [f32]),
            ),
            (gelu_mul, gelu_mul_rows),
        ];
        for (in_place, rows_form) in gated {
            let mut out = vec![f32::NAN; rows * width];
            rows_form(&gate_up, width, &mut out);
            for r in 0..rows {
                let mut want = half(r, 0);
                in_place(&mut want, &half(r, 1));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out[r * width..][..width]), bits(&want), "row {r}");
            }
        }
    }

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
