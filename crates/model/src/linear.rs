//! `Linear` (y = x·Wᵀ + b) and which kernel multiplies each batch: the 8-bit GEMM
//! for every decode batch of the types it holds (and for prompts in int8
//! precision), the half-precision rows kernel for a few rows of f16/bf16 weights,
//! the f32 GEMM for prompts in fast precision and for larger batches of types the
//! 8-bit GEMM cannot hold, which take quantized dot products at a few rows. The
//! switch points are measured (see `Gemm::min_rows`, `HALF_MAX_ROWS`) and decided
//! here only.

use crate::kernels::gemm_f32::gemm_f32;
use crate::kernels::half_rows::{self, HalfWeights};
use crate::kernels::int8_gemm::{self, Isa};
use crate::kernels::int8_panels::Int8Panels;
use crate::kernels::packed_gemm::PackedMatrix;
use crate::weights::{Precision, WeightData};

/// Batches of weights the 8-bit GEMM cannot hold with at least this many rows run on
/// the f32 GEMM (compute-bound); smaller ones as quantized dot products
/// (memory-bound: one or two decoding sequences). Measured with the forward bench for the f32 GEMM: at
/// 3 rows it is already ahead (71 vs 68 tok/s), at 4 rows by 1.3x, at 8 by 1.7x.
pub const GEMM_MIN_ROWS: usize = 3;

/// f16/bf16 weights (fast and int8 precision, AVX2): batches up to this many rows
/// run on `half_rows`, which reads the 2-byte weights once for them all, larger ones
/// on the packed f32 GEMM (4-byte weights, compute-bound). Measured on the default
/// model `--quantize f16` (forward bench `--only decode_bN`, 2 threads, stop 13),
/// tok/s rows kernel vs GEMM: b4 173 vs 119, b8 254 vs 195, b12 268 vs 245, b16 274
/// vs 268, b32 251 vs 355. (Before it, f16 weights were held as f32 and multiplied
/// by the `gemm` crate at every batch size: b1 22, b8 96, b32 232.)
pub const HALF_MAX_ROWS: usize = 12;

/// The rows one product multiplies: how many, and whether they include a prompt's
/// (a sequence with more than one new token), which fast precision keeps on f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tokens {
    pub n: usize,
    pub prompt: bool,
}

