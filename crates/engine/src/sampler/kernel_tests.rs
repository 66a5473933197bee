//! Unit tests of the sampler kernels: nucleus cuts, key ordering, the fast exp.

use super::*;

pub(super) fn sorted_desc(v: &[f32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..v.len() as u32).collect();
    order.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    order
}

#[test]
fn nucleus_partial_sort_matches_full_sort() {
    for (seed, n) in [(1u64, 10usize), (2, 1000), (3, 20_000), (4, 100_000)] {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut w: Vec<f32> = (0..n).map(|_| rng.random::<f32>().powi(8)).collect();
        w[n / 2] = w[n / 3]; // a tie
        let z: f64 = w.iter().map(|&x| x as f64).sum();
        let full = sorted_desc(&w);
        for top_p in [0.0, 0.01, 0.3, 0.9, 0.999, 2.0] {
            let target = top_p * z;
            let mut keys: Vec<u64> = (0..n as u32).map(|i| desc_key(w[i as usize], i)).collect();
            let (cut, _) = nucleus_len(&mut keys, &w, target);
            let mut cum = 0.0;
            let mut want = n;
            for (j, &i) in full.iter().enumerate() {
                cum += w[i as usize] as f64;
                if cum >= target {
                    want = j + 1;
                    break;
                }
            }
            assert_eq!(cut, want, "n={n} top_p={top_p}");
            let got: Vec<u32> = keys[..cut].iter().map(|&k| key_id(k) as u32).collect();
            assert_eq!(got, full[..cut]);
        }
    }
}

#[test]
fn nucleus_dense_matches_reference() {
    use std::collections::BTreeSet;
    for (seed, n, power) in [
        (1u64, 10usize, 1i32),
        (2, 1000, 8),
        (3, 50_000, 30),
        (4, 50_000, 1),
        (5, 5, 0),
        (6, 20_000, 200),
    ] {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut w: Vec<f32> = (0..n).map(|_| rng.random::<f32>().powi(power)).collect();
        let best = rng.random_range(1..n);
        w[best] = 1.0;
        w[0] = 0.0;
        let z: f64 = w.iter().map(|&x| x as f64).sum();
        let order = sorted_desc(&w);
        for top_p in [0.0, 1e-6, 0.2, 0.5, 0.9, 0.99, 0.999_999] {
            for min_p in [0.0f32, 1e-3, 0.3] {
                let target = top_p * z;
                let mut cum = 0.0;
                let mut cut = n;
                for (j, &i) in order.iter().enumerate() {
                    cum += w[i as usize] as f64;
                    if cum >= target {
                        cut = j + 1;
                        break;
                    }
                }
                let want: BTreeSet<u32> = order[..cut]
                    .iter()
                    .copied()
                    .filter(|&i| w[i as usize] > 0.0 && w[i as usize] >= min_p)
                    .collect();
                let mut keys = Vec::new();
                nucleus_dense(&w, &mut keys, min_p, target, None);
                let got: BTreeSet<u32> = keys.iter().map(|&k| key_id(k) as u32).collect();
                assert_eq!(got.len(), keys.len());
                assert_eq!(got, want, "seed={seed} top_p={top_p} min_p={min_p}");
            }
        }
    }
}

#[test]
fn desc_key_orders_by_value_then_id() {
    let v = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        1e-40,
        -1e-40,
        1.0,
        3.5,
    ];
    let mut keys: Vec<u64> = (0..v.len() as u32)
        .map(|i| desc_key(v[i as usize], i))
        .collect();
    keys.sort_unstable();
    let got: Vec<u32> = keys.iter().map(|&k| key_id(k) as u32).collect();
    // -0.0 counts as +0.0 (tie → lower id).
    assert_eq!(got, vec![7, 5, 11, 2, 10, 8, 0, 1, 9, 3, 6, 4]);
}

#[test]
fn fast_exp_is_accurate() {
    let mut worst = 0.0f64;
    let mut x = -87.0f32;
    while x <= 88.0 {
        let want = (x as f64).exp();
        let rel = ((fast_exp(x) as f64 - want) / want).abs();
        worst = worst.max(rel);
        x += 0.001_37;
    }
    assert!(worst < 3e-7, "worst relative error {worst}");
    assert_eq!(fast_exp(0.0), 1.0);
    assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(fast_exp(-100.0), 0.0);
    assert!(fast_exp(f32::INFINITY).is_finite());
}
