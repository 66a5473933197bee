//! `Linear` (y = x·Wᵀ + b): each weight matrix held in exactly one form, and the one
//! kernel each form multiplies with at every batch size, so a row's arithmetic never
//! depends on what else shares its step (batch-invariant):
//! - quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K..Q6_K), AVX2:
//!   the 8-bit panels replace the file's blocks and the 8-bit GEMM multiplies decode
//!   rows and prompts alike (llama.cpp's arithmetic: activations rounded to 8 bits a
//!   block); without AVX2, the file's blocks and 8-bit dot products;
//! - f16/bf16 (fast precision, AVX2): the 2-byte weights for up to `HALF_MAX_ROWS`
//!   rows, a packed f32 copy for larger batches (the one form with two copies);
//! - f32 weights: f32 packed for our AVX2 GEMM (every output summed in the same
//!   order whatever the batch), every product in f32;
//! - exact precision, quantized and f16/bf16 types (AVX2): the file's blocks, held
//!   once; the same f32 GEMM dequantizes each 16-output x 256 slice into a per-task
//!   buffer laid out as the packed panels and multiplies it there, so the products
//!   are bit for bit those of a packed f32 copy (what exact precision held before,
//!   4 bytes a weight), and still match llama.cpp's F32 reference.
//!
//! Without AVX2, f16/bf16 and exact precision's weights are f32 row-major for the
//! `gemm` crate (4 bytes a weight: there is no packed GEMM to dequantize into).
//!
//! The switch points are measured (see `HALF_MAX_ROWS`) and decided here only.

use candle_core::quantized::GgmlDType;

use crate::kernels::gemm_f32::gemm_f32;
use crate::kernels::half_rows::{self, HalfWeights};
use crate::kernels::int8_gemm::{self, Isa};
use crate::kernels::int8_panels::{Int8Panels, Packing};
use crate::kernels::packed_gemm::{self, PackedMatrix, RowBlocks};
use crate::weights::{Precision, WeightData};

/// f16/bf16 weights (fast precision, AVX2): batches up to this many rows
/// run on `half_rows`, which reads the 2-byte weights once for them all, larger ones
/// on the packed f32 GEMM (4-byte weights, compute-bound). Measured on the default
/// model `--quantize f16` (forward bench `--only decode_bN`, 2 threads, stop 13),
/// tok/s rows kernel vs GEMM: b4 173 vs 119, b8 254 vs 195, b12 268 vs 245, b16 274
/// vs 268, b32 251 vs 355. (Before it, f16 weights were held as f32 and multiplied
/// by the `gemm` crate at every batch size: b1 22, b8 96, b32 232.)
pub const HALF_MAX_ROWS: usize = 12;

/// The rows one product multiplies: how many, and whether they include a prompt's
/// (a sequence with more than one new token).
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

/// f32 weights: packed for our batch-invariant AVX2 GEMM, or row-major for the
/// `gemm` crate (CPUs without AVX2).
enum F32Matrix {
    Packed(PackedMatrix),
    RowMajor(Vec<f32>),
}

impl F32Matrix {
    fn new(w: Vec<f32>, n: usize, k: usize) -> Self {
        if crate::kernels::cpu::has_avx2() {
            F32Matrix::Packed(PackedMatrix::pack(&w, n, k))
        } else {
            F32Matrix::RowMajor(w)
        }
    }

    fn bytes(&self) -> usize {
        match self {
            F32Matrix::Packed(p) => p.held_bytes(),
            F32Matrix::RowMajor(w) => w.len() * 4,
        }
    }

    fn row(&self, r: usize, out: &mut [f32]) {
        match self {
            F32Matrix::Packed(p) => p.row(r, out),
            F32Matrix::RowMajor(w) => out.copy_from_slice(&w[r * out.len()..][..out.len()]),
        }
    }

    fn matmul(&self, x: &[f32], m: usize, k: usize, n: usize, out: &mut [f32]) {
        match self {
            F32Matrix::Packed(w) => w.matmul(x, m, out),
            F32Matrix::RowMajor(w) => gemm_f32(x, w, m, k, n, out),
        }
    }
}

/// The one form a matrix is held in.
enum Form {
    /// f32 weights: the file's, or exact precision's.
    F32(F32Matrix),
    /// The 8-bit panels, in place of the file's blocks.
    Panels(Int8Panels, Isa),
    /// The file's quantized blocks (no AVX2, `SLOSERVE_DENSE=f32`, or a K-quant
    /// whose rows are not whole super-blocks).
    Quantized(WeightData),
    /// f16/bf16 weights, and their f32 copy packed for the GEMM.
    Half(WeightData, PackedMatrix),
    /// Exact precision (AVX2): the file's quantized or f16/bf16 blocks, dequantized
    /// a panel's K block at a time inside the f32 GEMM.
    Blocks(WeightData),
}

