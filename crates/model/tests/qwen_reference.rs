//! Qwen2.5-Coder-0.5B-Instruct (Q4_K_M: Q5_0, Q4_K, Q6_K, Q8_0, q/k/v biases, a byte-level BPE
//! vocabulary of 151,936 tokens) against llama.cpp's records: the tokenizer on every record,
//! the chat template byte for byte, exact mode within 2e-3 of the F32 records on every
//! step's top-5 logprobs and greedy-equal (the long prompt in one piece and in chunks), and
//! fast mode (`int8` is its other name) at least as close to the exact records as llama.cpp's
//! own Q4_K_M path.

mod common;

use candle_core::quantized::gguf_file::Content;
use common::*;
use sloserve_model::chat_template::{ChatMessage, ChatTemplate};
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{GgufFile, Precision};

use std::sync::{Mutex, MutexGuard};

const EXACT: &str = "llamacpp-f32-greedy-qwen0.5b.jsonl";
const LLAMACPP_FAST: &str = "llamacpp-q4_k_m-greedy-qwen0.5b.jsonl";
/// `<|endoftext|>` and `<|im_end|>`: where llama.cpp's records stop (kept as their last id).
const STOPS: [u32; 2] = [151_643, 151_645];
/// The exact-mode bound on any top-5 logprob of any step.
const EXACT_TOL: f32 = 2e-3;

/// Serialises the tests that load the model, keeping memory bounded on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn content() -> Content {
    let mut file = std::fs::File::open(qwen05_path()).expect("open Qwen 0.5B");
    Content::read(&mut file).expect("Qwen 0.5B is valid GGUF")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    let arr = v.as_array().expect("id array");
    arr.iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn tokenizer_metadata() {
    let tok = Tokenizer::from_gguf(&content()).expect("BPE tokenizer builds");
    assert_eq!((tok.model(), tok.pre_tokenizer_name()), ("gpt2", "qwen2"));
    assert_eq!(tok.vocab_size(), 151_936);
    assert_eq!(tok.eos_id(), Some(151_645));
    assert!(!tok.add_bos() && !tok.add_eos());
    let stops = tok.stop_token_ids();
    assert!(STOPS.iter().all(|s| stops.contains(s)), "{stops:?}");
}

/// Every `/tokenize` record (special tokens parsed, nothing added) and its round trip.
#[test]
fn tokenizer_reproduces_llamacpp_tokenize_records() {
    let tok = Tokenizer::from_gguf(&content()).unwrap();
    let records = reference_json("llamacpp-tokenize-qwen0.5b.jsonl");
    assert_eq!(records.len(), 30);
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

/// Every greedy record's prompt and, streamed piece by piece, its text (llama.cpp's
/// `content` leaves out the stop token's text).
#[test]
fn tokenizer_reproduces_greedy_prompts_and_streams_their_text() {
    let tok = Tokenizer::from_gguf(&content()).unwrap();
    for name in [EXACT, LLAMACPP_FAST] {
        for r in reference_json(name) {
            let id = &r["id"];
            let rendered = r["rendered_prompt"].as_str().expect("rendered prompt");
            let want = ids(&r["prompt_token_ids"]);
            assert_eq!(tok.encode_prompt(rendered).unwrap(), want, "{name} {id}");
            let mut dec = StreamDecoder::new(false);
            let mut text = String::new();
            for id in ids(&r["greedy_token_ids"]) {
                if !STOPS.contains(&id) {
                    text.push_str(dec.push(&tok, id));
                }
            }
            text.push_str(&dec.flush());
            assert_eq!(text, r["greedy_text"].as_str().unwrap(), "{name} {id}");
        }
    }
}

/// The GGUF's chat template renders every chat record as llama.cpp's `/apply-template`
/// did, byte for byte, and the chat encoder gives the record's prompt ids.
#[test]
fn chat_template_renders_as_llamacpp() {
    let content = content();
    let tok = Tokenizer::from_gguf(&content).unwrap();
    let tmpl = ChatTemplate::from_gguf(&content, &tok)
        .unwrap()
        .expect("Qwen has a chat template");
    let mut n = 0;
    for r in reference_json(EXACT)
        .into_iter()
        .filter(|r| r["kind"] == "chat")
    {
        let id = &r["id"];
        let messages: Vec<ChatMessage> =
            serde_json::from_value(r["input"].clone()).expect("chat input is a message list");
        let rendered = tmpl.render(&messages, true).unwrap();
        assert_eq!(rendered, r["rendered_prompt"].as_str().unwrap(), "{id}");
        let encoded = tmpl.encode(&tok, &messages, true, tok.add_bos()).unwrap();
        assert_eq!(
            encoded,
            ids(&r["prompt_token_ids"]),
            "{id}: chat prompt ids"
        );
        n += 1;
    }
    assert_eq!(n, 4, "chat records checked");
}

fn split(records: Vec<GreedyRecord>) -> (Vec<GreedyRecord>, Vec<GreedyRecord>) {
    records
        .into_iter()
        .partition(|r| r.prompt_token_ids.len() < 2000)
}

/// The largest top-5 error over the steps of one continuation.
fn worst_step_error(rows: &[Vec<f32>], rec: &GreedyRecord) -> f32 {
    rows.iter()
        .zip(&rec.top5_logprobs_per_step)
        .map(|(row, want)| top5_error(row, want))
        .fold(0.0, f32::max)
}

/// Exact mode: every step's top-5 within 2e-3 and the greedy continuation equal on every
/// other short prompt (the rest, and the long one over 2,000 tokens, in the slow suite).
#[test]
fn exact_matches_reference() {
    exact_short(Share::MakeTest);
}

/// The other short prompts (`make test-slow`).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_rest() {
    exact_short(Share::Slow);
}

