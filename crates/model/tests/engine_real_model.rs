//! The engine with the real default model, in the runner's exact precision: greedy
//! requests served concurrently (continuous batching, chunked prefill mixed with
//! decodes), from the prefix cache, under KV preemption and with SLO classes give
//! exactly the tokens each request gets when it runs alone on an engine.
//!
//! Exact mode only. The fast kernels are not batch-invariant: batches of 3+ rows
//! run as an f32 GEMM on dequantized weights, one or two rows as quantized dot products
//! with 8-bit activations, so a request's logits depend on how many rows share its
//! step and its greedy continuation may legitimately change with the batch.
//!
//! "Alone" = the same engine code path, one request at a time, prefix cache off, so
//! the two sides differ only in batching. Every request asks for its top-2 logprobs:
//! on a mismatch the failure names the first differing step and the logit margin of
//! both sides there (float non-associativity flips near-ties only; a wrong block
//! table or position flips tokens with large margins).

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use sloserve_engine::{
    Engine, EngineConfig, EngineHandle, EngineStats, Event, FinishReason, Request, SloClass,
};
use sloserve_model::gguf::GgufFile;
use sloserve_model::tokenizer::Tokenizer;
use sloserve_model::{LlamaRunner, Precision, RunnerOptions};

/// Real-ish English, tokenized with the model's own tokenizer; prompts are windows of it.
const TEXT: &str = "\
The harbour town woke slowly that autumn. Fishermen carried their nets down the stone \
steps before the sun had cleared the hills, and the baker on the corner opened his shutters \
to let the smell of warm bread drift over the water. Nobody in the town could remember a \
season so calm: the wind had dropped in September and had not returned, and the sea lay flat \
and grey like a sheet of old tin. Children walked to school along the sea wall, counting the \
gulls that sat on the railings, and their teachers complained that nobody paid attention to \
arithmetic when there were boats to watch. In the evenings the old men gathered outside the \
inn to argue about the weather, the price of diesel and the council's plan to build a new \
car park where the rope works used to stand. Most of them agreed that the plan was a mistake, \
although none of them could say exactly why. The lighthouse keeper, a quiet woman who had \
lived alone on the point for eleven years, came into town once a week to buy flour, lamp oil \
and a newspaper. She listened more than she spoke, and when she did speak people tended to \
remember it. One Thursday she told the grocer that the calm would break before the end of \
the month and that the boats should be pulled high up the slipway. He laughed, but he \
repeated the warning to his brother, who repeated it at the inn, and by Saturday half the \
town was talking about it. The harbour master checked his instruments and found nothing \
unusual: the barometer was steady, the forecast from the mainland promised another fortnight \
of settled weather, and the tide tables showed only ordinary springs. Still, a few of the \
older skippers began to move their boats, quietly, at night, so that nobody would accuse them \
of believing a rumour. When the storm finally came it arrived from the south east, the one \
direction the harbour wall did not protect, and it came faster than anyone had expected. \
Within an hour the waves were breaking over the quay and the water had reached the doors of \
the inn. The boats that had been moved survived without a scratch; three of the others were \
lifted from their moorings and thrown against the rocks below the church. In the weeks that \
followed, the council quietly dropped the car park and voted instead to repair the old sea \
wall. The lighthouse keeper never mentioned the storm again, and when people asked her how \
she had known, she only said that the birds had been flying low and that she had paid \
attention.";

/// A second text for the shared-prefix test: a system-prompt-like preamble.
const PREAMBLE: &str = "\
You are a careful assistant for a small public library. You answer questions about opening \
hours, borrowing rules, late fees, the reading room, the children's corner, the local history \
archive and the community events calendar. Always answer in plain language and keep your \
answers short. If a question is about a specific book, say whether the library usually keeps \
books of that kind and suggest asking at the front desk. Borrowing rules: adults may borrow up \
to twelve items at once for three weeks; children may borrow up to eight items. Items can be \
renewed twice unless another reader has reserved them. Late fees are ten cents a day for adult \
items and nothing for children's items. The reading room is quiet and open to everyone; food is \
not allowed but drinks in closed bottles are fine. The local history archive is open on \
Tuesday and Thursday afternoons and by appointment. Now answer the reader's question.";

