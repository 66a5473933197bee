//! The constrained draw over gathered candidates draws, seed for seed, the token
//! the masked copy of the row (the path before it, kept as the reference behind
//! `masked_copy_path`) draws: every knob set, masks from one token to all,
//! penalties and biases, rows of awkward lengths with NaN / ±inf holes.

use super::bench_tests::random_mask;
use super::candidates::Candidates;
use super::constraint::{allowed_count, masked_argmax, masked_copy, only_allowed, TokenConstraint};
use super::tests::{params, random_logits};
use super::*;

/// Random masks, one per step: densities from one token to all.
fn random_masks(n: usize, seed: u64, steps: usize) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..steps)
        .map(|_| {
            let density = [0.0, 0.0005, 0.015, 0.12, 0.6, 0.95, 1.0][rng.random_range(0..7)];
            let mut m = if density == 0.0 {
                vec![0u32; n.div_ceil(32)]
            } else {
                random_mask(n, density, rng.random())
            };
            // At least one token (token 7 of `random_mask` is past a tiny row).
            if (0..n).all(|i| m[i / 32] >> (i % 32) & 1 == 0) {
                let t = rng.random_range(0..n);
                m[t / 32] |= 1 << (t % 32);
            }
            m
        })
        .collect()
}

/// Replays masks, one per fill.
struct Replay(Vec<Vec<u32>>, usize);

impl TokenConstraint for Replay {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        allowed.copy_from_slice(&self.0[self.1]);
        self.1 += 1;
        Ok(())
    }
    fn commit(&mut self, _token: u32) -> Result<(), String> {
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
}

fn knob_sets() -> Vec<SamplingParams> {
    vec![
        SamplingParams::greedy(),
        params(|_| {}),
        params(|p| p.temperature = 0.7),
        params(|p| p.temperature = 1.6),
        params(|p| p.top_k = 3),
        params(|p| p.top_k = 40),
        params(|p| p.top_k = STREAMING_TOP_K),
        params(|p| {
            p.temperature = 0.8;
            p.top_k = 200; // the masked-copy path in both
        }),
        params(|p| p.top_p = 0.9),
        params(|p| p.top_p = 1e-6),
        params(|p| {
            p.temperature = 0.6;
            p.top_p = 0.95;
            p.min_p = 0.01;
        }),
        params(|p| {
            p.temperature = 1.3;
            p.min_p = 0.05;
        }),
        params(|p| {
            p.top_k = 50;
            p.top_p = 0.8;
        }),
        params(|p| {
            p.top_k = 20;
            p.min_p = 0.2;
            p.logprobs = Some(3);
        }),
        params(|p| {
            p.temperature = 0.9;
            p.presence_penalty = 0.7;
            p.frequency_penalty = 0.4;
        }),
        SamplingParams {
            presence_penalty: 1.5,
            ..SamplingParams::greedy()
        },
        params(|p| {
            p.repetition_penalty = 1.3;
            p.top_p = 0.9;
        }),
        params(|p| {
            p.logit_bias = vec![(7, 5.0), (8, -100.0), (7, 2.0), (40, 100.0), (1 << 30, 1.0)];
            p.temperature = 1.2;
        }),
    ]
}

/// A random row with NaN / ±inf holes, one allowed token of `mask` kept finite
/// (a row whose allowed tokens are all -inf is where the paths differ: the masked
/// copy drew from the whole row, the candidates draw among the allowed).
fn row(seed: u64, n: usize, mask: &[u32]) -> Vec<f32> {
    let mut r = random_logits(seed, n, 4.0 + (seed % 4) as f32 * 3.0);
    if seed.is_multiple_of(3) {
        for i in (11..n).step_by(97) {
            r[i] = f32::NAN;
        }
        for i in (5..n).step_by(89) {
            r[i] = f32::NEG_INFINITY;
        }
        r[n / 3] = f32::INFINITY;
    }
    let first = (0..n).find(|&i| mask[i / 32] >> (i % 32) & 1 == 1);
    if let Some(i) = first.filter(|&i| !r[i].is_finite()) {
        r[i] = 0.5;
    }
    r
}

