//! The attention kernels' tests: each kernel against the portable path, heads inside
//! a group against the head alone, across cache types and instruction sets.
use super::*;
use crate::kernels::cpu::{has_avx512_bf16, require_test_isa};
use crate::kernels::isa_ledger::{route, TestIsa};
use crate::kv_cache::KvDtype;

/// Head size: the f16 kernel's 32-dimension tiles.
const HD: usize = 32;
/// Query heads' width.
const QW: usize = 6 * HD;
const SHAPE: AttnShape = AttnShape {
    num_heads: 6,
    num_kv_heads: 2,
    head_dim: HD,
    scale: 0.25,
    window: None,
};
const KV: usize = 2 * HD;
const BS: usize = 4;

fn val(i: usize, seed: usize) -> f32 {
    ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0
}

/// Key (or value, seed + 1) vector of sequence `s` at position `j`.
fn kv(s: usize, j: usize, seed: usize) -> Vec<f32> {
    (0..KV).map(|i| val(i + 64 * j, seed + 10 * s)).collect()
}

/// `x` as a quantized cache holds it (the quantizer's values, exactly); f32 and
/// f16 as given (f16's rounding is the tolerance's).
fn stored(dtype: KvDtype, x: Vec<f32>) -> Vec<f32> {
    fn round<B: KvBlock>(x: &[f32]) -> Vec<f32> {
        let mut b = crate::kv_quant::zeroed::<B>(x.len() / QK);
        crate::kv_quant::quantize_row(&mut b, x);
        (0..x.len()).map(|i| b[i / QK].value(i % QK)).collect()
    }
    match dtype {
        KvDtype::Q8_0 => round::<BlockQ8_0>(&x),
        KvDtype::Q4_0 => round::<BlockQ4_0>(&x),
        _ => x,
    }
}

/// Sequence 0 prefills positions 7..10 over blocks [3, 0, 7]; sequence 1 decodes
/// position 5 over blocks [5, 1].
fn setup(dtype: KvDtype) -> (Batch, Vec<u32>, Vec<f32>, KvCache) {
    let tables = [vec![3u32, 0, 7], vec![5u32, 1]];
    let mut cache = KvCache::new(1, KV, BS, 8, dtype);
    for (s, (table, last)) in tables.iter().zip([9usize, 5]).enumerate() {
        for j in 0..=last {
            let slot = cache.slot(table, j);
            cache.write(0, slot, &kv(s, j, 1), &kv(s, j, 2));
        }
    }
    let mut batch = Batch::default();
    batch.push(&[1, 2, 3], 7, &tables[0], true);
    batch.push(&[4], 5, &tables[1], true);
    let q = (0..4 * QW).map(|i| val(i, 77)).collect();
    (batch, vec![0, 0, 0, 1], q, cache)
}

/// Softmax attention computed directly from the generators, in f64, over the
/// last `window` positions.
fn reference(q: &[f32], window: usize, dtype: KvDtype, sinks: Option<&[f32]>) -> Vec<f32> {
    let kv = |s, j, seed| stored(dtype, kv(s, j, seed));
    let mut out = vec![0f32; 4 * QW];
    for (t, (s, pos)) in [(0, 7), (0, 8), (0, 9), (1, 5)].into_iter().enumerate() {
        for h in 0..6 {
            let off = (h / 3) * HD;
            let qh = &q[t * QW + h * HD..][..HD];
            let first = (pos + 1_usize).saturating_sub(window);
            let scores: Vec<f64> = (first..=pos)
                .map(|j| {
                    let k = kv(s, j, 1);
                    (0..HD).map(|i| (qh[i] * k[off + i]) as f64).sum::<f64>() / 4.0
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let sink = sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h]));
            let max = max.max(sink);
            let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum::<f64>() + (sink - max).exp();
            for i in 0..HD {
                let o: f64 = (first..=pos)
                    .map(|j| (scores[j - first] - max).exp() / sum * kv(s, j, 2)[off + i] as f64)
                    .sum();
                out[t * QW + h * HD + i] = o as f32;
            }
        }
    }
    out
}