const SUFFIXES: &[&str] = &[
    " Question: When does the library open on Saturday?",
    " Question: How many books can my daughter borrow?",
    " Question: Can I eat lunch in the reading room?",
    " Question: What is the late fee for a novel I returned a week late?",
    " Question: Do you keep old maps of the harbour?",
    " Question: I would like to find the parish records from the nineteenth century, where should I start?",
    " Question: Is there a story time for toddlers?",
    " Question: Can I bring a bottle of water?",
];

/// Serialises the tests of this file: each builds its own engine around a ~0.6 GB
/// exact-precision runner, and running them one at a time keeps memory bounded and
/// the SLO test's timing meaningful on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let file = GgufFile::open(common::model_path()).expect("open the default model");
        Tokenizer::from_gguf(&file.content).expect("tokenizer")
    })
}

fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).expect("tokenize")
}

/// Sixteen prompts of 5..200 tokens, windows of `TEXT` at different offsets.
fn varied_prompts() -> Vec<Vec<u32>> {
    let toks = encode(TEXT);
    let lens = [
        5, 12, 19, 27, 36, 44, 53, 64, 75, 88, 101, 117, 133, 150, 173, 200,
    ];
    assert!(toks.len() > 400, "TEXT has {} tokens", toks.len());
    lens.iter()
        .enumerate()
        .map(|(i, &len)| {
            let off = (i * 97 + 13) % (toks.len() - len);
            toks[off..off + len].to_vec()
        })
        .collect()
}

const MAX_TOKENS: usize = 16;

fn load_runner() -> LlamaRunner {
    let opts = RunnerOptions {
        precision: Precision::Exact,
        block_size: 16,
        kv_cache_memory: Some(128 << 20),
        max_model_len: Some(1024),
        quantize: None,
        ..Default::default()
    };
    LlamaRunner::load(common::model_path(), &opts).expect("load the default model")
}

fn start(cfg: EngineConfig) -> EngineHandle {
    Engine::start(Box::new(load_runner()), cfg).expect("start the engine")
}

/// A greedy request with a fixed length (EOS ignored) that returns its top-2 logprobs.
fn request(prompt: &[u32], max_tokens: usize) -> Request {
    let mut r = Request::greedy(prompt.to_vec(), max_tokens);
    r.stop.ignore_eos = true;
    r.sampling.logprobs = Some(2);
    r
}

/// Submits a `MAX_TOKENS` request of `class` for each prompt.
fn submit_all(
    engine: &EngineHandle,
    prompts: &[Vec<u32>],
    class: SloClass,
) -> Vec<sloserve_engine::RequestStream> {
    prompts
        .iter()
        .map(|p| {
            engine
                .submit(request(p, MAX_TOKENS).with_class(class))
                .unwrap()
        })
        .collect()
}

/// What one request produced: its tokens and, per step, the top-2 (id, logprob).
#[derive(Debug, Clone)]
struct Out {
    tokens: Vec<u32>,
    top2: Vec<Vec<(u32, f32)>>,
    cached_prompt_tokens: usize,
    preemptions: u32,
    ttft: Duration,
}

/// Collects a stream, keeping the top-2 logprobs of each step.
fn collect(s: sloserve_engine::RequestStream) -> Out {
    collect_after(s, Vec::new(), Vec::new())
}

/// `collect` for a stream whose first `tokens` were already taken.
fn collect_after(
    mut s: sloserve_engine::RequestStream,
    mut tokens: Vec<u32>,
    mut top2: Vec<Vec<(u32, f32)>>,
) -> Out {
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token {
                id, top_logprobs, ..
            } => {
                tokens.push(id);
                top2.push(top_logprobs);
            }
            Event::PromptLogprobs(_) | Event::Pooled(_) => {}
            Event::Finished(f) => {
                assert_eq!(f.reason, FinishReason::Length, "finish: {:?}", f.reason);
                assert_eq!(f.completion_tokens, tokens.len());
                return Out {
                    tokens,
                    top2,
                    cached_prompt_tokens: f.cached_prompt_tokens,
                    preemptions: f.timings.preemptions,
                    ttft: f.timings.ttft().unwrap_or_default(),
                };
            }
        }
    }
    panic!("stream ended without Finished");
}