/// The rows of a `[n, k]` matrix of the file's blocks, dequantized a K block at a
/// time (exact precision's GEMM).
struct BlockRows<'w> {
    w: &'w WeightData,
    k: usize,
}

impl RowBlocks for BlockRows<'_> {
    fn row_block(&self, r: usize, k0: usize, out: &mut [f32]) {
        self.w.dequantize_cols(r, self.k, k0, out);
    }
}

/// What the bytes of a loaded model are held as (`sloserve inspect`, the load log).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldBytes {
    pub panels: usize,
    pub quantized: usize,
    pub half: usize,
    pub f32: usize,
}

impl HeldBytes {
    pub fn total(&self) -> usize {
        self.panels + self.quantized + self.half + self.f32
    }

    pub fn add(&mut self, o: HeldBytes) {
        self.panels += o.panels;
        self.quantized += o.quantized;
        self.half += o.half;
        self.f32 += o.f32;
    }
}

/// A linear layer `y = x·Wᵀ (+ b)` with W of shape `[n_out, k]`.
pub struct Linear {
    form: Form,
    pub n_out: usize,
    pub k: usize,
    pub bias: Option<Vec<f32>>,
}

/// The 8-bit panels, 4-bit values packed as nibbles (on both instruction sets they
/// beat one byte each, prompts included: AVX2 int8 prefill 803-830 vs 762 tok/s,
/// stop 14), and with AVX-512 5- and 6-bit values as nibbles and high planes
/// (`Packing::Planes`). `SLOSERVE_DENSE` (comma-separated) is for A/B measurements of
/// the other paths: `u8` leaves values one byte each, `planes` keeps 5- and 6-bit values
/// as nibbles and high planes on AVX2 too, `f32` leaves out the panels
/// (8-bit dot products instead); the AVX2 route on a CPU with AVX-512 is
/// `SLOSERVE_ISA=avx2` (`kernels::cpu::IsaCap`, which also reads `avx2` here). Whether `precision` holds a `dtype` matrix as the 8-bit panels: their
/// instruction set and packing. `None` for exact precision, float types, or where
/// the panels are left out (`SLOSERVE_DENSE=f32`, or no AVX2).
fn panels_for(dtype: GgmlDType, precision: Precision) -> Option<(Isa, Packing)> {
    let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    if precision == Precision::Exact || float {
        return None;
    }
    let choice = std::env::var("SLOSERVE_DENSE").unwrap_or_default();
    let choices: Vec<&str> = choice.split(',').collect();
    if choices.contains(&"f32") {
        return None;
    }
    let isa = Isa::best()?;
    let packing = match (choices.contains(&"u8"), choices.contains(&"planes")) {
        (true, _) => Packing::Bytes,
        (false, true) => Packing::Planes,
        (false, false) => isa.packing(),
    };
    Some((isa, packing))
}

fn half(w: &WeightData) -> Option<HalfWeights<'_>> {
    match w {
        WeightData::F16(w) => Some(HalfWeights::F16(w)),
        WeightData::BF16(w) => Some(HalfWeights::BF16(w)),
        _ => None,
    }
}

impl Linear {
    /// Takes `weight` (the file's blocks) and keeps it in the one form `precision`
    /// multiplies with; blocks that are repacked are dropped here.
    pub fn new(
        weight: WeightData,
        n_out: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        precision: Precision,
    ) -> Self {
        let form = Self::form(weight, n_out, k, precision);
        Linear {
            form,
            n_out,
            k,
            bias,
        }
    }

