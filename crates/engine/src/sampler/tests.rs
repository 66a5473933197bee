//! Unit tests of the sampler: greedy, logprobs, top-k/p, min-p, seeds, penalties,
//! degenerate rows.

use super::kernel_tests::sorted_desc;
use super::*;

pub(super) fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        seed: Some(7),
        ..Default::default()
    };
    f(&mut p);
    p
}

pub(super) fn random_logits(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Reference log-softmax in f64.
pub(super) fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
    logits.iter().map(|&x| x as f64 - m - s.ln()).collect()
}

pub(super) fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut h = vec![0; logits.len()];
    for _ in 0..draws {
        h[s.sample(logits).id as usize] += 1;
    }
    h
}

pub(super) fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

#[test]
fn greedy_picks_argmax_ties_lowest_id() {
    let mut s = Sampler::new(SamplingParams::greedy(), 5);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0, 1.9]).id, 1);
    assert_eq!(s.sample(&[f32::NAN, -3.0, 5.0, f32::NAN]).id, 2);
    for seed in 0..20 {
        let l = random_logits(seed, 1000, 10.0);
        let expect = (0..l.len())
            .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(s.sample(&l).id as usize, expect);
    }
    // Tiny temperatures are greedy too.
    let mut s = Sampler::new(params(|p| p.temperature = 1e-6), 3);
    for _ in 0..50 {
        assert_eq!(s.sample(&[1.0, 1.01, 0.99]).id, 1);
    }
}

#[test]
fn logprobs_hand_computed_on_4_tokens() {
    let logits = [1.0f32, 2.0, 3.0, 4.0];
    // lse = 4 + ln(1 + e^-1 + e^-2 + e^-3) = 4.440189698561196
    let lse = 4.0 + (1.0 + (-1.0f64).exp() + (-2.0f64).exp() + (-3.0f64).exp()).ln();
    assert!((lse - 4.440_189_698_561_196).abs() < 1e-12);
    let mut s = Sampler::new(
        SamplingParams {
            logprobs: Some(4),
            ..SamplingParams::greedy()
        },
        4,
    );
    let t = s.sample(&logits);
    assert_eq!(t.id, 3);
    assert!((t.logprob - (-0.440_189_7)).abs() < 1e-6, "{}", t.logprob);
    let expect = [
        (3, -0.440_189_7f32),
        (2, -1.440_189_7),
        (1, -2.440_189_7),
        (0, -3.440_189_7),
    ];
    assert_eq!(t.top_logprobs.len(), 4);
    for (got, want) in t.top_logprobs.iter().zip(expect) {
        assert_eq!(got.0, want.0);
        assert!((got.1 - want.1).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn logprobs_sum_to_one() {
    for seed in 0..10 {
        let logits = random_logits(seed, 20, 8.0);
        let mut s = Sampler::new(params(|p| p.logprobs = Some(20)), 20);
        let t = s.sample(&logits);
        assert_eq!(t.top_logprobs.len(), 20);
        let total: f64 = t
            .top_logprobs
            .iter()
            .map(|&(_, lp)| (lp as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "sum = {total}");
        let reference = log_softmax(&logits);
        for &(id, lp) in &t.top_logprobs {
            assert!((lp as f64 - reference[id as usize]).abs() < 1e-5);
        }
        assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-5);
    }
    // Big vocabulary: the sampled token's logprob matches the reference.
    let logits = random_logits(99, 50_000, 12.0);
    let reference = log_softmax(&logits);
    let mut s = Sampler::new(params(|_| {}), 50_000);
    for _ in 0..20 {
        let t = s.sample(&logits);
        assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-4);
        assert!(t.top_logprobs.is_empty());
    }
}

#[test]
fn logprobs_are_of_raw_logits_not_processed_ones() {
    // Temperature, top-k and penalties must not change the reported logprobs.
    let logits = [0.5f32, 1.5, -0.5, 1.0];
    let reference = log_softmax(&logits);
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.3;
            p.top_k = 2;
            p.presence_penalty = 1.0;
            p.frequency_penalty = 0.5;
            p.logprobs = Some(4);
        }),
        4,
    );
    for _ in 0..30 {
        let t = s.sample(&logits);
        assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-6);
        let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 3, 0, 2]);
    }
}

