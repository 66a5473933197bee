//! `Linear` (y = x·Wᵀ + b) and which kernel multiplies each batch: the repacked
//! decode kernels (or, for f16/bf16 weights, the half-precision rows kernel) for a
//! few rows, the 8-bit GEMM for larger decode batches (and for
//! prompts in int8 precision), the f32 GEMM for prompts in fast precision and for
//! types the 8-bit GEMM cannot hold. The switch points are measured (see
//! `Repacked::max_rows`, `Gemm::min_rows`) and decided here only.

use crate::kernels::gemm_f32::gemm_f32;
use crate::kernels::half_rows::{self, HalfWeights};
use crate::kernels::int8_gemm::{self, Isa};
use crate::kernels::int8_panels::Int8Panels;
use crate::kernels::packed_gemm::PackedMatrix;
use crate::kernels::q4_1_rows::Q4_1Rows;
use crate::kernels::q8_0_rows::Q8_0Rows;
use crate::weights::{Precision, WeightData};

/// Without repacked decode kernels, batches with at least this many rows run as a
/// GEMM (compute-bound); smaller ones as quantized dot products (memory-bound: one
/// or two decoding sequences). Measured with the forward bench for the f32 GEMM: at
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
    /// On this instruction set.
    Int8(Isa),
    F32,
}

