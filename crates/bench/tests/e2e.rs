//! End to end: `run_bench` against a streaming OpenAI-compatible server — a short
//! synthetic run and a 2-point sweep — then results.json, report.md and the plots.
//!
//! The server is the fake one in `support/`, whose request log lets the checks see
//! exactly what was sent; `crates/sloserve/tests/bench_serve.rs` benches a real
//! `sloserve serve` with the default model.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::Value;
use sloserve_bench::{run_bench, BenchArgs, BenchReport};
use support::fake_server::{FakeServer, MODEL};
use support::plots::check_plot;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn args(flags: &[&str]) -> BenchArgs {
    Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
        .expect("flags parse")
        .args
}

fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn data(file: &str) -> String {
    format!("{}/data/{file}", env!("CARGO_MANIFEST_DIR"))
}

fn results(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    let v: Value = serde_json::from_str(&text).expect("results.json parses");
    assert_eq!(v["schema"], "sloserve-bench/1");
    BenchReport::load(&dir.join("results.json")).expect("results.json reads back as a BenchReport");
    v
}

/// Every successful request's token counts are the server's `usage`, and
/// (with ignore_eos) completion tokens equal `max_tokens`.
fn check_usage(v: &Value, fake: Option<&FakeServer>) {
    let mut served: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    if let Some(f) = fake {
        for s in f.served() {
            if let Some(u) = s.usage {
                *served.entry(u).or_default() += 1;
            }
        }
    }
    for p in v["points"].as_array().unwrap() {
        for r in p["requests"].as_array().unwrap() {
            assert!(r["error"].is_null(), "request failed: {r}");
            let (pt, ct) = (
                r["prompt_tokens"].as_u64().expect("prompt_tokens"),
                r["completion_tokens"].as_u64().expect("completion_tokens"),
            );
            assert_eq!(
                ct,
                r["max_tokens"].as_u64().unwrap(),
                "ignore_eos: completion tokens = max_tokens"
            );
            assert!(pt > 0);
            if fake.is_some() {
                let n = served.get_mut(&(pt, ct)).unwrap_or_else(|| {
                    panic!("usage ({pt}, {ct}) was never reported by the server")
                });
                assert!(
                    *n > 0,
                    "usage ({pt}, {ct}) recorded more often than the server reported it"
                );
                *n -= 1;
                // One token per chunk on the fake server.
                assert_eq!(r["chunk_s"].as_array().unwrap().len() as u64, ct);
            }
            let chunks: Vec<f64> = r["chunk_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_f64().unwrap())
                .collect();
            assert!(chunks.windows(2).all(|w| w[1] >= w[0]) && chunks[0] > 0.0);
            assert!(r["end_s"].as_f64().unwrap() >= *chunks.last().unwrap());
        }
    }
}

/// The end-to-end checks against the server at `url`; `fake` gives its request log when it is the fake server.
async fn bench_server(url: &str, fake: Option<&FakeServer>) {
    // 1. A short synthetic run: closed loop, warmup, class mix, SLOs, API key.
    let dir = out_dir("synthetic");
    let d = dir.to_str().unwrap();
    let report = run_bench(args(&[
        "--url",
        url,
        "--concurrency",
        "2",
        "--num-requests",
        "6",
        "--warmup",
        "2",
        "--input-len-dist",
        "uniform:8-24",
        "--output-len",
        "8",
        "--slo-class",
        "interactive=0.7,batch=0.3",
        "--slo",
        "ttft_p95=2000ms,tpot_p50=500ms",
        "--api-key",
        "sekret",
        "--seed",
        "3",
        "--out",
        d,
    ]))
    .await
    .expect("synthetic run");
    assert_eq!(report.points.len(), 1);
    let s = &report.points[0].summary;
    assert_eq!(
        (s.completed, s.failed, s.usage_missing),
        (6, 0, 0),
        "{:?}",
        s.errors
    );
    assert_eq!(s.total_output_tokens, 48);
    assert!(s.ttft_ms.count == 6 && s.tpot_ms.count == 6 && s.itl_ms.count == 6 * 7);
    assert!(s.goodput.is_some() && s.slo_checks.len() == 2);
    let classes = &report.points[0].classes;
    assert_eq!(classes.values().map(|c| c.completed).sum::<usize>(), 6);
    assert!(classes.keys().all(|k| k == "interactive" || k == "batch"));
    let v = results(&dir);
    check_usage(&v, fake);
    let text = std::fs::read_to_string(dir.join("results.json")).unwrap();
    assert!(!text.contains("sekret"), "the API key must not be written");
    check_plot(&dir, "ttft_hist_concurrency_2");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("## concurrency=2")
            && md.contains("ttft_hist_concurrency_2.png")
            && md.contains("ttft_p95")
    );
    if let Some(f) = fake {
        let served = f.served();
        assert_eq!(served.len(), 8, "2 warmup + 6 measured requests");
        for r in &served {
            let b = &r.body;
            assert_eq!(r.path, "/v1/completions");
            assert_eq!(b["model"], MODEL, "model from GET /v1/models");
            assert_eq!(
                (
                    b["stream"].as_bool(),
                    b["stream_options"]["include_usage"].as_bool()
                ),
                (Some(true), Some(true))
            );
            assert_eq!(
                (
                    b["temperature"].as_f64(),
                    b["ignore_eos"].as_bool(),
                    b["max_tokens"].as_u64()
                ),
                (Some(0.0), Some(true), Some(8))
            );
            assert!(b["prompt"]
                .as_str()
                .is_some_and(|p| (8..=24).contains(&p.split_whitespace().count())));
            assert_eq!(r.authorization.as_deref(), Some("Bearer sekret"));
            assert_eq!(
                r.slo_class_header.as_deref(),
                b["slo_class"].as_str(),
                "header and body carry the same class"
            );
            assert!(r.slo_class_header.is_some());
        }
    }

    // 2. A 2-point concurrency sweep on the chat endpoint.
    let dir = out_dir("sweep");
    let report = run_bench(args(&[
        "--url",
        url,
        "--endpoint",
        "chat",
        "--model",
        MODEL,
        "--sweep",
        "concurrency=1,2",
        "--num-requests",
        "4",
        "--input-len",
        "12",
        "--output-len",
        "6",
        "--slo",
        "ttft_p95=2000ms,tpot_p50=500ms,ttft_p50=1s",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]))
    .await
    .expect("sweep");
    assert_eq!(report.points.len(), 2);
    assert_eq!(
        report.points.iter().map(|p| p.value).collect::<Vec<_>>(),
        vec![Some(1.0), Some(2.0)]
    );
    for p in &report.points {
        assert_eq!((p.summary.completed, p.summary.failed), (4, 0));
        assert_eq!(p.summary.total_output_tokens, 24);
    }
    let v = results(&dir);
    assert_eq!(v["points"].as_array().unwrap().len(), 2);
    assert_eq!(v["sweep"], "concurrency=1,2");
    check_usage(&v, fake);
    for stem in [
        "ttft_vs_concurrency",
        "tpot_vs_concurrency",
        "throughput_vs_concurrency",
        "ttft_hist_concurrency_1",
        "ttft_hist_concurrency_2",
    ] {
        check_plot(&dir, stem);
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("## Sweep") && md.contains("ttft_vs_concurrency.png"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fake_server_synthetic_and_sweep() {
    let server = FakeServer::start().await;
    bench_server(&server.url(), Some(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_missing_usage_and_datasets() {
    let server = FakeServer::start().await;
    let url = server.url();
    // Explicit prompts: a 503, an error mid-stream, a stream without usage, and a normal one.
    let dir = out_dir("failures");
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"please FAIL now\"}\n{\"prompt\": \"MIDERR in the middle\", \"output_len\": 6}\n\
         {\"prompt\": \"NOUSAGE but fine otherwise\", \"output_len\": 4}\n{\"prompt\": \"a normal prompt\", \"output_len\": 3, \"slo_class\": \"batch\"}\n",
    )
    .unwrap();
    let report = run_bench(args(&[
        "--url",
        &url,
        "--dataset",
        &format!("jsonl:{}", prompts.display()),
        "--request-rate",
        "200",
        "--num-requests",
        "4",
        "--ignore-eos",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]))
    .await
    .expect("run with failures");
    let p = &report.points[0];
    let s = &p.summary;
    assert_eq!((s.completed, s.failed, s.usage_missing), (2, 2, 1));
    let errors: Vec<(&str, usize)> = s
        .errors
        .iter()
        .map(|e| (e.error.as_str(), e.count))
        .collect();
    assert!(
        errors.contains(&("HTTP 503: server overloaded", 1)),
        "{errors:?}"
    );
    assert!(
        errors.contains(&("error in stream: engine died", 1)),
        "{errors:?}"
    );
    let no_usage = p
        .requests
        .iter()
        .find(|r| r.ok() && !r.usage_reported())
        .expect("the NOUSAGE request");
    assert_eq!(
        no_usage.output_tokens(),
        4,
        "falls back to counting content chunks"
    );
    assert_eq!(p.requests[3].class.as_deref(), Some("batch"));
    assert!(report.notes.iter().any(|n| n.contains("no `usage`")));
    results(&dir);
    check_plot(&dir, "ttft_hist_rate_200");

    // The ShareGPT sample: the gpt reply's word count is max_tokens; without ignore_eos the fake stops at 5.
    let report = run_bench(args(&[
        "--url",
        &url,
        "--dataset",
        &format!("sharegpt:{}", data("sharegpt_sample.json")),
        "--num-requests",
        "5",
        "--quiet",
    ]))
    .await
    .expect("sharegpt run");
    let s = &report.points[0].summary;
    assert_eq!((s.completed, s.total_output_tokens), (5, 25));
    assert!(report.points[0].requests.iter().all(|r| r.max_tokens >= 4));

    // Prefix caching on chat: a shared system prompt plus unique questions.
    let before = server.served().len();
    run_bench(args(&[
        "--url",
        &url,
        "--endpoint",
        "chat",
        "--dataset",
        "prefix",
        "--prefix-len",
        "32",
        "--input-len",
        "5",
        "--num-requests",
        "3",
        "--output-len",
        "2",
        "--quiet",
    ]))
    .await
    .expect("prefix run");
    let served = &server.served()[before..];
    let systems: Vec<&str> = served
        .iter()
        .map(|s| s.body["messages"][0]["content"].as_str().unwrap())
        .collect();
    assert!(systems
        .iter()
        .all(|s| *s == systems[0] && s.split_whitespace().count() == 32));
    let questions: Vec<&str> = served
        .iter()
        .map(|s| s.body["messages"][1]["content"].as_str().unwrap())
        .collect();
    assert!(questions[0] != questions[1] && questions[1] != questions[2]);

    // The bundled JSONL sample parses.
    let report = run_bench(args(&[
        "--url",
        &url,
        "--dataset",
        &format!("jsonl:{}", data("prompts_sample.jsonl")),
        "--num-requests",
        "4",
        "--quiet",
    ]))
    .await
    .expect("jsonl sample");
    assert_eq!(report.points[0].summary.completed, 4);
}

#[tokio::test]
async fn unreachable_server_fails_cleanly() {
    // A loopback port nobody listens on (bound, then released): every request fails, the run does not.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let report = run_bench(args(&[
        "--url",
        &url,
        "--model",
        "m",
        "--num-requests",
        "2",
        "--quiet",
    ]))
    .await
    .expect("run");
    assert_eq!(report.points[0].summary.failed, 2);
    assert!(
        report.points[0].summary.errors[0]
            .error
            .contains("request failed"),
        "{:?}",
        report.points[0].summary.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_bound_and_capped_open_loop() {
    let server = FakeServer::start().await;
    let url = server.url();
    // Closed loop bounded by time only: stops issuing after 0.3 s, in-flight requests finish.
    let report = run_bench(args(&[
        "--url",
        &url,
        "--concurrency",
        "2",
        "--duration",
        "300ms",
        "--output-len",
        "4",
        "--quiet",
    ]))
    .await
    .expect("duration run");
    let s = &report.points[0].summary;
    assert!(s.completed >= 2 && s.failed == 0, "{s:?}");
    assert!(
        s.duration_s >= 0.3 && s.duration_s < 5.0,
        "{}",
        s.duration_s
    );
    assert!(report.points[0].requests.iter().all(|r| r.send_s < 0.3));
    // Open loop, everything at once, at most 2 in flight.
    let report = run_bench(args(&[
        "--url",
        &url,
        "--request-rate",
        "inf",
        "--max-concurrency",
        "2",
        "--num-requests",
        "6",
        "--output-len",
        "3",
        "--quiet",
    ]))
    .await
    .expect("capped open loop");
    let reqs = &report.points[0].requests;
    assert_eq!(reqs.len(), 6);
    // With 2 slots, at any send time at most one other request is still running.
    for r in reqs {
        let overlapping = reqs
            .iter()
            .filter(|o| {
                o.id != r.id && o.send_s <= r.send_s && o.send_s + o.end_s > r.send_s + 1e-4
            })
            .count();
        assert!(
            overlapping <= 1,
            "request {} sent with {overlapping} others in flight",
            r.id
        );
    }
    // Unbounded open loop is refused.
    let err = run_bench(args(&["--url", &url, "--duration", "1s", "--quiet"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("without bound"), "{err}");
}
