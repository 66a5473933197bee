//! Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 tensors, a SentencePiece vocabulary
//! of 262,144 tokens, sliding-window attention) against llama.cpp's records: the
//! tokenizer on every record, exact mode within 5e-3 of the F32 records with every
//! greedy continuation equal (the long prompts past the 512-token window in one piece,
//! in 64-token chunks and over reused prefix blocks), and fast mode at least as close
//! to the exact records as llama.cpp's own Q4_K_M path.

mod common;

use candle_core::quantized::gguf_file::Content;
use common::*;
use sloserve_engine::{Batch, Logits, ModelRunner};
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{GgufFile, Precision};

use std::sync::{Mutex, MutexGuard};

const EXACT: &str = "llamacpp-f32-greedy-gemma3.jsonl";
const LLAMACPP_FAST: &str = "llamacpp-q4_k_m-greedy-gemma3.jsonl";

/// Serialises the tests that load the model (about 1.1 GB each in exact precision),
/// keeping memory bounded on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tokenizer() -> Tokenizer {
    let mut file = std::fs::File::open(gemma3_path()).expect("open Gemma 3");
    let content = Content::read(&mut file).expect("Gemma 3 is valid GGUF");
    Tokenizer::from_gguf(&content).expect("SentencePiece tokenizer builds")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    let arr = v.as_array().expect("id array");
    arr.iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn tokenizer_metadata() {
    let tok = tokenizer();
    assert_eq!(tok.model(), "llama");
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(2), Some(1)));
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.token_bytes(107), b"\n".to_vec());
    let stops = tok.stop_token_ids();
    assert!(stops.contains(&1) && stops.contains(&106), "{stops:?}");
}

/// Every `/tokenize` record (special tokens parsed, no BOS) and its round trip.
#[test]
fn tokenizer_reproduces_llamacpp_tokenize_records() {
    let tok = tokenizer();
    let records = reference_json("llamacpp-tokenize-gemma3.jsonl");
    assert_eq!(records.len(), 31);
    for r in &records {
        let text = r["text"].as_str().expect("text");
        let want = ids(&r["token_ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "tokens of {text:?}");
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
}

/// Every greedy record's prompt (BOS first) and, streamed piece by piece, its text.
#[test]
fn tokenizer_reproduces_greedy_prompts_and_streams_their_text() {
    let tok = tokenizer();
    for name in [EXACT, LLAMACPP_FAST] {
        for r in reference_json(name) {
            let input = r["input"].as_str().expect("completion prompt");
            let want = ids(&r["prompt_token_ids"]);
            assert_eq!(
                tok.encode_prompt(input).unwrap(),
                want,
                "{name} {}",
                r["id"]
            );
            let mut dec = StreamDecoder::new(false);
            let mut text = String::new();
            for id in ids(&r["greedy_token_ids"]) {
                text.push_str(dec.push(&tok, id));
            }
            text.push_str(&dec.flush());
            assert_eq!(
                text,
                r["greedy_text"].as_str().unwrap(),
                "{name} {}",
                r["id"]
            );
        }
    }
}

fn split(records: Vec<GreedyRecord>) -> (Vec<GreedyRecord>, Vec<GreedyRecord>) {
    records
        .into_iter()
        .partition(|r| r.prompt_token_ids.len() < 512)
}

/// Exact mode: step-0 top-5 within 5e-3 and the greedy continuation equal on every
/// other short prompt (the rest in `make test-slow`); the long ones (past the window)
/// in 64-token chunks.
#[test]
fn exact_matches_reference() {
    exact_short_and_long(Share::MakeTest);
}

/// The other short prompts (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_rest() {
    exact_short_and_long(Share::Slow);
}

fn exact_short_and_long(share: Share) {
    let _one_at_a_time = serial();
    let mut runner = load_gemma3(Precision::Exact);
    let (short, long) = split(read_records(EXACT));
    assert_eq!((short.len(), long.len()), (7, 2));
    let mut worst = 0f32;
    for rec in &share.of(short) {
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, 32, 0);
        let err = top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        worst = worst.max(err);
        println!("{}: step-0 top-5 logprob error {err:.2e}", rec.id);
        assert!(err < 5e-3, "{}: step-0 top-5 logprob error {err}", rec.id);
        assert_eq!(out, rec.greedy_token_ids, "{}: greedy differs", rec.id);
    }
    // The long prompts in 64-token chunks with `make test`'s share; in one piece in
    // the slow suite.
    if share == Share::MakeTest {
        worst = worst.max(exact_long(&mut runner, &long, 64));
    }
    println!("exact: largest step-0 top-5 logprob error {worst:.2e}");
}

/// The long prompts prefilled in one piece (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_long_prompts_whole() {
    let _one_at_a_time = serial();
    let mut runner = load_gemma3(Precision::Exact);
    let (_, long) = split(read_records(EXACT));
    exact_long(&mut runner, &long, 0);
}

/// Greedy-equal and step 0 within 5e-3 on the long records, prefilled in
/// `chunk`-token pieces (0: whole); the largest error.
fn exact_long(
    runner: &mut sloserve_model::LlamaRunner,
    long: &[GreedyRecord],
    chunk: usize,
) -> f32 {
    let mut worst = 0f32;
    for rec in long {
        let (out, rows) = greedy(runner, &rec.prompt_token_ids, 16, chunk);
        let err = top5_error(&rows[0], &rec.top5_logprobs_per_step[0]);
        worst = worst.max(err);
        println!(
            "{} chunk {chunk}: step-0 top-5 logprob error {err:.2e}",
            rec.id
        );
        assert!(err < 5e-3, "{} chunk {chunk}: step-0 error {err}", rec.id);
        assert_eq!(out, rec.greedy_token_ids, "{} chunk {chunk}", rec.id);
    }
    worst
}

