//! The 8-bit GEMM against the product of the rounded activations, and its rows'
//! independence of the batch, on every instruction set this CPU has.

use super::*;
use crate::kernels::block_scales::random_blocks;
use crate::kernels::cpu::test_data;
use crate::kernels::isa_ledger::{route, TestIsa};
use crate::weights::WeightData;

/// The routes this CPU runs, each recorded in the ISA ledger (ran or skipped).
fn tested_isas(test: &str) -> Vec<Isa> {
    [
        (Isa::Avx512Vnni, TestIsa::Avx512Vnni),
        (Isa::Avx2, TestIsa::Avx2),
    ]
    .into_iter()
    .filter(|&(_, t)| route(test, t))
    .map(|(isa, _)| isa)
    .collect()
}
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use candle_core::quantized::GgmlDType;

fn quantized<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
    let x: Vec<f32> = test_data(n * k, 13).iter().map(|v| v * 2.0).collect();
    let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
    T::from_float(&x, &mut w);
    w
}

/// `x · Wᵀ` with x rounded as the GEMM rounds it (8 bits per block), in f64:
/// what the GEMM must equal up to f32 summation.
fn reference(w: &WeightData, x: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let wf = w.to_f32();
    let mut acts = QuantActs::default();
    acts.quantize(x, k);
    let xq: Vec<f64> = (0..m * k)
        .map(|i| {
            let b = acts.at(i / k, i % k / 32);
            acts.qs[b].0[i % 32] as f64 * acts.d[b] as f64
        })
        .collect();
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            out[r * n + c] = (0..k)
                .map(|i| xq[r * k + i] * wf[c * k + i] as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}

fn check(isa: Isa, packing: Packing, w: &WeightData, m: usize, k: usize, n: usize) {
    let mut panels = Int8Panels::pack(w, n, k).unwrap();
    if packing != Packing::Bytes && !panels.repack(packing) {
        return;
    }
    let x: Vec<f32> = test_data(m * k, 5).iter().map(|v| v * 1.7).collect();
    let mut out = vec![f32::NAN; m * n];
    matmul(&panels, isa, &x, m, &mut out);
    for (i, (a, b)) in out.iter().zip(reference(w, &x, m, k, n)).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{isa:?} {packing:?} {:?} {m}x{k}x{n} at {i}: {a} vs {b}",
            w.dtype()
        );
    }
}

/// Each type, on each instruction set the CPU has, on ragged shapes (a partial
/// tile, a partial panel, several row chunks).
#[test]
fn equals_the_product_of_the_rounded_activations() {
    let isas = tested_isas("int8_gemm");
    for (m, k, n) in [(1, 256, 5), (7, 512, 33), (70, 256, 16), (130, 768, 40)] {
        let types = [
            WeightData::Q4_0(quantized::<BlockQ4_0>(n, k)),
            WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
            WeightData::Q5_0(quantized::<BlockQ5_0>(n, k)),
            WeightData::Q5_1(quantized::<BlockQ5_1>(n, k)),
            WeightData::Q5K(quantized::<BlockQ5K>(n, k)),
            WeightData::Q8_0(quantized::<BlockQ8_0>(n, k)),
            WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
            WeightData::Q6K(quantized::<BlockQ6K>(n, k)),
            WeightData::Q3K(quantized::<BlockQ3K>(n, k)),
            WeightData::Q2K(quantized::<BlockQ2K>(n, k)),
            random_blocks(GgmlDType::Q3K, n, k, (m * n) as u64),
            random_blocks(GgmlDType::Q2K, n, k, (m * n) as u64),
        ];
        for w in &types {
            for &isa in &isas {
                for packing in [Packing::Bytes, Packing::Nibbles, Packing::Planes] {
                    check(isa, packing, w, m, k, n);
                }
            }
        }
    }
}

/// A row's outputs alone are its outputs inside a larger batch, bit for bit, on
/// each instruction set the CPU has, values one byte or a nibble each (and
/// K-quant scales formed by the tile alone or read from the panel's expansion).
#[test]
fn rows_do_not_depend_on_the_batch() {
    let (k, n) = (512, 48);
    let isas = tested_isas("int8_gemm_batch_invariance");
    let types = [
        WeightData::Q4_1(quantized::<BlockQ4_1>(n, k)),
        WeightData::Q4K(quantized::<BlockQ4K>(n, k)),
        WeightData::Q5K(quantized::<BlockQ5K>(n, k)),
        WeightData::Q6K(quantized::<BlockQ6K>(n, k)),
        WeightData::Q3K(quantized::<BlockQ3K>(n, k)),
        WeightData::Q2K(quantized::<BlockQ2K>(n, k)),
        // Random bits in every field (scales of either sign): the one-row tile
        // (`gemv`) against the general tile's rows.
        random_blocks(GgmlDType::Q4K, n, k, 3),
        random_blocks(GgmlDType::Q5K, n, k, 4),
        random_blocks(GgmlDType::Q6K, n, k, 5),
    ];
    for (w, &isa) in types.iter().flat_map(|w| isas.iter().map(move |i| (w, i))) {
        let mut panels = Int8Panels::pack(w, n, k).unwrap();
        for packing in [Packing::Bytes, Packing::Nibbles, Packing::Planes] {
            if packing != Packing::Bytes && !panels.repack(packing) {
                continue;
            }
            let x = test_data(40 * k, 5);
            let mut all = vec![0f32; 40 * n];
            matmul(&panels, isa, &x, 40, &mut all);
            for r in [0, 6, 17, 39] {
                let mut one = vec![0f32; n];
                matmul(&panels, isa, &x[r * k..(r + 1) * k], 1, &mut one);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let want = bits(&all[r * n..(r + 1) * n]);
                assert_eq!(
                    bits(&one),
                    want,
                    "{:?} {isa:?} {packing:?} row {r}",
                    w.dtype()
                );
            }
        }
    }
}
