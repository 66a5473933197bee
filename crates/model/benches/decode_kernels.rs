//! The weight matmuls of one batch-1 decode token of the default model's shapes
//! (SmolLM2-135M: 30 layers, hidden 576, q 576, kv 192, ffn 1536, vocab 49,152; Q4_1
//! layers, Q8_0 output), on random weights, through the old path (one `qmatmul` per
//! matrix, candle's activation quantization, one block at a time) and the new one
//! (q/k/v and gate/up stacked, weights repacked, `q4_1_rows` / `q8_0_rows`). Small enough
//! to run under callgrind in seconds (docs/profile-decode.md):
//!   RAYON_NUM_THREADS=1 valgrind --tool=callgrind --dump-before='*token_*' \
//!     --dump-after='*token_*' <binary> [--tokens N]
//! Without valgrind it prints each path's time per token (indicative on a busy machine).
//! `--layers N` and `--vocab N` shrink the model (the setup is slow under valgrind; the
//! counts scale linearly with both).

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::k_quants::{BlockQ4_1, BlockQ8_0, GgmlType};
use sloserve_model::kernels::q4_1_rows::Q4_1Rows;
use sloserve_model::kernels::q8_0_rows::Q8_0Rows;
use sloserve_model::kernels::qmatmul::qmatmul;

const H: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn quant<T: GgmlType>(n: usize, k: usize, seed: u32) -> Vec<T> {
    let mut w = vec![T::zeros(); n * k / T::BLCK_SIZE];
    T::from_float(&data(n * k, seed), &mut w);
    w
}

/// One layer's matrices as the file stores them.
struct Layer {
    q: Vec<BlockQ4_1>,
    k: Vec<BlockQ4_1>,
    v: Vec<BlockQ4_1>,
    o: Vec<BlockQ4_1>,
    gate: Vec<BlockQ4_1>,
    up: Vec<BlockQ4_1>,
    down: Vec<BlockQ4_1>,
}

/// The same, stacked and repacked.
struct Packed {
    qkv: Q4_1Rows,
    o: Q4_1Rows,
    gate_up: Q4_1Rows,
    down: Q4_1Rows,
}

#[inline(never)]
fn token_old(layers: &[Layer], out_w: &[BlockQ8_0], x: &[f32], xf: &[f32], buf: &mut [f32]) {
    let vocab = out_w.len() * 32 / H;
    for l in layers {
        qmatmul(&l.q, x, 1, H, H, buf);
        qmatmul(&l.k, x, 1, H, KV, buf);
        qmatmul(&l.v, x, 1, H, KV, buf);
        qmatmul(&l.o, x, 1, H, H, buf);
        qmatmul(&l.gate, x, 1, H, FFN, buf);
        qmatmul(&l.up, x, 1, H, FFN, buf);
        qmatmul(&l.down, xf, 1, FFN, H, buf);
    }
    qmatmul(out_w, x, 1, H, vocab, buf);
}

#[inline(never)]
fn token_new(layers: &[Packed], out_w: &Q8_0Rows, x: &[f32], xf: &[f32], buf: &mut [f32]) {
    for l in layers {
        l.qkv.matmul(x, 1, buf);
        l.o.matmul(x, 1, buf);
        l.gate_up.matmul(x, 1, buf);
        l.down.matmul(xf, 1, buf);
    }
    out_w.matmul(x, 1, buf);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    let (tokens, n_layers, vocab) = (
        flag("--tokens", 1),
        flag("--layers", 30),
        flag("--vocab", 49_152),
    );
    let layers: Vec<Layer> = (0..n_layers as u32)
        .map(|s| Layer {
            q: quant(H, H, s * 8 + 1),
            k: quant(KV, H, s * 8 + 2),
            v: quant(KV, H, s * 8 + 3),
            o: quant(H, H, s * 8 + 4),
            gate: quant(FFN, H, s * 8 + 5),
            up: quant(FFN, H, s * 8 + 6),
            down: quant(H, FFN, s * 8 + 7),
        })
        .collect();
    let packed: Vec<Packed> = layers
        .iter()
        .map(|l| Packed {
            qkv: Q4_1Rows::pack(
                &[l.q.clone(), l.k.clone(), l.v.clone()].concat(),
                H + 2 * KV,
                H,
            ),
            o: Q4_1Rows::pack(&l.o, H, H),
            gate_up: Q4_1Rows::pack(&[l.gate.clone(), l.up.clone()].concat(), 2 * FFN, H),
            down: Q4_1Rows::pack(&l.down, H, FFN),
        })
        .collect();
    let out_w: Vec<BlockQ8_0> = quant(vocab, H, 99);
    let out_packed = Q8_0Rows::pack(&out_w, vocab, H);
    let (x, xf) = (data(H, 5), data(FFN, 6));
    let mut buf = vec![0f32; vocab.max(2 * FFN)];
    for (name, new) in [("old", false), ("new", true)] {
        let t0 = Instant::now();
        for _ in 0..tokens {
            if new {
                token_new(&packed, &out_packed, &x, &xf, &mut buf);
            } else {
                token_old(&layers, &out_w, &x, &xf, &mut buf);
            }
            black_box(&buf);
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / tokens as f64;
        println!("{name}: {ms:.3} ms per token's weight matmuls ({tokens} tokens, {n_layers} layers, vocab {vocab})");
    }
}
