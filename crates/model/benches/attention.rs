//! Paged attention on its own (`cargo bench -p sloserve-model --bench attention`):
//! one decode step of B sequences (default 32) at context N (default 160, the middle
//! of llama-batched-bench's `-npp 128 -ntg 64`) over the default model's attention
//! shape (9 query heads, 3 KV heads of 64, f16 cache), through all 30 layers so that
//! the cache is read from wherever a real step finds it. Prints µs per layer and the
//! bytes of cache read per second. Flags: `--batch B`, `--context N`, `--layers L`, `--runs R`;
//! `--qwen` for Qwen2.5 1.5B's shape (12 query heads, 2 KV heads of 128); `--prefill T`
//! for one sequence's prompt chunk of T tokens ending at position N instead of a
//! decode step (then also GFLOP/s); `--kv f16,q8_0,q4_0` the cache types to compare
//! (default f16), their runs interleaved, bytes read counted in each type's bytes.

use std::time::Instant;

use sloserve_engine::Batch;
use sloserve_model::kernels::attention::{paged_attention, AttnShape};
use sloserve_model::kv_cache::{KvCache, KvDtype};

#[path = "common.rs"]
mod common;
use common::{load_avg, median};

const LAYERS_DEFAULT: usize = 30;
const BLOCK: usize = 16;
const SMOL: AttnShape = AttnShape {
    num_heads: 9,
    num_kv_heads: 3,
    head_dim: 64,
    scale: 0.125,
    window: None,
};
const QWEN: AttnShape = AttnShape {
    num_heads: 12,
    num_kv_heads: 2,
    head_dim: 128,
    scale: 0.088_388_35,
    window: None,
};

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).map_or(default, |i| {
        args.get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} takes a number"))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (b, n, runs) = (
        flag(&args, "--batch", 32),
        flag(&args, "--context", 160),
        flag(&args, "--runs", 20),
    );
    let layers = flag(&args, "--layers", LAYERS_DEFAULT);
    let shape = if args.iter().any(|a| a == "--qwen") {
        QWEN
    } else {
        SMOL
    };
    let prefill = flag(&args, "--prefill", 0);
    // A prompt chunk is one sequence whose `prefill` new tokens end at position n.
    let (b, tokens) = if prefill > 0 {
        (1, prefill.min(n))
    } else {
        (b, 1)
    };
    let kv = shape.num_kv_heads * shape.head_dim;
    let per_seq = n.div_ceil(BLOCK);
    let types: Vec<KvDtype> = args
        .iter()
        .position(|a| a == "--kv")
        .and_then(|i| args.get(i + 1))
        .map_or("f16", String::as_str)
        .split(',')
        .map(|t| match t {
            "f16" => KvDtype::F16,
            "q8_0" => KvDtype::Q8_0,
            "q4_0" => KvDtype::Q4_0,
            other => panic!("--kv: unknown type {other}"),
        })
        .collect();
    let mut caches: Vec<KvCache> = types
        .iter()
        .map(|&t| KvCache::new(layers, kv, BLOCK, b * per_seq, t))
        .collect();
    let mut batch = Batch::default();
    let mut x = 0.37f32;
    let mut next = || {
        x = (x * 3.7 + 0.11).fract();
        x - 0.5
    };
    for s in 0..b {
        // Interleave the sequences' blocks, as a pool that has served a while does.
        let table: Vec<u32> = (0..per_seq).map(|i| (i * b + s) as u32).collect();
        for layer in 0..layers {
            for pos in 0..n {
                let k: Vec<f32> = (0..kv).map(|_| next()).collect();
                let v: Vec<f32> = (0..kv).map(|_| next()).collect();
                for cache in &mut caches {
                    let slot = cache.slot(&table, pos);
                    cache.write(layer, slot, &k, &v);
                }
            }
        }
        batch.push(&vec![1; tokens], n - tokens, &table, true);
    }
    let token_seq: Vec<u32> = (0..b * tokens).map(|t| (t / tokens) as u32).collect();
    let qw = shape.num_heads * shape.head_dim;
    let q: Vec<f32> = (0..b * tokens * qw).map(|_| next()).collect();
    let mut out = vec![0f32; b * tokens * qw];
    let mut step = |cache: &KvCache| {
        let t0 = Instant::now();
        for layer in 0..layers {
            paged_attention(&batch, &token_seq, &q, cache, layer, shape, &mut out);
        }
        t0.elapsed().as_secs_f64() / layers as f64
    };
    let mut per_layer = vec![Vec::new(); types.len()];
    for (i, cache) in caches.iter().enumerate() {
        step(cache);
        per_layer[i].push(step(cache));
    }
    for _ in 1..runs {
        for (i, cache) in caches.iter().enumerate() {
            per_layer[i].push(step(cache));
        }
    }
    for (t, per_layer) in types.iter().zip(&per_layer) {
        let us = median(per_layer) * 1e6;
        let bytes = (b * n * 2 * t.row_bytes(kv)) as f64;
        println!(
            "attention {t:?}: batch {b}, context {n}, {} threads, load {}: {us:.1} µs per layer \
             ({:.1} GB/s of cache), {:.2} ms per step of {layers} layers",
            rayon::current_num_threads(),
            load_avg(),
            bytes / (us * 1e-6) / 1e9,
            us * layers as f64 / 1e3
        );
        if prefill > 0 {
            // Two passes (scores, values) of a multiply-add per head dimension per
            // (token, query head, attended key).
            let keys: usize = (n - tokens + 1..=n).sum();
            let flops = 4.0 * (shape.num_heads * shape.head_dim * keys) as f64;
            println!(
                "  prompt chunk of {tokens}: {:.1} GFLOP/s",
                flops / (us * 1e-6) / 1e9
            );
        }
    }
    std::hint::black_box(&out);
}