impl Gemm {
    /// The fewest rows worth this GEMM without a repacked kernel. AVX-512 VNNI's
    /// 8-bit GEMM reads no more than the decode kernels and needs no horizontal
    /// sums: from one row, for every type it holds. Measured at batch 1 (forward
    /// bench `--only decode_b1`, 2 threads, median of 7), the GEMM vs the repacked
    /// Q8_0 kernel and the 8-bit dot products of other types: stop 13 (Intel Xeon,
    /// full-width AVX-512), default model (Q8_0 output) 192-218 vs 169-174 tok/s,
    /// `--quantize q8_0` 144-146 vs 87-90, Gemma 3 (Q8_0, Q5_0) 69-70 vs 38-39;
    /// stop 12 (Zen 4) 8-bit values within 10% of the decode kernel. The others
    /// from `GEMM_MIN_ROWS`.
    fn min_rows(self) -> usize {
        match self {
            Gemm::Int8(Isa::Avx512Vnni) => 1,
            _ => GEMM_MIN_ROWS,
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

/// Quantized weights repacked for the decode kernels.
enum Repacked {
    Q4_1(Q4_1Rows),
    Q8_0(Q8_0Rows),
}

impl Repacked {
    /// Batches up to this many rows run on the repacked kernel rather than `gemm`.
    /// The repacked kernels read the quantized bytes once for all rows (memory-bound
    /// at a few rows) where the f32 GEMM reads 4-byte weights, so they win well past
    /// `GEMM_MIN_ROWS`; the 8-bit GEMM reads 1.25 bytes and wins much sooner.
    /// Measured on the default model's shapes (forward bench `--only decode_bN`, 2
    /// threads), tok/s repacked kernel vs GEMM:
    /// - f32 (stop 11): Q4_1 b4 295 vs 146, b16 316 vs 290, b20 314 vs 320, b24 262
    ///   vs 335; Q8_0 b8 265 vs 200, b12 277 vs 256, b16 284 vs 300;
    /// - 8-bit, AVX2 (stop 12): Q4_1 b2 251-265 vs 168-171, b4 197-286 vs 244-260,
    ///   b6 213-304 vs 262-318, b8 218-302 vs 361-365;
    /// - 8-bit, AVX-512 VNNI: none (see `Gemm::min_rows`; `Linear::new` does not
    ///   repack then).
    fn max_rows(&self, gemm: Gemm) -> usize {
        match (self, gemm) {
            (_, Gemm::Int8(Isa::Avx512Vnni)) => 0,
            (Repacked::Q4_1(_), Gemm::Int8(Isa::Avx2)) => 4,
            (Repacked::Q8_0(_), Gemm::Int8(Isa::Avx2)) => 12,
            (Repacked::Q4_1(_), Gemm::F32) => 16,
            (Repacked::Q8_0(_), Gemm::F32) => 12,
        }
    }

    fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        match self {
            Repacked::Q4_1(r) => r.matmul(x, m, out),
            Repacked::Q8_0(r) => r.matmul(x, m, out),
        }
    }
}

/// Where one batch is multiplied.
enum Path<'a> {
    F32Weights(&'a [f32]),
    Int8(&'a Int8Panels, Isa),
    F32Copy(&'a F32Copy),
    Repacked(&'a Repacked),
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
    /// Q4_1 or Q8_0 weights repacked for a few rows (AVX2).
    repacked: Option<Repacked>,
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

/// The 8-bit panels, 4-bit values kept packed with AVX-512 VNNI.
/// `SLOSERVE_DENSE=f32` leaves out the 8-bit GEMM, `=avx2` takes its AVX2 kernel
/// on a CPU with AVX-512 and `=u8` leaves 4-bit values unpacked: A/B measurements
/// of the other paths.
fn int8_panels(w: &WeightData, n: usize, k: usize) -> Option<(Int8Panels, Isa)> {
    let choice = std::env::var("SLOSERVE_DENSE").unwrap_or_default();
    if choice == "f32" {
        return None;
    }
    let mut p = Int8Panels::pack(w, n, k)?;
    let isa = match choice.as_str() {
        "avx2" => Some(Isa::Avx2).filter(|i| i.available(p.qmax)),
        _ => Isa::best_for(p.qmax),
    }?;
    if isa == Isa::Avx512Vnni && choice != "u8" {
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
            repacked: None,
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
        let vnni = matches!(linear.int8, Some((_, Isa::Avx512Vnni)));
        if avx2 && !vnni {
            linear.repacked = match w {
                WeightData::Q4_1(b) => Some(Repacked::Q4_1(Q4_1Rows::pack(b, n_out, k))),
                WeightData::Q8_0(b) => Some(Repacked::Q8_0(Q8_0Rows::pack(b, n_out, k))),
                _ => None,
            };
        }
        if !linear.prompt_int8 || linear.int8.is_none() {
            linear.f32 = Some(F32Copy::new(w, n_out, k));
        }
        linear
    }

    /// The fewest rows that `gemm` multiplies (fewer: the repacked kernel, the
    /// half-precision rows kernel, or the quantized dot products).
    fn gemm_from(&self, gemm: Gemm) -> usize {
        let small_end = match (&self.repacked, half(&self.weight)) {
            (Some(r), _) => r.max_rows(gemm) + 1,
            (None, Some(_)) => HALF_MAX_ROWS + 1,
            (None, None) => 0,
        };
        small_end.max(gemm.min_rows())
    }

    fn path(&self, t: Tokens) -> Path<'_> {
        if let WeightData::F32(w) = &self.weight {
            return Path::F32Weights(w);
        }
        if let Some((p, isa)) = &self.int8 {
            let gemm = Gemm::Int8(*isa);
            if (!t.prompt || self.prompt_int8) && t.n >= self.gemm_from(gemm) {
                return Path::Int8(p, *isa);
            }
        }
        match (&self.f32, &self.repacked) {
            (Some(f), _) if t.n >= self.gemm_from(Gemm::F32) => Path::F32Copy(f),
            (_, Some(r)) => Path::Repacked(r),
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
            (Some((_, isa)), _) => Gemm::Int8(*isa),
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
            Path::Repacked(r) => r.matmul(x, m, out),
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
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_1, BlockQ8_0, GgmlType};

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

    /// Where decode batches leave the quantized path, on this CPU.
    #[test]
    fn the_reported_switch_follows_the_cpu() {
        let (n, k) = (24, 256);
        let q4k = Linear::new(
            WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
            n,
            k,
            None,
            Precision::Fast,
        );
        let (vnni, avx2) = (has_avx512_vnni(), has_avx2());
        assert_eq!(q4_1(Precision::Exact).small_batch_max_rows(), None);
        // With AVX-512 VNNI every batch of a type the panels hold is a GEMM.
        let no_repacked = if vnni { 0 } else { GEMM_MIN_ROWS - 1 };
        assert_eq!(q4k.small_batch_max_rows(), Some(no_repacked));
        let q8_0 = Linear::new(
            WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)),
            n,
            k,
            None,
            Precision::Fast,
        );
        let q8_expected = match (vnni, avx2) {
            (true, _) => 0,
            (false, true) => 12,
            (false, false) => GEMM_MIN_ROWS - 1,
        };
        assert_eq!(q8_0.small_batch_max_rows(), Some(q8_expected));
        assert_eq!(q8_0.repacked.is_some(), avx2 && !vnni);
        let expected = match (vnni, avx2) {
            (true, _) => 0,
            (false, true) => 4,
            (false, false) => GEMM_MIN_ROWS - 1,
        };
        for p in [Precision::Fast, Precision::Int8] {
            assert_eq!(q4_1(p).small_batch_max_rows(), Some(expected), "{p:?}");
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
