//! The lean per-token path keeps behaviour: seeded tokens match a digest recorded
//! from the full-log-softmax sampler before it, greedy matches, logprobs match.

use super::tests::{params, random_logits};
use super::*;

/// The knob sets the digest covers: every path of `draw` plus greedy.
fn configs() -> Vec<SamplingParams> {
    vec![
        SamplingParams {
            seed: Some(0),
            ..SamplingParams::greedy()
        },
        params(|_| {}),
        params(|p| p.temperature = 0.7),
        params(|p| p.temperature = 1.6),
        params(|p| p.top_k = 40),
        params(|p| {
            p.temperature = 0.8;
            p.top_k = 200;
        }),
        params(|p| p.top_p = 0.9),
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
            p.temperature = 0.9;
            p.presence_penalty = 0.7;
            p.frequency_penalty = 0.4;
        }),
        SamplingParams {
            presence_penalty: 1.5,
            ..SamplingParams::greedy()
        },
    ]
}

/// Rows: random at two scales, one with NaN / ±inf holes, one fully masked.
fn rows(n: usize) -> Vec<Vec<f32>> {
    let mut holes = random_logits(5, n, 6.0);
    for i in (0..n).step_by(97) {
        holes[i] = f32::NAN;
    }
    for i in (3..n).step_by(89) {
        holes[i] = f32::NEG_INFINITY;
    }
    let mut inf = random_logits(6, n, 3.0);
    inf[n / 3] = f32::INFINITY;
    inf[n / 2] = f32::INFINITY;
    vec![
        random_logits(1, n, 2.0),
        random_logits(2, n, 12.0),
        holes,
        inf,
        vec![f32::NEG_INFINITY; n],
    ]
}

/// FNV-1a over the ids drawn by every config on every row, 40 draws each,
/// with the sampled logprob's bits when `with_logprob`.
fn digest(sample: impl Fn(&mut Sampler, &[f32]) -> SampledToken, with_logprob: bool) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |x: u32| {
        for b in x.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for n in [7usize, 1000, 49_152] {
        for (ri, row) in rows(n).iter().enumerate() {
            for (ci, p) in configs().into_iter().enumerate() {
                let mut p = p;
                p.seed = p.seed.map(|s| s + (ri * 100 + ci) as u64);
                let mut s = Sampler::new(p, n);
                for _ in 0..40 {
                    let t = sample(&mut s, row);
                    eat(t.id);
                    if with_logprob {
                        eat(t.logprob.to_bits());
                    }
                }
            }
        }
    }
    h
}

/// Recorded from `Sampler::sample` before the lean path (commit dc9079b).
const IDS_DIGEST: u64 = 0x3c54_44f3_b004_209e;

#[test]
fn seeded_tokens_match_the_recorded_digest() {
    let got = digest(|s, row| s.sample(row), false);
    assert_eq!(got, IDS_DIGEST, "sample: {got:#x}");
    // The engine's call draws the same tokens, logprobs asked or not.
    let got = digest(|s, row| s.sample_lean(row), false);
    assert_eq!(got, IDS_DIGEST, "sample_lean: {got:#x}");
}

/// The same, with each sampled logprob's bits (the log-softmax is unchanged).
const IDS_AND_LOGPROBS_DIGEST: u64 = 0xb0ee_3f1c_4b3b_7660;

#[test]
fn seeded_logprobs_match_the_recorded_digest() {
    let got = digest(|s, row| s.sample(row), true);
    assert_eq!(got, IDS_AND_LOGPROBS_DIGEST, "sample: {got:#x}");
}

#[test]
fn lean_skips_the_logprob_only_when_not_asked() {
    let row = random_logits(11, 5_000, 9.0);
    for lp in [None, Some(0), Some(5)] {
        for p in configs() {
            let p = SamplingParams { logprobs: lp, ..p };
            let (mut full, mut lean) = (Sampler::new(p.clone(), 5_000), Sampler::new(p, 5_000));
            for _ in 0..30 {
                let (a, b) = (full.sample(&row), lean.sample_lean(&row));
                assert_eq!(a.id, b.id);
                assert_eq!(a.top_logprobs, b.top_logprobs);
                match lp {
                    None => assert!(b.logprob.is_nan() && b.top_logprobs.is_empty()),
                    Some(_) => assert_eq!(a.logprob.to_bits(), b.logprob.to_bits()),
                }
            }
        }
    }
}

/// Chi-square (29 degrees of freedom) of `draws` seeded lean draws from a 30-token
/// row against its softmax; 58.3 is the 0.1% critical value.
fn chi_square(p: SamplingParams, row: &[f32], draws: usize) -> f64 {
    let mut s = Sampler::new(p, row.len());
    let mut h = vec![0usize; row.len()];
    for _ in 0..draws {
        h[s.sample_lean(row).id as usize] += 1;
    }
    let lp = super::tests::log_softmax(row);
    h.iter()
        .zip(&lp)
        .map(|(&o, &l)| {
            let e = l.exp() * draws as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn lean_draws_follow_the_softmax() {
    let row: Vec<f32> = (0..30).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
    let x2 = chi_square(params(|_| {}), &row, 60_000);
    assert!(x2 < 58.3, "chi-square {x2}");
    // Temperature 2 is the softmax of row / 2.
    let half: Vec<f32> = row.iter().map(|x| x / 2.0).collect();
    let mut s = Sampler::new(params(|p| p.temperature = 2.0), 30);
    let mut h = vec![0usize; 30];
    for _ in 0..60_000 {
        h[s.sample_lean(&row).id as usize] += 1;
    }
    let lp = super::tests::log_softmax(&half);
    let x2: f64 = h
        .iter()
        .zip(&lp)
        .map(|(&o, &l)| (o as f64 - l.exp() * 6e4).powi(2) / (l.exp() * 6e4))
        .sum();
    assert!(x2 < 58.3, "chi-square at T=2: {x2}");
    // It can fail: against the wrong temperature it does.
    let wrong = chi_square(params(|p| p.temperature = 0.5), &row, 60_000);
    assert!(
        wrong > 58.3,
        "chi-square {wrong} should reject T=0.5 vs T=1"
    );
}