fn exact_short(share: Share) {
    let _one_at_a_time = serial();
    let mut runner = load_qwen05(Precision::Exact);
    let (short, long) = split(read_records(EXACT));
    assert_eq!((short.len(), long.len()), (7, 1));
    let mut worst = 0f32;
    for rec in &share.of(short) {
        let steps = rec.greedy_token_ids.len();
        let (out, rows) = greedy_until(&mut runner, &rec.prompt_token_ids, steps, 0, &STOPS);
        let err = worst_step_error(&rows, rec);
        worst = worst.max(err);
        println!(
            "{}: top-5 logprob error over {steps} steps {err:.2e}",
            rec.id
        );
        assert_eq!(out, rec.greedy_token_ids, "{}: greedy differs", rec.id);
        assert!(err < EXACT_TOL, "{}: top-5 logprob error {err}", rec.id);
    }
    assert_eq!(long.len(), 1);
    println!("exact: largest top-5 logprob error {worst:.2e}");
}

/// The long prompt (2,172 tokens) prefilled in one piece and in 256-token chunks
/// (`make test-slow`: a minute of exact prefill; `make test` checks long prompts in
/// chunks on SmolLM2 in forward_reference.rs and Gemma 3 in gemma3_reference.rs).
#[test]
#[ignore = "slow: make test-slow"]
fn exact_matches_reference_long_prompt_whole_and_chunked() {
    let _one_at_a_time = serial();
    let mut runner = load_qwen05(Precision::Exact);
    let (_, long) = split(read_records(EXACT));
    exact_long(&mut runner, &long, 0);
    exact_long(&mut runner, &long, 256);
}

/// Greedy-equal and within tolerance on the long records, prefilled in `chunk`-token
/// pieces (0: whole); the largest error.
fn exact_long(
    runner: &mut sloserve_model::LlamaRunner,
    long: &[GreedyRecord],
    chunk: usize,
) -> f32 {
    let mut worst = 0f32;
    for rec in long {
        let steps = rec.greedy_token_ids.len();
        let (out, rows) = greedy_until(runner, &rec.prompt_token_ids, steps, chunk, &STOPS);
        let err = worst_step_error(&rows, rec);
        worst = worst.max(err);
        println!("{} chunk {chunk}: top-5 logprob error {err:.2e}", rec.id);
        assert_eq!(out, rec.greedy_token_ids, "{} chunk {chunk}", rec.id);
        assert!(err < EXACT_TOL, "{} chunk {chunk}: error {err}", rec.id);
    }
    worst
}

/// The mean over prompts of the largest step-0 top-5 logprob error against the exact
/// records, for logprobs given per prompt.
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

/// `precision` on the short prompts: step-0 argmax agreement with the exact records at
/// least llama.cpp's own Q4_K_M path's, and a mean largest top-5 error no worse than its.
fn at_least_as_accurate_as_llamacpp(precision: Precision) {
    let _one_at_a_time = serial();
    let mut runner = load_qwen05(precision);
    let (exact, _) = split(read_records(EXACT));
    let (theirs, _) = split(read_records(LLAMACPP_FAST));
    let mut ours = Vec::new();
    let (mut ours_equal, mut theirs_equal) = (0, 0);
    for (rec, fast) in exact.iter().zip(&theirs) {
        assert_eq!(rec.id, fast.id);
        let (out, rows) = greedy_until(&mut runner, &rec.prompt_token_ids, 1, 0, &STOPS);
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
        "step-0 argmax equal to exact: sloserve {precision:?} {ours_equal}/{n}, llama.cpp Q4_K_M \
         {theirs_equal}/{n}; mean largest top-5 logprob error: sloserve {ours_err:.4}, llama.cpp {theirs_err:.4}"
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
fn fast_is_at_least_as_accurate_as_llamacpp_q4_k_m() {
    at_least_as_accurate_as_llamacpp(Precision::Fast);
}

#[test]
fn inspect_names_architecture_and_tokenizer() {
    let file = GgufFile::open(qwen05_path()).unwrap();
    let out = sloserve_model::inspect::inspect(&file).unwrap();
    for needle in [
        "architecture:    qwen2",
        "heads:           14 query, 2 key/value (head size 64)",
        "tool calls:      hermes (<tool_call>{json}</tool_call>)",
        "reasoning:       none",
        "supported:       yes",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}