/// A long prompt whose first 40 blocks (640 tokens, past the window) were written by
/// an earlier sequence, as the prefix cache hands them over: only the rest is
/// computed, over fresh blocks, and the continuation is the record's. Sliding-window
/// layers keep every block of a sequence, so shared prefix blocks stay valid.
#[test]
fn exact_reuses_prefix_blocks_past_the_window() {
    let _one_at_a_time = serial();
    let mut runner = load_gemma3(Precision::Exact);
    let (_, long) = split(read_records(EXACT));
    let rec = long
        .iter()
        .find(|r| r.prompt_token_ids.len() < 1000)
        .unwrap();
    let prompt = &rec.prompt_token_ids;
    let bs = runner.info().block_size;
    let (mut batch, mut logits) = (Batch::default(), Logits::default());
    // The earlier sequence: the shared prefix on blocks 0..40.
    let shared = 40 * bs;
    let first: Vec<u32> = (0..40).collect();
    batch.push(&prompt[..shared], 0, &first, false);
    runner.execute(&batch, &mut logits).unwrap();
    // The new sequence: blocks 0..40, then blocks from 100 on for the rest.
    let total = prompt.len() + 16;
    let table: Vec<u32> = (0..40)
        .chain(100..100 + (total.div_ceil(bs) - 40) as u32)
        .collect();
    let mut out = Vec::new();
    let mut pos = shared;
    let mut next: Vec<u32> = prompt[shared..].to_vec();
    for _ in 0..16 {
        batch.clear();
        let end = pos + next.len();
        batch.push(&next, pos, &table[..end.div_ceil(bs)], true);
        runner.execute(&batch, &mut logits).unwrap();
        let tok = argmax(logits.row(0));
        out.push(tok);
        (pos, next) = (end, vec![tok]);
    }
    assert_eq!(
        out, rec.greedy_token_ids,
        "{}: greedy over reused blocks",
        rec.id
    );
}

/// Step-0 argmax agreement with the exact records and the mean over prompts of the
/// largest step-0 top-5 logprob error, for logprob rows given per prompt.
fn score(exact: &[GreedyRecord], top5: impl Fn(usize, &TopLogprob) -> Option<f32>) -> f32 {
    let mut sum = 0.0;
    for (i, rec) in exact.iter().enumerate() {
        let err = rec.top5_logprobs_per_step[0]
            .iter()
            .filter_map(|t| top5(i, t).map(|lp| (lp - t.logprob).abs()))
            .fold(0.0, f32::max);
        sum += err;
    }
    sum / exact.len() as f32
}

/// Fast mode (quantized dot products, the packed GEMM for prefill, f16 KV) on the short
/// prompts: step-0 argmax agreement with the exact records at least llama.cpp's own
/// Q4_K_M path's, and a mean largest top-5 error no worse than its.
#[test]
fn fast_is_at_least_as_accurate_as_llamacpp_q4_k_m() {
    let _one_at_a_time = serial();
    let mut runner = load_gemma3(Precision::Fast);
    let (exact, _) = split(read_records(EXACT));
    let (theirs, _) = split(read_records(LLAMACPP_FAST));
    let mut ours = Vec::new();
    let (mut ours_equal, mut theirs_equal) = (0, 0);
    for (rec, fast) in exact.iter().zip(&theirs) {
        assert_eq!(rec.id, fast.id);
        let (out, rows) = greedy(&mut runner, &rec.prompt_token_ids, 1, 0);
        ours_equal += usize::from(out[0] == rec.greedy_token_ids[0]);
        theirs_equal += usize::from(fast.greedy_token_ids[0] == rec.greedy_token_ids[0]);
        ours.push(log_softmax(&rows[0]));
    }
    let ours_err = score(&exact, |i, t| Some(ours[i][t.id as usize]));
    let theirs_err = score(&exact, |i, t| {
        let row = &theirs[i].top5_logprobs_per_step[0];
        row.iter().find(|x| x.id == t.id).map(|x| x.logprob)
    });
    let n = exact.len();
    println!(
        "step-0 argmax equal to exact: sloserve fast {ours_equal}/{n}, llama.cpp Q4_K_M {theirs_equal}/{n}; \
         mean largest top-5 logprob error: sloserve fast {ours_err:.4}, llama.cpp Q4_K_M {theirs_err:.4}"
    );
    assert!(
        ours_equal >= theirs_equal,
        "argmax {ours_equal} < {theirs_equal}"
    );
    assert!(
        ours_err <= theirs_err,
        "error {ours_err} > llama.cpp's {theirs_err}"
    );
}

#[test]
fn inspect_names_architecture_tokenizer_and_tensor_types() {
    let file = GgufFile::open(gemma3_path()).unwrap();
    let out = sloserve_model::inspect::inspect(&file).unwrap();
    for needle in [
        "architecture:    gemma3",
        "heads:           4 query, 1 key/value (head size 256)",
        "sliding window:  512 tokens",
        "tokenizer:       llama (SentencePiece",
        "Q4K      27 tensors",
        "Q5_0     81 tensors",
        "Q6K       9 tensors",
        "Q8_0     10 tensors",
        "F32     109 tensors",
        "chat template:   none",
        "supported:       yes",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}