/// Each prompt's output when it runs alone: one engine (prefix cache off, so no
/// request reuses another's KV), one request at a time. Memoised across tests.
fn alone(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Out> {
    static ENGINE: OnceLock<Mutex<EngineHandle>> = OnceLock::new();
    type Memo = HashMap<(Vec<u32>, usize), Out>;
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        Mutex::new(start(EngineConfig {
            enable_prefix_cache: false,
            ..Default::default()
        }))
    });
    let memo = MEMO.get_or_init(Default::default);
    let t0 = Instant::now();
    let mut ran = 0;
    let outs = prompts
        .iter()
        .map(|p| {
            let key = (p.clone(), max_tokens);
            if let Some(o) = memo.lock().unwrap().get(&key) {
                return o.clone();
            }
            let e = engine.lock().unwrap();
            let o = collect(e.submit(request(p, max_tokens)).unwrap());
            ran += 1;
            memo.lock().unwrap().insert(key, o.clone());
            o
        })
        .collect();
    if ran > 0 {
        println!(
            "alone: {ran} requests one at a time in {:.1?}",
            t0.elapsed()
        );
    }
    outs
}

fn logprob_of(top: &[(u32, f32)], id: u32) -> Option<f32> {
    top.iter().find(|t| t.0 == id).map(|t| t.1)
}

/// Asserts every batched output equals its alone output; on a mismatch reports the
/// first differing step with both sides' top-2 logprobs (the margin).
fn assert_same(label: &str, prompts: &[Vec<u32>], got: &[Out], want: &[Out]) {
    let mut max_dlp = 0f32;
    let mut bad = Vec::new();
    for (i, ((p, g), w)) in prompts.iter().zip(got).zip(want).enumerate() {
        assert_eq!(
            g.tokens.len(),
            w.tokens.len(),
            "{label}: request {i} length"
        );
        let first_diff = g.tokens.iter().zip(&w.tokens).position(|(a, b)| a != b);
        let upto = first_diff.unwrap_or(g.tokens.len());
        for k in 0..upto {
            let (a, b) = (
                logprob_of(&g.top2[k], g.tokens[k]),
                logprob_of(&w.top2[k], w.tokens[k]),
            );
            if let (Some(a), Some(b)) = (a, b) {
                max_dlp = max_dlp.max((a - b).abs());
            }
        }
        if let Some(k) = first_diff {
            let margin = |t: &[(u32, f32)]| match t {
                [a, b, ..] => a.1 - b.1,
                _ => f32::NAN,
            };
            bad.push(format!(
                "request {i} ({} prompt tokens): step {k}: batched {} top2 {:?} (margin {:.2e}), \
                 alone {} top2 {:?} (margin {:.2e})",
                p.len(),
                g.tokens[k],
                g.top2[k],
                margin(&g.top2[k]),
                w.tokens[k],
                w.top2[k],
                margin(&w.top2[k]),
            ));
        }
    }
    println!(
        "{label}: {} requests, max |logprob difference| of the chosen tokens vs alone: {max_dlp:.2e}",
        got.len()
    );
    assert!(
        bad.is_empty(),
        "{label}: {} of {} requests differ from their alone outputs:\n{}",
        bad.len(),
        got.len(),
        bad.join("\n")
    );
}

/// Stats are published after the step that sent the last `Finished`; wait for them.
fn final_stats(engine: &EngineHandle, generated: usize) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = engine.stats();
        if st.counters.generation_tokens >= generated as u64 && st.kv_blocks_used == 0 {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "final stats never arrived: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn stop(engine: EngineHandle) {
    engine.shutdown();
    assert!(engine.wait_stopped(Some(Duration::from_secs(30))));
}

/// Small steps so that prefill chunks of some requests share steps with the decodes
/// of others.
fn chunky() -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens: 256,
        max_prefill_chunk: 64,
        ..Default::default()
    }
}

