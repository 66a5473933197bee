//! The prefix cache's disk tier end to end, on the real binary and model: a long
//! system prompt's blocks survive a SIGTERM and a SIGKILL of `sloserve serve`
//! (cached tokens reported after the restart, the output bit for bit the cold
//! run's in exact precision), another API key never gets them (from RAM or disk,
//! before or after a restart), and damaged block files are skipped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

use common::Server;

/// A `sloserve serve` child with a disk tier in `dir` and two API keys.
fn start(dir: &Path) -> Server {
    Server::start(&[
        "--precision",
        "exact",
        "--kv-cache-memory",
        "64MiB",
        "--max-model-len",
        "2048",
        "--prefix-cache-dir",
        dir.to_str().unwrap(),
        "--api-key",
        "key-a-secret",
        "--api-key",
        "key-b-secret",
        "--no-batch-api",
        "--served-model-name",
        "m",
    ])
}

/// This file's requests.
impl Server {
    /// A greedy chat turn under a long system prompt: (text, cached tokens).
    fn chat(&self, key: &str, system: &str) -> (String, u64) {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "Summarize the rules in one sentence."}
            ],
            "max_tokens": 4,
            "temperature": 0
        });
        let (status, text) =
            self.http("POST", "/v1/chat/completions", &body.to_string(), Some(key));
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (content, cached)
    }

    /// A counter's sum over its label sets matching `filter`.
    fn metric(&self, name: &str, filter: &str) -> f64 {
        let (status, text) = self.http("GET", "/metrics", "", Some("key-a-secret"));
        assert_eq!(status, 200);
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the disk tier has written every block queued so far (its
    /// written bytes stay put for 300 ms).
    fn settle(&self) {
        let mut last = -1.0;
        for _ in 0..100 {
            let now = self.metric("sloserve:prefix_cache_disk_bytes_total", "written");
            if now == last {
                return;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("the disk tier's writes did not settle");
    }

    fn sigterm(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let t0 = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sigkill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// A system prompt of some 190 tokens, different per `topic`.
fn system_prompt(topic: &str) -> String {
    let rules: Vec<String> = (1..=9)
        .map(|i| format!("Rule {i} about {topic}: always check item {i} twice before you answer."))
        .collect();
    format!(
        "You are a careful assistant for {topic}. {}",
        rules.join(" ")
    )
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "kvb") {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn the_disk_tier_survives_sigterm_and_sigkill_and_keeps_keys_apart() {
    let dir = std::env::temp_dir().join(format!("sloserve-prefix-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b) = ("key-a-secret", "key-b-secret");
    let (p1, p2) = (system_prompt("invoices"), system_prompt("shipping"));

    // Run 1: cold.
    let s = start(&dir);
    let (t1, cached) = s.chat(a, &p1);
    assert_eq!(cached, 0);
    s.settle();
    assert!(s.metric("sloserve:prefix_cache_disk_bytes_total", "written") > 0.0);
    s.sigterm();
    assert!(!block_files(&dir).is_empty(), "blocks written");

    // Run 2, after SIGTERM: key B gets nothing of key A's (from disk), key A all.
    let s = start(&dir);
    assert_eq!(s.chat(b, &p1), (t1.clone(), 0), "key B, from disk");
    let (text, cached) = s.chat(a, &p1);
    assert!(cached >= 160, "key A reuses its prefix from disk: {cached}");
    assert_eq!(text, t1, "the output is the cold run's");
    assert!(s.metric("sloserve:prefix_cache_tier_hits_total", "disk") >= 160.0);
    assert_eq!(
        s.metric("sloserve:prefix_cache_disk_decisions_total", "load"),
        1.0
    );
    let (t2, cached) = s.chat(a, &p2);
    assert_eq!(cached, 0);
    s.settle();
    s.sigkill();

    // Run 3, after SIGKILL: what was written survives.
    let s = start(&dir);
    let (text, cached) = s.chat(a, &p2);
    assert!(cached >= 160, "after SIGKILL: {cached}");
    assert_eq!(text, t2, "the output is the cold run's");
    // Every block file damaged (one bit): p1's blocks are skipped and recomputed.
    s.settle();
    for f in block_files(&dir) {
        let mut bytes = std::fs::read(&f).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(&f, bytes).unwrap();
    }
    assert_eq!(s.chat(a, &p1), (t1, 0), "damaged blocks are never used");
    assert!(s.metric("sloserve:prefix_cache_disk_bad_files_total", "") >= 1.0);
    s.sigterm();
    let _ = std::fs::remove_dir_all(&dir);
}