    /// `new` for a quantized matrix the 8-bit panels will hold, built from its rows
    /// as `read(rows, buf)` puts their blocks in `buf`, a `chunk` of rows at a time: the whole
    /// matrix's blocks are never held beside its panels (a load's peak memory: Qwen2.5
    /// 1.5B's tied 191 MB output matrix). `Ok(None)` where `new` would choose another
    /// form (or the rows' scales need the whole matrix): read it whole for `new`.
    /// No bias: set `bias` after.
    pub fn from_rows<E>(
        dtype: GgmlDType,
        (n_out, k): (usize, usize),
        precision: Precision,
        chunk: usize,
        read: impl FnMut(std::ops::Range<usize>, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Option<Self>, E> {
        let Some((isa, packing)) = panels_for(dtype, precision) else {
            return Ok(None);
        };
        let Some(p) = Int8Panels::pack_chunks(dtype, (n_out, k), packing, chunk, read)? else {
            return Ok(None);
        };
        Ok(Some(Linear {
            form: Form::Panels(p, isa),
            n_out,
            k,
            bias: None,
        }))
    }

    fn form(weight: WeightData, n: usize, k: usize, precision: Precision) -> Form {
        if let WeightData::F32(w) = weight {
            return Form::F32(F32Matrix::new(w, n, k));
        }
        if precision == Precision::Exact {
            if crate::kernels::cpu::has_avx2() {
                return Form::Blocks(weight);
            }
            // Without AVX2: f32 row-major for the `gemm` crate (4 bytes a weight).
            return Form::F32(F32Matrix::new(weight.to_f32(), n, k));
        }
        if half(&weight).is_some() {
            if !crate::kernels::cpu::has_avx2() {
                // Without AVX2 the f32 GEMM is as fast at every batch size.
                return Form::F32(F32Matrix::new(weight.to_f32(), n, k));
            }
            let packed = PackedMatrix::pack(&weight.to_f32(), n, k);
            return Form::Half(weight, packed);
        }
        let panels = panels_for(weight.dtype(), precision)
            .and_then(|(isa, packing)| Some((Int8Panels::pack_as(&weight, n, k, packing)?, isa)));
        match panels {
            Some((p, isa)) => Form::Panels(p, isa),
            None => Form::Quantized(weight),
        }
    }

    /// The bytes this layer's weights are held in, by form.
    pub fn held_bytes(&self) -> HeldBytes {
        let mut h = HeldBytes::default();
        match &self.form {
            Form::F32(w) => h.f32 = w.bytes(),
            Form::Panels(p, _) => h.panels = p.held_bytes(),
            Form::Quantized(w) => h.quantized = w.as_bytes().len(),
            Form::Half(w, packed) => {
                h.half = w.as_bytes().len();
                h.f32 = packed.held_bytes();
            }
            Form::Blocks(w) if half(w).is_some() => h.half = w.as_bytes().len(),
            Form::Blocks(w) => h.quantized = w.as_bytes().len(),
        }
        h.f32 += self.bias.as_ref().map_or(0, |b| b.len() * 4);
        h
    }

    /// Row `r` of W (`k` values) as f32: an embedding row, when the token
    /// embedding is this matrix (tied output).
    pub fn weight_row(&self, r: usize, out: &mut [f32]) {
        let out = &mut out[..self.k];
        match &self.form {
            Form::F32(w) => w.row(r, out),
            Form::Panels(p, _) => p.row_f32(r, out),
            Form::Quantized(w) | Form::Half(w, _) | Form::Blocks(w) => {
                w.dequantize_rows(r, self.k, out)
            }
        }
    }

    /// The 8-bit panels this layer is held as, and the instruction set that
    /// multiplies them; `None` in the other forms.
    pub fn panels(&self) -> Option<(&Int8Panels, Isa)> {
        match &self.form {
            Form::Panels(p, isa) => Some((p, *isa)),
            _ => None,
        }
    }

    /// The largest decode batch multiplied on a small-batch kernel before `forward`
    /// switches to a GEMM (a step's cost jumps there); `None` when it never
    /// switches.
    pub fn small_batch_max_rows(&self) -> Option<usize> {
        match self.form {
            Form::Half(..) => Some(HALF_MAX_ROWS),
            _ => None,
        }
    }

    /// `x` is `[t.n, k]`, `out` is `[t.n, n_out]`.
    pub fn forward(&self, x: &[f32], t: Tokens, out: &mut [f32]) {
        let (m, k, n) = (t.n, self.k, self.n_out);
        match &self.form {
            Form::F32(w) => w.matmul(x, m, k, n, out),
            Form::Panels(p, isa) => int8_gemm::matmul(p, *isa, x, m, out),
            Form::Quantized(w) => w.matmul(x, m, k, n, out),
            Form::Half(w, _) if m <= HALF_MAX_ROWS => {
                half_rows::matmul(half(w).expect("half weights"), n, k, x, m, out)
            }
            Form::Half(_, packed) => packed.matmul(x, m, out),
            Form::Blocks(w) => packed_gemm::matmul_rows(&BlockRows { w, k }, n, k, x, m, out),
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
    use crate::kernels::cpu::{has_avx2, test_data};
    use candle_core::quantized::k_quants::{
        BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ6K,
        BlockQ8_0, GgmlType,
    };
    use candle_core::quantized::GgmlDType;

    const N: usize = 24;
    const K: usize = 256;

    fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
        let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
        T::from_float(&test_data(n * k, 5), &mut w);
        w
    }

    fn types() -> Vec<WeightData> {
        vec![
            WeightData::Q4_1(quantized::<BlockQ4_1>(N, K)),
            WeightData::Q4K(quantized::<BlockQ4K>(N, K)),
            WeightData::Q8_0(quantized::<BlockQ8_0>(N, K)),
            WeightData::Q6K(quantized::<BlockQ6K>(N, K)),
            WeightData::Q3K(quantized::<BlockQ3K>(N, K)),
            WeightData::Q2K(quantized::<BlockQ2K>(N, K)),
        ]
    }

    /// Quantized weights are held once: the panels' types as panels, the others as
    /// the file's blocks; exact precision holds the file's blocks (f32 row-major
    /// only without AVX2).
    #[test]
    fn each_matrix_is_held_in_one_form() {
        for w in types() {
            let dtype = w.dtype();
            let file = w.as_bytes().len();
            let fast = Linear::new(w.clone(), N, K, None, Precision::Fast).held_bytes();
            let exact = Linear::new(w, N, K, None, Precision::Exact).held_bytes();
            assert_eq!(fast.f32 + fast.half, 0, "{dtype:?}: {fast:?}");
            assert_eq!(fast.panels > 0, has_avx2(), "{dtype:?}: {fast:?}");
            assert_eq!(
                fast.quantized,
                if has_avx2() { 0 } else { file },
                "{dtype:?}"
            );
            // Panels (whole panels of 16 rows): at most 1.35x the file's bytes a
            // weight (Q6_K, one byte a value: 1.08 against 0.82; Q3_K, a nibble a
            // value: 0.58 against 0.43), Q2_K 2x (0.64 against 0.33).
            let padded = file * N.div_ceil(16) * 16 / N;
            let (num, den) = if dtype == GgmlDType::Q2K {
                (2, 1)
            } else {
                (27, 20)
            };
            assert!(
                fast.total() * den <= padded * num,
                "{dtype:?}: {fast:?} vs {file}"
            );
            if has_avx2() {
                assert_eq!(exact.total(), file, "{dtype:?}: {exact:?}");
                assert_eq!((exact.f32, exact.quantized), (0, file), "{dtype:?}");
            } else {
                assert_eq!((exact.f32, exact.total()), (N * K * 4, N * K * 4));
            }
        }
    }

    /// Every type exact precision multiplies from the file's blocks, at `[n, k]`
    /// (K-quants only where k is whole 256-blocks).
    fn exact_types(n: usize, k: usize) -> Vec<WeightData> {
        let mut v = vec![
            WeightData::Q4_0(quantized::<BlockQ4_0>(n, k)),
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            WeightData::Q5_0(quantized::<BlockQ5_0>(n, k)),
            WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)),
            WeightData::F16(
                test_data(n * k, 6)
                    .iter()
                    .map(|&v| half::f16::from_f32(v))
                    .collect(),
            ),
            WeightData::BF16(
                test_data(n * k, 8)
                    .iter()
                    .map(|&v| half::bf16::from_f32(v))
                    .collect(),
            ),
        ];
        if k.is_multiple_of(256) {
            v.push(WeightData::Q4K(quantized::<BlockQ4K>(n, k)));
            v.push(WeightData::Q5K(quantized::<BlockQ5K>(n, k)));
            v.push(WeightData::Q6K(quantized::<BlockQ6K>(n, k)));
        }
        v
    }

    /// Exact precision's product from the file's blocks (dequantized a slice at a
    /// time inside the GEMM) is, bit for bit, the packed f32 copy's, at every batch
    /// size, K past a block (896: 3.5 blocks) and outputs past a panel (40: 2.5).
    #[test]
    fn exact_blocks_multiply_as_the_packed_f32_copy() {
        if !crate::kernels::isa_ledger::route(
            "exact_blocks",
            crate::kernels::isa_ledger::TestIsa::Avx2,
        ) {
            return;
        }
        let n = 40;
        for k in [256, 896, 1536] {
            let x = test_data(100 * k, 3);
            for w in exact_types(n, k) {
                let dtype = w.dtype();
                let packed = PackedMatrix::pack(&w.to_f32(), n, k);
                let l = Linear::new(w, n, k, None, Precision::Exact);
                assert!(matches!(l.form, Form::Blocks(_)), "{dtype:?}");
                for m in [1, 2, 5, 7, 17, 40, 100] {
                    let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                    let t = Tokens {
                        n: m,
                        prompt: m > 1,
                    };
                    l.forward(&x[..m * k], t, &mut a);
                    packed.matmul(&x[..m * k], m, &mut b);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{dtype:?} m {m} k {k}");
                }
            }
        }
    }

    /// Whichever form, row `r` of the weights reads back as the file's values.
    #[test]
    fn weight_rows_read_back_as_the_files() {
        for w in types() {
            let f = w.to_f32();
            for precision in [Precision::Fast, Precision::Exact] {
                let l = Linear::new(w.clone(), N, K, None, precision);
                let mut row = vec![0f32; K];
                for r in [0, 7, N - 1] {
                    l.weight_row(r, &mut row);
                    assert_eq!(row, f[r * K..(r + 1) * K], "{:?} {precision:?}", w.dtype());
                }
            }
        }
    }

    /// No layer switches kernels with the batch, except f16/bf16 weights on AVX2.
    #[test]
    fn the_reported_switch_follows_the_form() {
        for w in types() {
            for p in [Precision::Fast, Precision::Exact] {
                let l = Linear::new(w.clone(), N, K, None, p);
                assert_eq!(l.small_batch_max_rows(), None, "{:?} {p:?}", w.dtype());
            }
        }
        let f16: Vec<half::f16> = test_data(N * K, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let l = Linear::new(WeightData::F16(f16), N, K, None, Precision::Fast);
        let expected = has_avx2().then_some(HALF_MAX_ROWS);
        assert_eq!(l.small_batch_max_rows(), expected);
        assert_eq!(first_switch(Some(16), Some(2)), Some(2));
        assert_eq!(first_switch(None, Some(16)), Some(16));
    }

    /// f16 weights: few rows on the half-precision kernel, more on the f32 GEMM;
    /// both are f32 products of the same weights.
    #[test]
    fn half_weights_take_the_rows_kernel_then_the_gemm() {
        let w: Vec<half::f16> = test_data(N * K, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let fast = Linear::new(WeightData::F16(w.clone()), N, K, None, Precision::Fast);
        let exact = Linear::new(WeightData::F16(w), N, K, None, Precision::Exact);
        let x = test_data(24 * K, 2);
        for m in [1, 2, 5, HALF_MAX_ROWS, HALF_MAX_ROWS + 1, 24] {
            let t = Tokens {
                n: m,
                prompt: false,
            };
            let (mut a, mut b) = (vec![0f32; m * N], vec![0f32; m * N]);
            fast.forward(&x[..m * K], t, &mut a);
            exact.forward(&x[..m * K], t, &mut b);
            for (a, b) in a.iter().zip(&b) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m} rows: {a} vs {b}"
                );
            }
        }
    }