/// Draws `steps` tokens with both paths from the same seed and masks; asserts
/// equal ids (and logprobs when asked) at every step.
fn assert_paths_agree(p: &SamplingParams, n: usize, seed: u64, steps: usize) {
    let masks = random_masks(n, seed, steps);
    let make = |reference: bool| {
        let p = SamplingParams {
            seed: p.seed.map(|s| s + seed),
            ..p.clone()
        };
        let mut s = Sampler::new(p, n)
            .with_prompt(&[7, 9, 300 % n as u32])
            .with_constraint(Some(Box::new(Replay(masks.clone(), 0))));
        s.masked_copy_path = reference;
        s
    };
    let (mut new, mut old) = (make(false), make(true));
    for (step, mask) in masks.iter().enumerate() {
        let logits = row(seed * 1000 + step as u64, n, mask);
        let (a, b) = if step % 2 == 0 {
            (new.sample_lean(&logits), old.sample_lean(&logits))
        } else {
            (new.sample(&logits), old.sample(&logits))
        };
        assert_eq!(a.id, b.id, "{p:?} n={n} seed={seed} step={step}");
        assert_eq!(a.logprob.to_bits(), b.logprob.to_bits());
        assert_eq!(a.top_logprobs, b.top_logprobs);
        assert_eq!(new.constraint_end(), None);
    }
}

#[test]
fn candidates_draw_what_the_masked_row_draws() {
    for p in knob_sets() {
        for (n, seeds, steps) in [(7, 8, 20), (1000, 12, 24), (4099, 8, 16), (20_000, 4, 12)] {
            for seed in 0..seeds {
                assert_paths_agree(&p, n, seed, steps);
            }
        }
    }
}

#[test]
fn candidates_draw_what_the_masked_row_draws_on_a_qwen_row() {
    for p in knob_sets() {
        assert_paths_agree(&p, 151_936, 3, 6);
    }
}

#[test]
fn gather_keeps_allowed_tokens_in_order_sanitised() {
    let n = 1000;
    let mut src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    src[33] = f32::NAN;
    src[34] = f32::INFINITY;
    for density in [0.0005, 0.01, 0.2, 0.7, 0.97, 1.0] {
        let mut mask = random_mask(n, density, 5);
        mask[1] |= 0b110; // 33, 34
        mask.truncate(20); // tokens past the mask are disallowed
        let mut c = Candidates::default();
        c.gather(
            &src,
            &mask,
            allowed_count(&mask[..mask.len().min(n.div_ceil(32))]),
        );
        let mut dense = Vec::new();
        masked_copy(&mut dense, &src, &mask);
        let want: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                mask.get(i as usize / 32)
                    .is_some_and(|w| w >> (i % 32) & 1 == 1)
            })
            .collect();
        assert_eq!(c.ids, want, "{density}");
        for (j, &id) in c.ids.iter().enumerate() {
            assert_eq!(c.vals[j].to_bits(), dense[id as usize].to_bits());
        }
        for id in 0..n as u32 + 300 {
            assert_eq!(c.index(id), want.binary_search(&id).ok(), "{id}");
        }
    }
    // Three of three.
    let mut c = Candidates::default();
    c.gather(&[1.0, 2.0, 3.0], &[7], 3);
    assert_eq!(c.ids, vec![0, 1, 2]);
}

