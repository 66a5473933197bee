//! `sloserve bench` against a real `sloserve serve` with the default model: a short
//! synthetic run (completions, class mix) and a 2-point chat sweep. results.json
//! parses, every request's token counts are the ones the server reported (its
//! `/metrics` token counters move by exactly the sums in results.json), and the
//! plots are valid PNG and SVG.

#[path = "../../bench/tests/support/plots.rs"]
mod plots;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;

use common::Server;

impl Server {
    /// Sum of every sample of a counter (all label sets).
    fn counter(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Runs `sloserve bench` with `flags`, printing its console table; panics on failure.
fn bench(flags: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sloserve"))
        .arg("bench")
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let lines: Vec<String> = BufReader::new(out).lines().map_while(Result::ok).collect();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    println!("{}", lines.join("\n"));
    assert!(status.success(), "sloserve bench {flags:?} failed:\n{err}");
}

fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// results.json's requests: each succeeded with `max_tokens` completion tokens
/// (ignore_eos) and chunk times in order; returns (prompt, completion) token sums.
fn check_results(dir: &Path, points: usize) -> (u64, u64) {
    let text = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    let v: Value = serde_json::from_str(&text).expect("results.json parses");
    assert_eq!(v["schema"], "sloserve-bench/1");
    let pts = v["points"].as_array().unwrap();
    assert_eq!(pts.len(), points);
    let (mut prompt, mut completion) = (0, 0);
    for p in pts {
        let s = &p["summary"];
        assert_eq!(s["failed"], 0, "{s}");
        for r in p["requests"].as_array().unwrap() {
            assert!(r["error"].is_null(), "request failed: {r}");
            let ct = r["completion_tokens"].as_u64().expect("completion_tokens");
            assert_eq!(ct, r["max_tokens"].as_u64().unwrap(), "ignore_eos: {r}");
            prompt += r["prompt_tokens"].as_u64().expect("prompt_tokens");
            completion += ct;
            let chunks: Vec<f64> = r["chunk_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_f64().unwrap())
                .collect();
            assert!(!chunks.is_empty() && chunks.windows(2).all(|w| w[1] >= w[0]));
        }
    }
    (prompt, completion)
}

#[test]
fn bench_a_real_server_synthetic_run_and_sweep() {
    let server = Server::start(&[
        "--profile",
        "mixed",
        "--kv-cache-memory",
        "64000000",
        "--no-batch-api",
    ]);
    let url = server.url();
    let counters = || {
        (
            server.counter("sloserve:prompt_tokens_total"),
            server.counter("sloserve:generation_tokens_total"),
        )
    };

    // 1. Synthetic completions, closed loop at concurrency 2, a class mix and SLOs.
    let dir = out_dir("synthetic");
    let before = counters();
    bench(&[
        "--url",
        &url,
        "--concurrency",
        "2",
        "--num-requests",
        "6",
        "--input-len-dist",
        "uniform:8-24",
        "--output-len",
        "8",
        "--slo-class",
        "interactive=0.5,batch=0.5",
        "--slo",
        "ttft_p95=60s",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let after = counters();
    let (prompt, completion) = check_results(&dir, 1);
    assert_eq!(completion, 6 * 8);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (prompt as f64, completion as f64),
        "results.json's token counts are the server's usage"
    );
    plots::check_plot(&dir, "ttft_hist_concurrency_2");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("ttft_p95"), "{md}");

    // 2. A 2-point sweep over the chat endpoint.
    let dir = out_dir("sweep");
    let before = counters();
    bench(&[
        "--url",
        &url,
        "--endpoint",
        "chat",
        "--sweep",
        "concurrency=1,2",
        "--num-requests",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let after = counters();
    let (prompt, completion) = check_results(&dir, 2);
    assert_eq!(completion, 2 * 2 * 4);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (prompt as f64, completion as f64)
    );
    for stem in [
        "ttft_vs_concurrency",
        "tpot_vs_concurrency",
        "throughput_vs_concurrency",
        "ttft_hist_concurrency_1",
        "ttft_hist_concurrency_2",
    ] {
        plots::check_plot(&dir, stem);
    }
}