#[test]
fn top_logprobs_ordering_and_length() {
    let logits = random_logits(3, 300, 5.0);
    let reference = log_softmax(&logits);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));

    let mut s = Sampler::new(params(|p| p.logprobs = Some(5)), 300);
    let t = s.sample(&logits);
    assert_eq!(t.top_logprobs.len(), 5);
    for (j, &(id, lp)) in t.top_logprobs.iter().enumerate() {
        assert_eq!(id as usize, order[j]);
        assert!((lp as f64 - reference[id as usize]).abs() < 1e-5);
    }
    assert!(t.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));

    // Capped at 20.
    let mut s = Sampler::new(params(|p| p.logprobs = Some(100)), 300);
    let t = s.sample(&logits);
    assert_eq!(t.top_logprobs.len(), 20);
    let ids: Vec<usize> = t.top_logprobs.iter().map(|x| x.0 as usize).collect();
    assert_eq!(ids, order[..20].to_vec());
    // Capped at the vocabulary too.
    let mut s = Sampler::new(params(|p| p.logprobs = Some(10)), 3);
    assert_eq!(s.sample(&[1.0, 2.0, 3.0]).top_logprobs.len(), 3);
    // Some(0) and None: no alternatives, but the sampled logprob is filled.
    for lp in [Some(0), None] {
        let mut s = Sampler::new(
            SamplingParams {
                logprobs: lp,
                ..SamplingParams::greedy()
            },
            300,
        );
        let t = s.sample(&logits);
        assert!(t.top_logprobs.is_empty());
        assert_eq!(t.id as usize, order[0]);
        assert!((t.logprob as f64 - reference[order[0]]).abs() < 1e-5);
    }
    // Ties: lower id first.
    let mut s = Sampler::new(params(|p| p.logprobs = Some(3)), 5);
    let t = s.sample(&[1.0, 3.0, 2.0, 3.0, 2.0]);
    let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![1, 3, 2]);
}

#[test]
fn top_k_1_equals_greedy_at_any_temperature() {
    for (seed, temperature) in [(1, 0.1f32), (2, 0.7), (3, 1.0), (4, 5.0), (5, 1000.0)] {
        let mut greedy = Sampler::new(SamplingParams::greedy(), 500);
        let mut topk = Sampler::new(
            params(|p| {
                p.temperature = temperature;
                p.top_k = 1;
                p.seed = Some(seed);
            }),
            500,
        );
        for step in 0..50 {
            let l = random_logits(seed * 1000 + step, 500, 3.0);
            assert_eq!(topk.sample(&l).id, greedy.sample(&l).id);
        }
    }
}

#[test]
fn top_k_keeps_only_the_k_best_renormalised() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let logits = ln_probs(&probs);
    let mut s = Sampler::new(params(|p| p.top_k = 2), 4);
    let h = histogram(&mut s, &logits, 20_000);
    assert_eq!(h[0] + h[1], 0, "{h:?}");
    let f3 = h[3] as f64 / 20_000.0;
    assert!((f3 - 4.0 / 7.0).abs() < 0.02, "{h:?}");
    // Huge / exact-vocab top-k is a no-op (no panic).
    for k in [4, 5, usize::MAX] {
        let mut s = Sampler::new(params(|p| p.top_k = k), 4);
        let h = histogram(&mut s, &logits, 2_000);
        assert!(h.iter().all(|&c| c > 0), "{h:?}");
    }
}

#[test]
fn top_p_tiny_keeps_only_the_best() {
    let logits = random_logits(11, 1000, 2.0);
    let best = argmax(&logits);
    for top_p in [1e-6f32, 0.0, -1.0] {
        let mut s = Sampler::new(
            params(|p| {
                p.top_p = top_p;
                p.temperature = 2.0;
            }),
            1000,
        );
        for _ in 0..200 {
            assert_eq!(s.sample(&logits).id, best);
        }
    }
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // Cumulative: 0.4, 0.7, 0.9, 1.0 → top_p 0.65 keeps {0, 1}.
    let logits = ln_probs(&[0.4, 0.3, 0.2, 0.1]);
    let mut s = Sampler::new(params(|p| p.top_p = 0.65), 4);
    let h = histogram(&mut s, &logits, 20_000);
    assert_eq!(h[2] + h[3], 0, "{h:?}");
    assert!((h[0] as f64 / 20_000.0 - 4.0 / 7.0).abs() < 0.02, "{h:?}");
    // With top-k=3 first: renormalised {0.4,0.3,0.2}/0.9 → cum 0.444, 0.778:
    // top_p 0.75 keeps {0, 1}; without top-k, 0.75 would keep {0, 1, 2}.
    let mut s = Sampler::new(
        params(|p| {
            p.top_p = 0.75;
            p.top_k = 3;
        }),
        4,
    );
    let h = histogram(&mut s, &logits, 5_000);
    assert_eq!(h[2] + h[3], 0, "{h:?}");
    let mut s = Sampler::new(params(|p| p.top_p = 0.75), 4);
    let h = histogram(&mut s, &logits, 5_000);
    assert!(h[2] > 0 && h[3] == 0, "{h:?}");
}