#[test]
fn candidates_sums_are_the_masked_rows_bit_for_bit() {
    use super::draw::{dense_block_sums, exp_row};
    for (n, seed) in [(7, 1), (1000, 2), (4099, 3), (5003, 4), (151_936, 5)] {
        for (k, mask) in random_masks(n, seed, 14).iter().enumerate() {
            let src = row(seed * 100 + k as u64, n, mask);
            let mut dense = Vec::new();
            masked_copy(&mut dense, &src, mask);
            let mut c = Candidates::default();
            c.gather(&src, mask, allowed_count(mask));
            let max = max_of(&dense);
            assert_eq!(max.to_bits(), max_of(&c.vals).to_bits());
            for inv_t in [1.0, 1.0 / 0.7, 1.0 / 1.6] {
                let m = max * inv_t;
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let za = dense_block_sums(&dense, inv_t, m, &mut a);
                let zb = c.dense_block_sums(inv_t, m, &mut b);
                assert_eq!(za.to_bits(), zb.to_bits(), "n={n} k={k}");
                assert_eq!(a.len(), b.len());
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
                let (mut wa, mut wb) = (Vec::new(), Vec::new());
                let za = exp_row(&dense, inv_t, m, &mut wa, None);
                let zb = exp_row(&c.vals, inv_t, m, &mut wb, Some(&c));
                assert_eq!(za.to_bits(), zb.to_bits(), "n={n} k={k}");
                let ha = mass_histograms(&wa, None);
                let hb = mass_histograms(&wb, Some(&c.ids));
                for (x, y) in ha.iter().flatten().zip(hb.iter().flatten()) {
                    assert_eq!(x.to_bits(), y.to_bits(), "n={n} k={k}");
                }
            }
        }
    }
}

#[test]
fn masked_argmax_is_the_masked_copys_argmax_ties_lowest_id() {
    for (n, seed) in [(5, 1), (33, 2), (1000, 3), (4099, 4), (151_936, 5)] {
        for (k, mask) in random_masks(n, seed, 20).iter().enumerate() {
            // Few distinct values: many ties.
            let mut src: Vec<f32> = random_logits(seed * 50 + k as u64, n, 4.0)
                .iter()
                .map(|x| x.round())
                .collect();
            if k % 3 == 0 {
                src[n / 2] = f32::NAN;
                src[n - 1] = f32::INFINITY;
            }
            let src = {
                let mut r = src;
                let first = (0..n).find(|&i| mask[i / 32] >> (i % 32) & 1 == 1).unwrap();
                if r[first].is_nan() {
                    r[first] = 0.0;
                }
                r
            };
            let mut dense = Vec::new();
            masked_copy(&mut dense, &src, mask);
            assert_eq!(masked_argmax(&src, mask), argmax(&dense), "n={n} k={k}");
            if allowed_count(mask) == 1 {
                assert_eq!(only_allowed(mask), argmax(&dense));
            }
        }
    }
    // Allowed tokens all -inf: the first allowed one.
    let src = [1.0, f32::NEG_INFINITY, 3.0, f32::NAN];
    assert_eq!(masked_argmax(&src, &[0b1010]), 1);
}

/// Allows `allowed` only.
struct Only(Vec<u32>);

impl TokenConstraint for Only {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        allowed.fill(0);
        for &t in &self.0 {
            allowed[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(())
    }
    fn commit(&mut self, _token: u32) -> Result<(), String> {
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
}

#[test]
fn a_single_allowed_token_is_taken_and_keeps_the_seeds_stream() {
    // Forced steps (even a -inf or NaN logit) give the token; a seeded sequence
    // with forced steps continues as the masked-row path did.
    for p in [SamplingParams::greedy(), params(|p| p.top_p = 0.9)] {
        let mut s = Sampler::new(p.clone(), 100).with_constraint(Some(Box::new(Only(vec![42]))));
        let mut row = random_logits(1, 100, 5.0);
        for x in [1.0, f32::NEG_INFINITY, f32::NAN] {
            row[42] = x;
            assert_eq!(s.sample_lean(&row).id, 42);
        }
    }
    // Allowed tokens all -inf: one of them, not a disallowed one.
    for p in [SamplingParams::greedy(), params(|_| {})] {
        let mut s = Sampler::new(p, 100).with_constraint(Some(Box::new(Only(vec![3, 64, 99]))));
        let mut row = random_logits(2, 100, 5.0);
        for i in [3, 64, 99] {
            row[i] = f32::NEG_INFINITY;
        }
        for _ in 0..50 {
            let id = s.sample_lean(&row).id;
            assert!([3, 64, 99].contains(&id), "{id}");
        }
    }
}