#[test]
fn concurrent_requests_equal_each_alone() {
    let _g = serial();
    let prompts = varied_prompts();
    let want = alone(&prompts, MAX_TOKENS);
    let engine = start(chunky());
    let t0 = Instant::now();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(request(p, MAX_TOKENS)).unwrap())
        .collect();
    let got: Vec<Out> = streams.into_iter().map(collect).collect();
    println!(
        "16 concurrent requests ({} prompt tokens) in {:.1?}",
        prompts.iter().map(Vec::len).sum::<usize>(),
        t0.elapsed()
    );
    let st = final_stats(&engine, prompts.len() * MAX_TOKENS);
    assert_same("concurrent", &prompts, &got, &want);
    assert_eq!(st.counters.preemptions, 0);
    assert!(
        st.counters.steps < (prompts.len() * MAX_TOKENS) as u64,
        "requests were not batched: {} steps",
        st.counters.steps
    );
    stop(engine);
}

#[test]
fn shared_prefix_from_the_cache_equals_each_alone() {
    let _g = serial();
    let preamble = encode(PREAMBLE);
    assert!(
        preamble.len() >= 150,
        "preamble has {} tokens",
        preamble.len()
    );
    let preamble = &preamble[..preamble.len().min(200)];
    let prompts: Vec<Vec<u32>> = SUFFIXES
        .iter()
        .map(|s| [preamble, &encode(s)[..]].concat())
        .collect();
    let max_tokens = 12;
    let want = alone(&prompts, max_tokens);
    let engine = start(chunky());
    // One warm request fills the cache, then the rest arrive at once.
    let warm = collect(engine.submit(request(&prompts[0], max_tokens)).unwrap());
    assert_eq!(warm.cached_prompt_tokens, 0);
    let streams: Vec<_> = prompts[1..]
        .iter()
        .map(|p| engine.submit(request(p, max_tokens)).unwrap())
        .collect();
    let mut got = vec![warm];
    got.extend(streams.into_iter().map(collect));
    let st = final_stats(&engine, prompts.len() * max_tokens);
    assert_same("shared prefix", &prompts, &got, &want);
    let full_blocks = preamble.len() / 16 * 16;
    for (i, o) in got.iter().enumerate().skip(1) {
        assert!(
            o.cached_prompt_tokens >= full_blocks,
            "request {i}: {} cached prompt tokens, expected >= {full_blocks}",
            o.cached_prompt_tokens
        );
    }
    let submitted: usize = prompts.iter().map(Vec::len).sum();
    let c = st.counters;
    println!(
        "shared prefix: {submitted} prompt tokens submitted, {} computed, {} from the cache",
        c.prompt_tokens_computed, c.prompt_tokens_cached
    );
    assert_eq!(
        (c.prompt_tokens_computed + c.prompt_tokens_cached) as usize,
        submitted
    );
    assert!(c.prompt_tokens_computed as usize <= submitted - (prompts.len() - 1) * full_blocks);
    stop(engine);
}

#[test]
#[ignore = "slow: make test-slow"]
fn kv_preemption_equals_each_alone() {
    let _g = serial();
    let prompts = varied_prompts();
    let want = alone(&prompts, MAX_TOKENS);
    // 40 blocks of 16 = 640 tokens: the longest request (216 tokens, 14 blocks) fits
    // alone, the 16 together (~1550 tokens) do not.
    let engine = start(EngineConfig {
        num_kv_blocks: Some(40),
        ..chunky()
    });
    assert_eq!(engine.info().num_kv_blocks, 40);
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(request(p, MAX_TOKENS)).unwrap())
        .collect();
    let got: Vec<Out> = streams.into_iter().map(collect).collect();
    let st = final_stats(&engine, prompts.len() * MAX_TOKENS);
    let per_request: u32 = got.iter().map(|o| o.preemptions).sum();
    println!(
        "preemption: {} preemptions ({per_request} counted per request), {} tokens recomputed",
        st.counters.preemptions, st.counters.recomputed_tokens
    );
    assert!(st.counters.preemptions > 0, "no preemption happened");
    assert_eq!(per_request as u64, st.counters.preemptions);
    assert_same("preemption", &prompts, &got, &want);
    stop(engine);
}