/// Reference order: value descending, ties → lowest id.
#[test]
fn top_k_streaming_and_selection_paths_agree() {
    // k ≤ STREAMING_TOP_K streams, larger k selects: both give the k best
    // (ties → lower id), so seeded draws match a reference built from them.
    let mut logits = random_logits(21, 5_000, 4.0);
    logits[100] = logits[200]; // a tie
    let order = sorted_desc(&logits);
    for k in [1, 2, STREAMING_TOP_K, STREAMING_TOP_K + 1, 1_000, 4_999] {
        let allowed: std::collections::HashSet<u32> = order[..k].iter().copied().collect();
        let mut s = Sampler::new(
            params(|p| {
                p.top_k = k;
                p.temperature = 3.0;
            }),
            5_000,
        );
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3_000 {
            let id = s.sample(&logits).id;
            assert!(allowed.contains(&id), "k={k} id={id}");
            seen.insert(id);
        }
        if k <= 100 {
            assert_eq!(seen.len(), k, "k={k}: all of the k best get drawn");
        }
    }
}

#[test]
fn min_p_filters_relative_to_the_max() {
    // p ≥ 0.35 × 0.5 = 0.175 keeps {0, 1}.
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let mut s = Sampler::new(params(|p| p.min_p = 0.35), 4);
    let h = histogram(&mut s, &logits, 20_000);
    assert_eq!(h[2] + h[3], 0, "{h:?}");
    assert!((h[0] as f64 / 20_000.0 - 0.625).abs() < 0.02, "{h:?}");
    // min_p 0.25 keeps {0, 1, 2} (0.15 ≥ 0.125).
    let mut s = Sampler::new(params(|p| p.min_p = 0.25), 4);
    let h = histogram(&mut s, &logits, 20_000);
    assert!(h[2] > 0 && h[3] == 0, "{h:?}");
    // Combined with top-k (min-p applies to the survivors of top-k).
    let mut s = Sampler::new(
        params(|p| {
            p.min_p = 0.25;
            p.top_k = 2;
        }),
        4,
    );
    let h = histogram(&mut s, &logits, 5_000);
    assert!(h[0] > 0 && h[1] > 0 && h[2] + h[3] == 0, "{h:?}");
    // min_p ≥ 1 keeps only the max.
    let mut s = Sampler::new(params(|p| p.min_p = 5.0), 4);
    let h = histogram(&mut s, &logits, 1_000);
    assert_eq!(h[0], 1_000);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let run = |seed: u64| {
        let mut s = Sampler::new(
            params(|p| {
                p.seed = Some(seed);
                p.temperature = 1.3;
                p.top_p = 0.95;
            }),
            64,
        );
        (0..100)
            .map(|step| s.sample(&random_logits(step, 64, 2.0)).id)
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // Unseeded samplers work (and are almost surely different).
    let mut a = Sampler::new(SamplingParams::default(), 64);
    let mut b = Sampler::new(SamplingParams::default(), 64);
    let l = vec![0.0f32; 64];
    let sa: Vec<u32> = (0..100).map(|_| a.sample(&l).id).collect();
    let sb: Vec<u32> = (0..100).map(|_| b.sample(&l).id).collect();
    assert_ne!(sa, sb);
}

#[test]
fn empirical_distribution_matches_softmax() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let logits: Vec<f32> = ln_probs(&probs).iter().map(|x| x + 3.0).collect();
    let mut s = Sampler::new(params(|_| {}), 4);
    let draws = 20_000;
    let h = histogram(&mut s, &logits, draws);
    for (c, p) in h.iter().zip(probs) {
        // σ ≤ sqrt(0.25 / 20000) ≈ 0.0035; allow ~4σ.
        let f = *c as f64 / draws as f64;
        assert!((f - p).abs() < 0.015, "{h:?}");
    }
    // Temperature 2 flattens: p ∝ sqrt(probs).
    let mut s = Sampler::new(params(|p| p.temperature = 2.0), 4);
    let h = histogram(&mut s, &logits, draws);
    let r: Vec<f64> = probs.iter().map(|p: &f64| p.sqrt()).collect();
    let rz: f64 = r.iter().sum();
    for (c, p) in h.iter().zip(r) {
        assert!((*c as f64 / draws as f64 - p / rz).abs() < 0.015, "{h:?}");
    }
}