/// The earlier of two path switches (`Linear::small_batch_max_rows`).
pub fn first_switch(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A GEMM that large batches take.
#[derive(Clone, Copy)]
enum Gemm {
    Int8,
    F32,
}

impl Gemm {
    /// The fewest rows worth this GEMM. The 8-bit GEMM reads 4-bit values as
    /// nibbles (the file's bytes: values and f16 scales) and needs no horizontal sums: from
    /// one row, for every type it holds. Measured at batch 1 against the decode GEMVs
    /// it replaced (Q4_1 and Q8_0 rows repacked at load, 8-bit dot products for the
    /// others; forward bench `--only decode_bN`, 2 threads, median of 7):
    /// - AVX2 (stop 14, Intel Xeon with `SLOSERVE_DENSE=avx2`), default model: b1
    ///   174-188 vs 141-159 tok/s (Q4_1 on the GEMM, Q8_0 output on its GEMV:
    ///   159), b8 454-472 vs 408-416; before nibbles and 8-bit values on AVX2 the
    ///   GEMV's 123-136;
    /// - AVX-512 VNNI (stop 13), default model 192-218 vs 169-174 tok/s,
    ///   `--quantize q8_0` 144-146 vs 87-90, Gemma 3 (Q8_0, Q5_0) 69-70 vs 38-39.
    fn min_rows(self) -> usize {
        match self {
            Gemm::Int8 => 1,
            Gemm::F32 => GEMM_MIN_ROWS,
        }
    }
}

/// The f32 copy of quantized weights.
enum F32Copy {
    /// Packed for our AVX2 kernel.
    Packed(PackedMatrix),
    /// Row-major, for the `gemm` crate (CPUs without AVX2).
    RowMajor(Vec<f32>),
}

impl F32Copy {
    fn new(w: &WeightData, n: usize, k: usize) -> Self {
        let f = w.to_f32();
        if crate::kernels::cpu::has_avx2() {
            F32Copy::Packed(PackedMatrix::pack(&f, n, k))
        } else {
            F32Copy::RowMajor(f)
        }
    }

    fn matmul(&self, x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
        match self {
            F32Copy::Packed(w) => w.matmul(x, m, out),
            F32Copy::RowMajor(w) => gemm_f32(x, w, m, k, n, out),
        }
    }
}

/// Where one batch is multiplied.
enum Path<'a> {
    F32Weights(&'a [f32]),
    Int8(&'a Int8Panels, Isa),
    F32Copy(&'a F32Copy),
    Half(HalfWeights<'a>),
    Quantized,
}

/// `w` as half-precision weights, if it is.
fn half(w: &WeightData) -> Option<HalfWeights<'_>> {
    match w {
        WeightData::F16(w) => Some(HalfWeights::F16(w)),
        WeightData::BF16(w) => Some(HalfWeights::BF16(w)),
        _ => None,
    }
}

/// A linear layer `y = x·Wᵀ (+ b)` with W of shape `[n_out, k]`.
pub struct Linear {
    /// Quantized or half-precision (fast, int8) or f32 (exact) weights.
    pub weight: WeightData,
    /// Exact 8-bit panels for decode batches (and prompts in int8 precision).
    int8: Option<(Int8Panels, Isa)>,
    /// f32 copy for prompts in fast precision, and for batches when there are no
    /// 8-bit panels.
    f32: Option<F32Copy>,
    /// Whether prompts take the 8-bit GEMM too (int8 precision).
    prompt_int8: bool,
    pub n_out: usize,
    pub k: usize,
    pub bias: Option<Vec<f32>>,
}

/// The 8-bit panels, 4-bit values packed as nibbles (on both instruction sets they
/// beat one byte each, prompts included: AVX2 int8 prefill 803-830 vs 762 tok/s,
/// stop 14). `SLOSERVE_DENSE` (comma-separated) is for A/B measurements of the other
/// paths: `f32` leaves out the 8-bit GEMM, `avx2` takes its AVX2 kernel on a CPU
/// with AVX-512 VNNI, `u8` leaves 4-bit values one byte each.
fn int8_panels(w: &WeightData, n: usize, k: usize) -> Option<(Int8Panels, Isa)> {
    let choice = std::env::var("SLOSERVE_DENSE").unwrap_or_default();
    let choices: Vec<&str> = choice.split(',').collect();
    if choices.contains(&"f32") {
        return None;
    }
    let mut p = Int8Panels::pack(w, n, k)?;
    let isa = match choices.contains(&"avx2") {
        true => Some(Isa::Avx2).filter(|i| i.available()),
        false => Isa::best(),
    }?;
    if !choices.contains(&"u8") {
        p.to_nibbles();
    }
    Some((p, isa))
}

impl Linear {
    pub fn new(
        weight: WeightData,
        n_out: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        precision: Precision,
    ) -> Self {
        let quantized = !matches!(
            weight,
            WeightData::F32(_) | WeightData::F16(_) | WeightData::BF16(_)
        );
        let mut linear = Linear {
            weight,
            int8: None,
            f32: None,
            prompt_int8: precision == Precision::Int8,
            n_out,
            k,
            bias,
        };
        let avx2 = crate::kernels::cpu::has_avx2();
        if precision != Precision::Exact && avx2 && half(&linear.weight).is_some() {
            // Few rows read the 2-byte weights (`half_rows`, f32 products); GEMMs
            // take an f32 copy.
            linear.f32 = Some(F32Copy::new(&linear.weight, n_out, k));
            return linear;
        }
        if precision == Precision::Exact || !quantized {
            // f16/bf16 dot products that round activations to 16 bits would be less
            // exact; without AVX2 the f32 GEMM is as fast.
            if !matches!(linear.weight, WeightData::F32(_)) {
                linear.weight = WeightData::F32(linear.weight.to_f32());
            }
            return linear;
        }
        let w = &linear.weight;
        linear.int8 = int8_panels(w, n_out, k);
        if !linear.prompt_int8 || linear.int8.is_none() {
            linear.f32 = Some(F32Copy::new(w, n_out, k));
        }
        linear
    }

    /// The fewest rows that `gemm` multiplies (fewer: the half-precision rows
    /// kernel, or the quantized dot products).
    fn gemm_from(&self, gemm: Gemm) -> usize {
        let small_end = half(&self.weight).map_or(0, |_| HALF_MAX_ROWS + 1);
        small_end.max(gemm.min_rows())
    }

    fn path(&self, t: Tokens) -> Path<'_> {
        if let WeightData::F32(w) = &self.weight {
            return Path::F32Weights(w);
        }
        if let Some((p, isa)) = &self.int8 {
            if (!t.prompt || self.prompt_int8) && t.n >= self.gemm_from(Gemm::Int8) {
                return Path::Int8(p, *isa);
            }
        }
        match &self.f32 {
            Some(f) if t.n >= self.gemm_from(Gemm::F32) => Path::F32Copy(f),
            _ => half(&self.weight).map_or(Path::Quantized, Path::Half),
        }
    }

    /// The largest decode batch multiplied on the quantized path before `forward`
    /// switches to a GEMM (a step's cost jumps there); `None` when it never
    /// switches (f32 weights).
    pub fn small_batch_max_rows(&self) -> Option<usize> {
        if matches!(self.weight, WeightData::F32(_)) {
            return None;
        }
        let gemm = match (&self.int8, &self.f32) {
            (Some(_), _) => Gemm::Int8,
            (None, Some(_)) => Gemm::F32,
            (None, None) => return None,
        };
        Some(self.gemm_from(gemm) - 1)
    }

    /// `x` is `[t.n, k]`, `out` is `[t.n, n_out]`.
    pub fn forward(&self, x: &[f32], t: Tokens, out: &mut [f32]) {
        let (m, k, n) = (t.n, self.k, self.n_out);
        match self.path(t) {
            Path::F32Weights(w) => gemm_f32(x, w, m, k, n, out),
            Path::Int8(p, isa) => int8_gemm::matmul(p, isa, x, m, out),
            Path::F32Copy(f) => f.matmul(x, m, k, n, out),
            Path::Half(w) => half_rows::matmul(w, n, k, x, m, out),
            Path::Quantized => self.weight.matmul(x, m, k, n, out),
        }
        if let Some(b) = &self.bias {
            for row in out[..m * n].chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{has_avx2, has_avx512_vnni, test_data};
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_1, BlockQ6K, BlockQ8_0, GgmlType};

    fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&test_data(n * k, 5), &mut w);
        w
    }

    fn q4_1(precision: Precision) -> Linear {
        let (n, k) = (24, 256);
        let w = WeightData::Q4_1(quantized::<BlockQ4_1>(n, k));
        Linear::new(w, n, k, None, precision)
    }

    /// Where decode batches leave the quantized path, on this CPU: with AVX2 every
    /// batch of a type the 8-bit panels hold is a GEMM; Q6_K (two scales per 32
    /// weights) takes dot products below `GEMM_MIN_ROWS`.
    #[test]
    fn the_reported_switch_follows_the_cpu() {
        let (n, k) = (24, 256);
        let fast = |w| Linear::new(w, n, k, None, Precision::Fast);
        let int8 = if has_avx2() { 0 } else { GEMM_MIN_ROWS - 1 };
        assert_eq!(q4_1(Precision::Exact).small_batch_max_rows(), None);
        for p in [Precision::Fast, Precision::Int8] {
            assert_eq!(q4_1(p).small_batch_max_rows(), Some(int8), "{p:?}");
        }
        let q4k = fast(WeightData::Q4K(quantized::<BlockQ4K>(n, k)));
        let q8_0 = fast(WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)));
        let q6k = fast(WeightData::Q6K(quantized::<BlockQ6K>(n, k)));
        assert_eq!(q4k.small_batch_max_rows(), Some(int8));
        assert_eq!(q8_0.small_batch_max_rows(), Some(int8));
        assert_eq!(q6k.small_batch_max_rows(), Some(GEMM_MIN_ROWS - 1));
        let best = crate::kernels::int8_gemm::Isa::best();
        if std::env::var_os("SLOSERVE_DENSE").is_none() {
            assert_eq!(q8_0.int8.as_ref().map(|(_, isa)| *isa), best);
        }
        assert_eq!(best.is_some(), has_avx2());
        if has_avx512_vnni() {
            assert_eq!(best, Some(Isa::Avx512Vnni));
        }
        assert_eq!(first_switch(Some(16), Some(2)), Some(2));
        assert_eq!(first_switch(None, Some(16)), Some(16));
    }

    /// f16 weights: few rows on the half-precision kernel, more on the f32 GEMM;
    /// both are f32 products of the same weights.
    #[test]
    fn half_weights_take_the_rows_kernel_then_the_gemm() {
        let (n, k) = (24, 256);
        let w: Vec<half::f16> = test_data(n * k, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let fast = Linear::new(WeightData::F16(w.clone()), n, k, None, Precision::Fast);
        let exact = Linear::new(WeightData::F16(w), n, k, None, Precision::Exact);
        let expected = if has_avx2() {
            Some(HALF_MAX_ROWS)
        } else {
            None
        };
        assert_eq!(fast.small_batch_max_rows(), expected);
        assert_eq!(exact.small_batch_max_rows(), None);
        let x = test_data(24 * k, 2);
        for m in [1, 2, 5, HALF_MAX_ROWS, HALF_MAX_ROWS + 1, 24] {
            let t = Tokens {
                n: m,
                prompt: false,
            };
            let on_half = matches!(fast.path(t), Path::Half(_));
            assert_eq!(on_half, has_avx2() && m <= HALF_MAX_ROWS, "{m} rows");
            let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
            fast.forward(&x[..m * k], t, &mut a);
            exact.forward(&x[..m * k], t, &mut b);
            for (a, b) in a.iter().zip(&b) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m} rows: {a} vs {b}"
                );
            }
        }
    }

    /// Each batch size, decode or prompt, gives the same product on whichever path
    /// it takes; fast precision's prompts are f32 products once they take a GEMM.
    #[test]
    fn every_batch_size_agrees_across_the_path_switches() {
        let (n, k) = (24, 256);
        let exact = q4_1(Precision::Exact);
        let x = test_data(40 * k, 9);
        for precision in [Precision::Fast, Precision::Int8] {
            let l = q4_1(precision);
            let f32_from = l.f32.as_ref().map(|_| l.gemm_from(Gemm::F32));
            for m in [1, 2, 3, 4, 5, 12, 16, 17, 20, 40] {
                for prompt in [false, true] {
                    let t = Tokens { n: m, prompt };
                    let (mut fast, mut reference) = (vec![0f32; m * n], vec![0f32; m * n]);
                    l.forward(&x[..m * k], t, &mut fast);
                    exact.forward(&x[..m * k], t, &mut reference);
                    let f32_products =
                        precision == Precision::Fast && prompt && f32_from.is_some_and(|f| m >= f);
                    // 8-bit activations: each of the 256 products off by at most
                    // |w| * amax / 254 (typically ~0.03 in all); f32 products agree
                    // up to summation order.
                    let tol = if f32_products { 1e-4 } else { 0.1 };
                    for (a, b) in fast.iter().zip(&reference) {
                        assert!((a - b).abs() <= tol, "{precision:?} {t:?}: {a} vs {b}");
                    }
                }
            }
        }
    }
}
