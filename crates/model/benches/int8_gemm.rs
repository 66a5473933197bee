//! The 8-bit GEMM on its own (`cargo bench -p sloserve-model --bench int8_gemm`): Qwen2.5
//! 1.5B's feed-forward shapes (up: 8960 x 1536, down: 1536 x 8960) in Q4_K and Q6_K
//! (random weights, the file's block formats), `m` activation rows (default 512, a
//! prompt chunk; `--rows 32` a decode batch), on the best instruction set this CPU
//! has (`--avx2`: the AVX2 tiles, as an AVX2-only machine runs them), over the
//! pool's threads (`RAYON_NUM_THREADS`). `--bytes` keeps one byte a value (else
//! values are packed as the loader packs them for the instruction set; `--planes`: 5- and
//! 6-bit values as nibbles and high planes). `--type Q6_K` measures that type alone. `--shape N,K` multiplies that one shape
//! instead (`--shape 151936,1536`: Qwen's output matrix, 175-233 MB, which no cache
//! holds: what a batch-1 token reads). Prints the median GOP/s (2·m·n·k per
//! product) of `--runs` runs (default 7), the best run's (what a shared machine's
//! interruptions leave alone), and the load average.

use std::time::Instant;

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K, GgmlType};
use sloserve_model::kernels::cpu::test_data;
use sloserve_model::kernels::int8_gemm::{matmul, Isa};
use sloserve_model::kernels::int8_panels::{Int8Panels, Packing};
use sloserve_model::weights::WeightData;

#[path = "common.rs"]
mod common;
use common::{load_avg, median};

fn blocks<T: GgmlType>(n: usize, k: usize) -> Vec<T> {
    let x = test_data(n * k, 11);
    let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
    T::from_float(&x, &mut w);
    w
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().expect("a number"))
            .unwrap_or(default)
    };
    let (m, runs) = (flag("--rows", 512), flag("--runs", 7));
    let isa = match args.iter().any(|a| a == "--avx2") {
        true => Some(Isa::Avx2).filter(|i| i.available()),
        false => Isa::best(),
    };
    let Some(isa) = isa else {
        return eprintln!("no AVX2: nothing to measure");
    };
    println!("isa {isa:?}, {m} rows, load {}", load_avg());
    let shapes = match args.iter().position(|a| a == "--shape") {
        Some(i) => {
            let nk: Vec<usize> = args[i + 1]
                .split(',')
                .map(|v| v.parse().expect("--shape N,K"))
                .collect();
            vec![("shape", nk[0], nk[1])]
        }
        None => vec![("up", 8960, 1536), ("down", 1536, 8960)],
    };
    for (name, n, k) in shapes {
        let x: Vec<f32> = test_data(m * k, 3).iter().map(|v| v * 4.0).collect();
        let mut out = vec![0f32; m * n];
        for (ty, w) in [
            ("Q4_K", WeightData::Q4K(blocks::<BlockQ4K>(n, k))),
            ("Q6_K", WeightData::Q6K(blocks::<BlockQ6K>(n, k))),
        ] {
            let only = args.iter().position(|a| a == "--type");
            if only.is_some_and(|i| args.get(i + 1).is_some_and(|t| t != ty)) {
                continue;
            }
            let mut p = Int8Panels::pack(&w, n, k).expect("packs");
            // As the loader packs them (`linear::panels_for`).
            p.repack(
                match (
                    args.iter().any(|a| a == "--bytes"),
                    args.iter().any(|a| a == "--planes"),
                ) {
                    (true, _) => Packing::Bytes,
                    (_, true) => Packing::Planes,
                    _ => isa.packing(),
                },
            );
            matmul(&p, isa, &x, m, &mut out);
            let times: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    matmul(&p, isa, &x, m, &mut out);
                    t.elapsed().as_secs_f64()
                })
                .collect();
            let ops = 2.0 * (m * n * k) as f64 / 1e9;
            let best = times.iter().cloned().fold(f64::MAX, f64::min);
            let gb = p.held_bytes() as f64 / 1e9;
            println!(
                "{name:5} {ty}  {n} x {k}: {:7.1} GOP/s (best {:.1}), {:.1} GB/s of panels",
                ops / median(&times),
                ops / best,
                gb / median(&times)
            );
        }
    }
}