#[test]
fn presence_and_frequency_penalties_change_the_argmax() {
    let logits = [2.0f32, 1.5, 1.0, 0.0];
    // Frequency 0.4, greedy: [2,1.5,1,0] → 0; [1.6,1.5,..] → 0; [1.2,1.5] → 1;
    // [1.2,1.1,1.0] → 0; [0.8,1.1,1.0] → 1; [0.8,0.7,1.0] → 2.
    let mut s = Sampler::new(
        SamplingParams {
            frequency_penalty: 0.4,
            ..SamplingParams::greedy()
        },
        4,
    );
    let ids: Vec<u32> = (0..6).map(|_| s.sample(&logits).id).collect();
    assert_eq!(ids, vec![0, 0, 1, 0, 1, 2]);
    assert_eq!(
        (s.count(0), s.count(1), s.count(2), s.count(3)),
        (3, 2, 1, 0)
    );

    // Presence 0.8 does not grow with the count: [2,1.5,..] → 0; [1.2,1.5] → 1;
    // then [1.2,0.7,1.0,0] → 0 for good (frequency 0.8 would move on to 2).
    let mut s = Sampler::new(
        SamplingParams {
            presence_penalty: 0.8,
            logprobs: Some(1),
            ..SamplingParams::greedy()
        },
        4,
    );
    let ids: Vec<u32> = (0..5).map(|_| s.sample(&logits).id).collect();
    assert_eq!(ids, vec![0, 1, 0, 0, 0]);
    // Reported logprobs stay those of the raw logits.
    let t = s.sample(&logits);
    assert_eq!(t.top_logprobs[0].0, 0);
    assert!((t.logprob as f64 - log_softmax(&logits)[0]).abs() < 1e-6);

    // Replayed tokens (observe) count like sampled ones; negative penalties boost.
    let mut s = Sampler::new(
        SamplingParams {
            presence_penalty: 0.6,
            ..SamplingParams::greedy()
        },
        4,
    );
    s.observe(0);
    assert_eq!(s.sample(&logits).id, 1); // 1.4 < 1.5
    let mut s = Sampler::new(
        SamplingParams {
            frequency_penalty: -0.6,
            ..SamplingParams::greedy()
        },
        4,
    );
    s.observe(2);
    // Token 2: 1.0 + 0.6 = 1.6 < 2.0.
    assert_eq!(s.sample(&logits).id, 0);
    s.observe(2);
    s.observe(2);
    // Token 2: 1.0 + 3 × 0.6 = 2.8 > token 0: 2.0 + 0.6 = 2.6.
    assert_eq!(s.sample(&logits).id, 2);
    // Out-of-range observed ids are harmless.
    s.observe(u32::MAX);
    assert!(s.sample(&logits).id < 4);
}

#[test]
fn sampler_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Sampler>();
}

#[test]
fn sample_observes_exactly_once() {
    let mut s = Sampler::new(params(|_| {}), 8);
    let l = random_logits(5, 8, 1.0);
    let mut total = 0;
    for _ in 0..100 {
        s.sample(&l);
        total += 1;
        let sum: u32 = (0..8).map(|i| s.count(i)).sum();
        assert_eq!(sum, total);
    }
}