#[test]
fn interactive_arrivals_over_running_batch_equal_each_alone() {
    let _g = serial();
    let prompts = varied_prompts();
    let want = alone(&prompts, MAX_TOKENS);
    // Six slots, ten batch requests: the engine is full when the interactive ones
    // arrive, so they preempt running batch sequences.
    let engine = start(EngineConfig {
        max_num_seqs: 6,
        slo_classes: true,
        enable_preemption: true,
        ..chunky()
    });
    let (batch, interactive) = prompts.split_at(10);
    let mut batch_streams = submit_all(&engine, batch, SloClass::Batch);
    // Wait for the first batch token (the engine is busy), consuming it ourselves.
    let mut first = batch_streams.remove(0);
    let ev = first.blocking_recv().expect("a first event");
    let Event::Token {
        id: first_id,
        top_logprobs: first_top,
        ..
    } = ev
    else {
        panic!("expected a token, got {ev:?}");
    };
    let mut inter_streams = Vec::new();
    for p in interactive {
        inter_streams.push(
            engine
                .submit(request(p, MAX_TOKENS).with_class(SloClass::Interactive))
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut got = vec![collect_after(first, vec![first_id], vec![first_top])];
    got.extend(batch_streams.into_iter().map(collect));
    let inter: Vec<Out> = inter_streams.into_iter().map(collect).collect();
    let st = final_stats(&engine, prompts.len() * MAX_TOKENS);
    let batch_preempted: u32 = got.iter().map(|o| o.preemptions).sum();
    let ttft = |v: &[Out]| {
        let mut t: Vec<_> = v.iter().map(|o| o.ttft).collect();
        t.sort();
        t[t.len() / 2]
    };
    let c = &st.counters;
    println!(
        "mixed: {} preemptions ({batch_preempted} of batch requests; resumed: {} kept, {} \
         spilled, {} recomputed, {} tokens recomputed); median TTFT of the interactive \
         arrivals {:.1?}, of the batch requests {:.1?}",
        c.preemptions,
        c.preemptions_kept,
        c.preemptions_spilled,
        c.preemptions_recomputed,
        c.recomputed_tokens,
        ttft(&inter),
        ttft(&got)
    );
    got.extend(inter);
    assert_same("mixed classes", &prompts, &got, &want);
    assert!(
        batch_preempted > 0,
        "no batch request was preempted by an interactive one"
    );
    // Preempted for a slot with memory to spare: each resumed on the KV it kept
    // (batch-invariant kernels: the same outputs as alone, checked above).
    assert_eq!(c.preemptions_kept, c.preemptions, "{c:?}");
    assert_eq!(c.recomputed_tokens, 0);
    stop(engine);
}

/// SLO-aware steps with no room for batch work (interference 0): batch decode rows
/// skip most steps while interactive requests decode, and every request's greedy
/// output is still the one it gets alone.
#[test]
#[ignore = "slow: make test-slow"]
fn batch_rows_skipping_steps_equal_each_alone() {
    let _g = serial();
    let prompts = varied_prompts();
    let want = alone(&prompts, MAX_TOKENS);
    let engine = start(EngineConfig {
        slo_classes: true,
        step_budget: sloserve_engine::StepBudgetPolicy::Time,
        max_batch_interference: 0.0,
        slo_margin: 0.0,
        batch_max_skip_steps: 3,
        ..chunky()
    });
    let (batch, interactive) = prompts.split_at(8);
    let batch_streams = submit_all(&engine, batch, SloClass::Batch);
    std::thread::sleep(Duration::from_millis(300));
    let inter_streams = submit_all(&engine, interactive, SloClass::Interactive);
    let mut got: Vec<Out> = batch_streams.into_iter().map(collect).collect();
    got.extend(inter_streams.into_iter().map(collect));
    let st = final_stats(&engine, prompts.len() * MAX_TOKENS);
    println!(
        "skipping: {} batch rows deferred; step model {:?}",
        st.counters.batch_rows_deferred, st.step_cost
    );
    assert!(
        st.counters.batch_rows_deferred > 0,
        "no batch row skipped a step"
    );
    assert_same("batch rows skipping steps", &prompts, &got, &want);
    stop(engine);
}