    /// A row's product is the same, bit for bit, whatever batch it is in, decode or
    /// prompt, in both precisions; fast precision's is within the 8-bit rounding of
    /// the exact one.
    #[test]
    fn rows_are_batch_invariant_in_every_precision() {
        let x = test_data(40 * K, 9);
        for w in types() {
            let exact = Linear::new(w.clone(), N, K, None, Precision::Exact);
            let fast = Linear::new(w.clone(), N, K, None, Precision::Fast);
            let one = |l: &Linear, r: usize| {
                let mut o = vec![0f32; N];
                let t = Tokens {
                    n: 1,
                    prompt: false,
                };
                l.forward(&x[r * K..(r + 1) * K], t, &mut o);
                o
            };
            for m in [2, 3, 5, 17, 40] {
                for prompt in [false, true] {
                    let t = Tokens { n: m, prompt };
                    for l in [&exact, &fast] {
                        let mut all = vec![0f32; m * N];
                        l.forward(&x[..m * K], t, &mut all);
                        for r in [0, m / 2, m - 1] {
                            assert_eq!(one(l, r), all[r * N..(r + 1) * N], "{:?} {t:?}", w.dtype());
                        }
                    }
                }
            }
            for r in 0..40 {
                // 8-bit activations: each of the 256 products off by at most
                // |w| * amax / 254 (typically ~0.03 in all).
                for (a, b) in one(&fast, r).iter().zip(one(&exact, r)) {
                    assert!((a - b).abs() <= 0.1, "{:?} row {r}: {a} vs {b}", w.dtype());
                }
            }
        }
    }
}