#[test]
fn paged_gqa_attention_matches_a_direct_softmax() {
    let cases = [
        (KvDtype::F32, 1e-5),
        (KvDtype::F16, 2e-3),
        (KvDtype::Q8_0, 1e-5),
        (KvDtype::Q4_0, 1e-5),
    ];
    for (dtype, tol) in cases {
        // No window, and a window of 3 that cuts every token's context.
        for window in [None, Some(3)] {
            let (batch, token_seq, q, cache) = setup(dtype);
            let mut out = vec![f32::NAN; 4 * QW];
            let shape = AttnShape { window, ..SHAPE };
            paged_attention(&batch, &token_seq, &q, &cache, 0, shape, &mut out);
            let want = reference(&q, window.unwrap_or(usize::MAX), dtype, None);
            for (i, (a, b)) in out.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{dtype:?} {window:?} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

/// Sinks: each head's logit joins its denominator (one larger than every score,
/// so the maximum is the sink's), windowed or not, every cache type (a quantized
/// cache's sinks take the portable softmax).
#[test]
fn sinks_join_each_heads_denominator() {
    let sinks = [0.5f32, -1.0, 2.0, 0.0, 9.0, -0.3];
    let cases = [
        (KvDtype::F32, 1e-5),
        (KvDtype::F16, 2e-3),
        (KvDtype::Q8_0, 1e-5),
        (KvDtype::Q4_0, 1e-5),
    ];
    for (dtype, tol) in cases {
        for window in [None, Some(3)] {
            let (batch, token_seq, q, cache) = setup(dtype);
            let mut out = vec![f32::NAN; 4 * QW];
            let shape = AttnShape { window, ..SHAPE };
            let s = Some(&sinks[..]);
            paged_attention_sinks(&batch, &token_seq, &q, &cache, 0, shape, s, &mut out);
            let want = reference(&q, window.unwrap_or(usize::MAX), dtype, s);
            for (i, (a, b)) in out.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{dtype:?} {window:?} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

/// A sequence's values paired once for the step give each token's heads bit for
/// bit what the token computes alone, at odd and even key counts.
#[test]
fn paired_values_equal_each_token_alone() {
    require_test_isa();
    if !route("attention_paired_bf16", TestIsa::Avx512Bf16) {
        return;
    }
    let (batch, _, _, cache) = setup(KvDtype::F16);
    let (KvData::F16(k), KvData::F16(v)) = (&cache.keys[0], &cache.values[0]) else {
        unreachable!()
    };
    let mut all = Vec::new();
    row_offsets(
        batch.block_table(&batch.seqs[0]),
        (BS, KV, HD),
        (0, 10),
        &mut all,
    );
    let mut lines = Vec::new();
    // SAFETY: the CPU has AVX-512 BF16; HD is 32; the rows lie inside the cache.
    let pairs = unsafe { pair_values(v, &all, HD, &mut lines) };
    assert_eq!(pairs, 5);
    let q: Vec<f32> = (0..6 * HD).map(|i| val(i, 93)).collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for n in [1, 7, 8, 9, 10] {
        let task = |paired| Task {
            q: &q,
            keys: k,
            values: v,
            rows: &all[..n],
            head_dim: HD,
            scale: 0.25,
            paired,
            sinks: None,
        };
        let mut scores = Vec::new();
        let mut alone = vec![f32::NAN; 6 * HD];
        task(None).attend(&mut scores, &mut alone);
        let mut with = vec![f32::NAN; 6 * HD];
        let paired = Paired {
            lines: &lines,
            pairs,
        };
        task(Some(paired)).attend(&mut scores, &mut with);
        assert_eq!(bits(&with), bits(&alone), "{n} keys");
    }
}

#[test]
fn f16_kernel_equals_the_portable_path() {
    require_test_isa();
    // The kernel takes the BF16 route where it can, else the AVX2 one.
    if !route("attention_f16", TestIsa::Avx512Bf16) && !route("attention_f16", TestIsa::Avx2) {
        eprintln!("no AVX2: the portable path only");
    }
    let (batch, _, _, cache) = setup(KvDtype::F16);
    let (KvData::F16(k), KvData::F16(v)) = (&cache.keys[0], &cache.values[0]) else {
        unreachable!()
    };
    let s = &batch.seqs[0];
    // Groups of 1-8 query heads (each register tile height, and groups split
    // into two tiles); 7 keys (three pairs and one left over) and 6.
    let q: Vec<f32> = (0..MAX_GROUP * HD).map(|i| val(i, 91)).collect();
    // Without sinks, and with one per head (the first above every score).
    let sink_logits: Vec<f32> = (0..MAX_GROUP).map(|h| [9.0, -1.0, 0.5][h % 3]).collect();
    for (first, sinks) in [3, 4]
        .into_iter()
        .flat_map(|f| [(f, None), (f, Some(&sink_logits[..]))])
    {
        let mut rows = Vec::new();
        row_offsets(batch.block_table(s), (BS, KV, HD), (first, 10), &mut rows);
        let task = |group| Task {
            q: &q[..group * HD],
            keys: k,
            values: v,
            rows: &rows,
            head_dim: HD,
            scale: 0.25,
            paired: None,
            sinks: sinks.map(|s| &s[..group]),
        };
        let mut scores = Vec::new();
        // Each head alone, the reference for the head inside any group.
        let alone: Vec<Vec<f32>> = (0..MAX_GROUP)
            .map(|h| {
                let one = Task {
                    q: &q[h * HD..][..HD],
                    sinks: sinks.map(|s| &s[h..h + 1]),
                    ..task(1)
                };
                let mut o = vec![f32::NAN; HD];
                one.attend(&mut scores, &mut o);
                o
            })
            .collect();
        // With AVX-512 BF16 the weights and values are multiplied in bf16 (8
        // significant bits: within 2^-8 of each product, values here within 1).
        let tol = if has_avx512_bf16() { 4e-3 } else { 1e-5 };
        for group in 1..=MAX_GROUP {
            let task = task(group);
            let mut portable = vec![0f32; group * HD];
            attend(&task, &mut scores, &mut portable);
            let mut fast = vec![f32::NAN; group * HD];
            task.attend(&mut scores, &mut fast);
            for (a, b) in fast.iter().zip(&portable) {
                assert!((a - b).abs() <= tol, "group {group}: {a} vs {b}");
            }
            for (h, head) in fast.chunks_exact(HD).enumerate() {
                let same = head
                    .iter()
                    .zip(&alone[h])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "head {h} of a group of {group} differs from the head alone"
                );
            }
        }
    }
}

/// The AVX2 kernel on q8_0 and q4_0 blocks equals the portable path (values read
/// one at a time) up to f32 summation order, and each head inside any group
/// equals, bit for bit, the head alone.
#[test]
fn quant_kernel_equals_the_portable_path() {
    require_test_isa();
    fn check<B: KvBlock + KvElem + QuantRows>(k: &[B], v: &[B], batch: &Batch)
    where
        for<'a> Task<'a, B>: Attend,
    {
        let s = &batch.seqs[0];
        let q: Vec<f32> = (0..MAX_GROUP * HD).map(|i| val(i, 91)).collect();
        for first in [3, 4] {
            let mut rows = Vec::new();
            // Block offsets: KV / QK blocks a slot, the second KV head's at HD / QK.
            row_offsets(
                batch.block_table(s),
                (BS, KV / QK, HD / QK),
                (first, 10),
                &mut rows,
            );
            let task = |group| Task {
                q: &q[..group * HD],
                keys: k,
                values: v,
                rows: &rows,
                head_dim: HD,
                scale: 0.25,
                paired: None,
                sinks: None,
            };
            let mut scores = Vec::new();
            let alone: Vec<Vec<f32>> = (0..MAX_GROUP)
                .map(|h| {
                    let one = Task {
                        q: &q[h * HD..][..HD],
                        ..task(1)
                    };
                    let mut o = vec![f32::NAN; HD];
                    one.attend(&mut scores, &mut o);
                    o
                })
                .collect();
            for group in 1..=MAX_GROUP {
                let task = task(group);
                let mut portable = vec![0f32; group * HD];
                attend(&task, &mut scores, &mut portable);
                let mut fast = vec![f32::NAN; group * HD];
                task.attend(&mut scores, &mut fast);
                for (a, b) in fast.iter().zip(&portable) {
                    assert!((a - b).abs() <= 1e-5, "group {group}: {a} vs {b}");
                }
                for (h, head) in fast.chunks_exact(HD).enumerate() {
                    let same = head
                        .iter()
                        .zip(&alone[h])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "head {h} of a group of {group} differs from alone");
                }
            }
        }
    }
    if !route("attention_quant", TestIsa::Avx2) {
        eprintln!("no AVX2: the portable path only");
    }
    let (batch, _, _, cache) = setup(KvDtype::Q8_0);
    let (KvData::Q8_0(k), KvData::Q8_0(v)) = (&cache.keys[0], &cache.values[0]) else {
        unreachable!()
    };
    check(k, v, &batch);
    let (batch, _, _, cache) = setup(KvDtype::Q4_0);
    let (KvData::Q4_0(k), KvData::Q4_0(v)) = (&cache.keys[0], &cache.values[0]) else {
        unreachable!()
    };
    check(k, v, &batch);
}
