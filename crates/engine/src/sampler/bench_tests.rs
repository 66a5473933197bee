//! Micro-benchmark of the per-token draw on a Qwen-sized row (151,936 logits),
//! unconstrained vs constrained by fixed masks of several densities (a forced
//! token, a sparse structural-like set, a mid-sized set, a string-like mask with
//! holes), greedy and sampling. `#[ignore]`d: run it in release,
//!
//! ```text
//! cargo test --release -p sloserve-engine --lib sampler::bench_tests -- --ignored --nocapture
//! ```
//!
//! Each figure is the median over `RUNS` runs of the mean µs per token over
//! `TOKENS` tokens (rows cycled); the mask fill (a copy of the fixed bitset, as the
//! grammar's matcher copies its own) is included.

use std::time::Instant;

use super::constraint::TokenConstraint;
use super::tests::{params, random_logits};
use super::*;

const QWEN_VOCAB: usize = 151_936;
const TOKENS: usize = 200;
const RUNS: usize = 7;

/// A constraint with one fixed mask that accepts everything it allows.
struct FixedMask(Vec<u32>);

impl TokenConstraint for FixedMask {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        allowed.copy_from_slice(&self.0);
        Ok(())
    }
    fn commit(&mut self, _token: u32) -> Result<(), String> {
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
}

/// A mask allowing each token with probability `density` (and token 7 always).
pub(super) fn random_mask(n: usize, density: f64, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut m = vec![0u32; n.div_ceil(32)];
    for i in 0..n {
        if i == 7 || rng.random::<f64>() < density {
            m[i / 32] |= 1 << (i % 32);
        }
    }
    m
}

/// (median, min) over `RUNS` runs.
fn median_min_us(mut f: impl FnMut() -> f64) -> (f64, f64) {
    let mut v: Vec<f64> = (0..RUNS).map(|_| f()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[RUNS / 2], v[0])
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn bench_constrained_draw_on_a_qwen_row() {
    let n = QWEN_VOCAB;
    let rows: Vec<Vec<f32>> = (0..8).map(|s| random_logits(s, n, 10.0)).collect();
    let mut forced = vec![0u32; n.div_ceil(32)];
    forced[4000] = 1 << 5;
    let masks: Vec<(&str, Option<Vec<u32>>)> = vec![
        ("unconstrained", None),
        ("forced (1 token)", Some(forced)),
        ("sparse (1.5%)", Some(random_mask(n, 0.015, 1))),
        ("mid (12%)", Some(random_mask(n, 0.12, 2))),
        ("25%", Some(random_mask(n, 0.25, 4))),
        ("50%", Some(random_mask(n, 0.5, 5))),
        ("string (95%)", Some(random_mask(n, 0.95, 3))),
    ];
    let configs = [
        ("greedy", SamplingParams::greedy()),
        ("t=0.8", params(|p| p.temperature = 0.8)),
        (
            "t=0.8 top_p=0.9",
            params(|p| {
                p.temperature = 0.8;
                p.top_p = 0.9;
            }),
        ),
        ("top_k=40", params(|p| p.top_k = 40)),
    ];
    // SAMPLER_BENCH_COPY=1: every constrained row by the masked copy.
    let copy_path = std::env::var_os("SAMPLER_BENCH_COPY").is_some();
    println!("us/token on a {n}-logit row (median (min) of {RUNS} runs x {TOKENS} tokens), copy path forced: {copy_path}");
    print!("{:<18}", "");
    for (label, _) in &configs {
        print!(" {label:>16}");
    }
    println!();
    for (mlabel, mask) in &masks {
        print!("{mlabel:<18}");
        for (_, p) in &configs {
            let (med, min) = median_min_us(|| {
                let c = mask
                    .clone()
                    .map(|m| Box::new(FixedMask(m)) as Box<dyn TokenConstraint>);
                let mut s = Sampler::new(p.clone(), n).with_constraint(c);
                s.masked_copy_path = copy_path;
                s.sample_lean(&rows[0]);
                let t = Instant::now();
                for i in 0..TOKENS {
                    std::hint::black_box(s.sample_lean(&rows[i % rows.len()]));
                }
                t.elapsed().as_secs_f64() * 1e6 / TOKENS as f64
            });
            print!(" {:>16}", format!("{med:.1} ({min:.1})"));
        }
        println!();
    }
}
