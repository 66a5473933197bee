//! A batch that mixes a prefill chunk of A, a decode step of B and the second
//! prefill chunk of C gives the same logits, bit for bit, as running each alone; sequences in one
//! batch never see each other's tokens; chunked prefill equals one-piece prefill.

mod common;
use common::*;
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::{LlamaRunner, Precision};

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 100 + (i * 7919 + seed * 104729) % 20000)
        .collect()
}

fn run(runner: &mut LlamaRunner, batch: &Batch) -> Logits {
    let mut out = Logits::default();
    runner.execute(batch, &mut out).unwrap();
    out
}

fn table(first: u32, n: usize) -> Vec<u32> {
    (first..first + n as u32).collect()
}

/// Returns (alone rows, mixed rows) for A, B, C.
fn alone_and_mixed(precision: Precision) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut r = load_runner(precision);
    let (a, b, c) = (prompt(1, 40), prompt(2, 20), prompt(3, 50));
    let b_next = 4242u32;
    let (ta, tb, tc) = (table(0, 4), table(10, 4), table(20, 4));
    let mut alone = Vec::new();
    let mut batch = Batch::default();
    batch.push(&a, 0, &ta[..3], true);
    alone.push(run(&mut r, &batch).row(0).to_vec());
    batch.clear();
    batch.push(&b, 0, &tb[..2], false);
    run(&mut r, &batch);
    batch.clear();
    batch.push(&[b_next], 20, &tb[..2], true);
    alone.push(run(&mut r, &batch).row(0).to_vec());
    batch.clear();
    batch.push(&c, 0, &tc[..4], true);
    alone.push(run(&mut r, &batch).row(0).to_vec());

    // Fresh runner, other blocks: B prefilled, C's first half prefilled, then one mixed batch.
    let mut r = load_runner(precision);
    let (ta, tb, tc) = (table(30, 4), table(40, 4), table(50, 4));
    batch.clear();
    batch.push(&b, 0, &tb[..2], false);
    batch.push(&c[..25], 0, &tc[..2], false);
    run(&mut r, &batch);
    batch.clear();
    batch.push(&a, 0, &ta[..3], true);
    batch.push(&[b_next], 20, &tb[..2], true);
    batch.push(&c[25..], 25, &tc[..4], true);
    let mixed = run(&mut r, &batch);
    assert_eq!(mixed.num_rows(), 3);
    (alone, (0..3).map(|i| mixed.row(i).to_vec()).collect())
}

fn max_abs_diff(x: &[f32], y: &[f32]) -> f32 {
    x.iter()
        .zip(y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Every precision is batch-invariant: each row's logits in the mixed batch equal,
/// bit for bit, its logits alone (one kernel per weight matrix whatever the batch,
/// each output summed in one order).
#[test]
fn mixed_batch_equals_each_alone_bit_for_bit() {
    for precision in [Precision::Exact, Precision::Fast] {
        let (alone, mixed) = alone_and_mixed(precision);
        for (i, name) in ["A prefill", "B decode", "C second chunk"]
            .iter()
            .enumerate()
        {
            let d = max_abs_diff(&alone[i], &mixed[i]);
            println!("{precision:?} {name}: max abs logit difference {d:e}");
            assert_eq!(
                alone[i], mixed[i],
                "{precision:?} {name}: max abs difference {d}"
            );
        }
    }
}

/// Chunked prefill gives the same logits and tokens as one piece, bit for bit, in
/// every precision.
#[test]
fn chunked_prefill_equals_one_piece() {
    for precision in [Precision::Exact, Precision::Fast] {
        let mut r = load_runner(precision);
        let p = prompt(9, 100);
        let (whole, rows_whole) = greedy(&mut r, &p, 4, 0);
        for chunk in [1, 16, 37] {
            let (out, rows) = greedy(&mut r, &p, 4, chunk);
            let d = max_abs_diff(&rows[0], &rows_whole[0]);
            println!("{precision:?} chunk {chunk}: max abs logit difference {d:e}");
            assert_eq!(out, whole, "{precision:?} chunk {chunk}");
            assert_eq!(
                rows, rows_whole,
                "{precision:?} chunk {chunk}: max abs difference {d}"
            );
        }
    }
}

#[test]
fn invalid_batches_are_errors_not_panics() {
    let mut r = load_runner(Precision::Fast);
    let mut out = Logits::default();
    let mut batch = Batch::default();
    batch.push(&[1, 2, 3], 0, &[], true); // no block table
    assert!(r.execute(&batch, &mut out).is_err());
    batch.clear();
    batch.push(&[u32::MAX], 0, &[0], true); // token outside the vocabulary
    assert!(r.execute(&batch, &mut out).is_err());
    batch.clear();
    batch.push(&[1], 0, &[u32::MAX], true); // block outside the cache
    assert!(r.execute(&batch, &mut out).is_err());
}