#[test]
fn never_panics_on_degenerate_input() {
    let rows: Vec<Vec<f32>> = vec![
        vec![],
        vec![f32::NAN; 7],
        vec![f32::NEG_INFINITY; 7],
        vec![f32::NAN, f32::INFINITY, 1.0, f32::INFINITY],
        vec![f32::MAX, -f32::MAX, f32::MAX, 0.0],
        vec![1e30, -1e30, f32::NAN, f32::NEG_INFINITY],
        vec![3.0],
    ];
    let knobs: Vec<SamplingParams> = vec![
        SamplingParams::greedy(),
        params(|_| {}),
        params(|p| p.temperature = f32::NAN),
        params(|p| p.temperature = f32::INFINITY),
        params(|p| p.temperature = -1.0),
        params(|p| p.temperature = 1e-5),
        params(|p| {
            p.top_k = usize::MAX;
            p.top_p = f32::NAN;
            p.min_p = f32::NAN;
        }),
        params(|p| {
            p.top_k = 2;
            p.top_p = 0.5;
            p.min_p = 0.5;
            p.logprobs = Some(usize::MAX);
        }),
        params(|p| {
            p.presence_penalty = f32::NAN;
            p.frequency_penalty = f32::INFINITY;
            p.top_p = 0.9;
        }),
        params(|p| {
            p.frequency_penalty = 1e38;
            p.presence_penalty = -1e38;
            p.min_p = 0.1;
        }),
    ];
    for kp in &knobs {
        for row in &rows {
            let mut s = Sampler::new(kp.clone(), row.len());
            for _ in 0..20 {
                let t = s.sample(row);
                assert!(row.is_empty() || (t.id as usize) < row.len());
                assert!(!t.logprob.is_nan(), "{kp:?} {row:?} {t:?}");
                assert!(t.top_logprobs.iter().all(|x| !x.1.is_nan()));
            }
        }
    }
    // A NaN is never picked while a real logit exists.
    let mut s = Sampler::new(params(|p| p.temperature = 100.0), 3);
    for _ in 0..200 {
        assert_eq!(s.sample(&[f32::NAN, 0.0, f32::NAN]).id, 1);
    }
    // +inf logits share the mass; everything else gets none.
    let mut s = Sampler::new(params(|_| {}), 4);
    let h = histogram(&mut s, &[0.0, f32::INFINITY, 5.0, f32::INFINITY], 2_000);
    assert!(h[0] + h[2] == 0 && h[1] > 0 && h[3] > 0, "{h:?}");
    // A fully masked row is uniform, logprob -ln(n).
    let mut s = Sampler::new(params(|_| {}), 4);
    let t = s.sample(&[f32::NEG_INFINITY; 4]);
    assert!((t.logprob - -(4.0f32).ln()).abs() < 1e-6);
}

#[test]
fn repetition_penalty_counts_prompt_and_output_tokens_once() {
    let rep = |r: f32| SamplingParams {
        repetition_penalty: r,
        ..SamplingParams::greedy()
    };
    let logits = [2.0f32, 1.9, -1.0, 0.5];
    // The prompt's token 0 drops to 1.0: token 1 (1.9) wins.
    let mut s = Sampler::new(rep(2.0), 4).with_prompt(&[0, 0, 3]);
    assert_eq!(s.sample(&logits).id, 1);
    s.observe(1);
    // Now 1 is seen too (1.9 / 2 = 0.95) and 0 is divided once, not twice.
    assert_eq!(s.sample(&logits).id, 0);
    // Negative logits are multiplied: -0.5 -> -1.0 loses to -0.6.
    let mut s = Sampler::new(rep(2.0), 2).with_prompt(&[0]);
    assert_eq!(s.sample(&[-0.5, -0.6]).id, 1);
    // 1.0 (or nonsense) is off: the prompt is not even kept.
    for r in [1.0, 0.0, f32::NAN] {
        let mut s = Sampler::new(rep(r), 4).with_prompt(&[0]);
        assert_eq!(s.sample(&logits).id, 0, "{r}");
    }
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let biased = |bias: Vec<(u32, f32)>, t: f32| SamplingParams {
        logit_bias: bias,
        temperature: t,
        seed: Some(4),
        ..SamplingParams::default()
    };
    let logits = [1.0f32, 0.9, 0.5, f32::NEG_INFINITY];
    assert_eq!(
        Sampler::new(biased(vec![(2, 100.0)], 0.0), 4)
            .sample(&logits)
            .id,
        2
    );
    assert_eq!(
        Sampler::new(biased(vec![(0, -100.0)], 0.0), 4)
            .sample(&logits)
            .id,
        1
    );
    // A masked (-inf) token stays out whatever its bias; ids past the row are ignored.
    let mut s = Sampler::new(biased(vec![(3, 100.0), (9, 100.0), (0, -100.0)], 1.0), 4);
    for _ in 0..200 {
        let id = s.sample(&logits).id;
        assert!(id == 1 || id == 2, "{id}");
    }
}
