//! Metric computations on hand-made timestamp traces, against values worked out by hand.

use sloserve_bench::client::handle_event;
use sloserve_bench::metrics::{self, percentile, summarize, Stats};
use sloserve_bench::record::RequestRecord;
use sloserve_bench::slo::SloSpec;

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

fn rec(id: usize, chunks: &[f64], prompt: Option<u64>, completion: Option<u64>) -> RequestRecord {
    RequestRecord {
        id,
        chunk_s: chunks.to_vec(),
        end_s: chunks.last().copied().unwrap_or(0.0) + 0.001,
        prompt_tokens: prompt,
        completion_tokens: completion,
        expected_prompt_tokens: 7,
        max_tokens: 16,
        ..Default::default()
    }
}

fn failed(id: usize) -> RequestRecord {
    RequestRecord {
        id,
        error: Some("HTTP 503: overloaded\nretry later".into()),
        ..Default::default()
    }
}

/// A: 4 tokens in 4 chunks; B: 5 tokens in 2 chunks; C: 1 token; D, D2: failed; E: no usage (3 chunks).
fn trace() -> Vec<RequestRecord> {
    vec![
        rec(0, &[0.10, 0.15, 0.25, 0.30], Some(10), Some(4)),
        rec(1, &[0.20, 0.50], Some(20), Some(5)),
        rec(2, &[0.40], Some(30), Some(1)),
        failed(3),
        failed(4),
        rec(5, &[0.05, 0.10, 0.20], None, None),
    ]
}

#[test]
fn percentiles_match_numpy_linear() {
    // np.percentile([1, 2, 3, 4], [50, 90, 99]) == [2.5, 3.7, 3.97]
    let v = [4.0, 1.0, 3.0, 2.0];
    close(percentile(&v, 50.0).unwrap(), 2.5);
    close(percentile(&v, 90.0).unwrap(), 3.7);
    close(percentile(&v, 99.0).unwrap(), 3.97);
    // np.percentile([15, 20, 35, 40, 50], [0, 40, 100]) == [15, 29, 50]
    let w = [15.0, 20.0, 35.0, 40.0, 50.0];
    close(percentile(&w, 0.0).unwrap(), 15.0);
    close(percentile(&w, 40.0).unwrap(), 29.0);
    close(percentile(&w, 100.0).unwrap(), 50.0);
    close(percentile(&[7.0], 95.0).unwrap(), 7.0);
    assert_eq!(percentile(&[], 50.0), None);
}

#[test]
fn per_request_ttft_tpot_itl_e2el() {
    let t = trace();
    close(metrics::ttft(&t[0]).unwrap(), 0.10);
    close(metrics::e2el(&t[0]).unwrap(), 0.30);
    // (0.30 - 0.10) / (4 - 1)
    close(metrics::tpot(&t[0]).unwrap(), 0.2 / 3.0);
    let itl = metrics::itls(&t[0]);
    assert_eq!(itl.len(), 3);
    for (a, b) in itl.iter().zip([0.05, 0.10, 0.05]) {
        close(*a, b);
    }
    // Several tokens per chunk: TPOT uses usage tokens, ITL the chunk gaps.
    close(metrics::tpot(&t[1]).unwrap(), 0.3 / 4.0);
    close(metrics::itls(&t[1])[0], 0.3);
    // One output token: no TPOT, no ITL.
    assert_eq!(metrics::tpot(&t[2]), None);
    assert!(metrics::itls(&t[2]).is_empty());
    // No usage: tokens = content chunks (3) → (0.20 - 0.05) / 2.
    assert_eq!(t[5].output_tokens(), 3);
    assert_eq!(t[5].input_tokens(), 7);
    close(metrics::tpot(&t[5]).unwrap(), 0.075);
}

#[test]
fn summary_of_the_trace() {
    let s = summarize(&trace(), 2.0, &SloSpec::default());
    assert_eq!((s.completed, s.failed, s.usage_missing), (4, 2, 1));
    // Tokens: in 10 + 20 + 30 + 7 (estimate), out 4 + 5 + 1 + 3.
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (67, 13));
    close(s.mean_output_tokens, 13.0 / 4.0);
    close(s.request_throughput, 2.0);
    close(s.output_throughput, 6.5);
    close(s.total_token_throughput, 40.0);
    // TTFT ms: [50, 100, 200, 400].
    let ttft = &s.ttft_ms;
    assert_eq!(ttft.count, 4);
    close(ttft.mean, 187.5);
    close(ttft.median, 150.0);
    close(ttft.p90, 340.0);
    close(ttft.p95, 370.0);
    close(ttft.p99, 394.0);
    close(ttft.min, 50.0);
    close(ttft.max, 400.0);
    close(ttft.std, 17968.75f64.sqrt());
    // TPOT ms: [66.67, 75, 75] (C has none).
    assert_eq!(s.tpot_ms.count, 3);
    close(s.tpot_ms.median, 75.0);
    close(s.tpot_ms.mean, (200.0 / 3.0 + 150.0) / 3.0);
    // ITL pooled ms: [50, 50, 50, 100, 100, 300].
    assert_eq!(s.itl_ms.count, 6);
    close(s.itl_ms.median, 75.0);
    close(s.itl_ms.p90, 200.0);
    close(s.itl_ms.mean, 650.0 / 6.0);
    // E2E ms: [300, 500, 400, 200].
    close(s.e2el_ms.median, 350.0);
    // Errors grouped by first line.
    assert_eq!(s.errors.len(), 1);
    assert_eq!(
        (s.errors[0].error.as_str(), s.errors[0].count),
        ("HTTP 503: overloaded", 2)
    );
    // No SLO: no goodput.
    assert_eq!(
        (s.goodput, s.slo_attainment, s.good_requests),
        (None, None, None)
    );
    assert!(s.slo_checks.is_empty());
}

#[test]
fn goodput_and_attainment() {
    // Per request ttft ≤ 150 ms and tpot ≤ 70 ms: only A (100 ms, 66.7 ms) is good;
    // B, C too slow to first token, E's TPOT is 75 ms, D/D2 failed.
    let slo: SloSpec = "ttft=150ms,tpot=70ms".parse().unwrap();
    let s = summarize(&trace(), 2.0, &slo);
    assert_eq!(s.good_requests, Some(1));
    close(s.goodput.unwrap(), 0.5);
    close(s.slo_attainment.unwrap(), 1.0 / 6.0);
    assert!(
        s.slo_checks.is_empty(),
        "bare targets have no aggregate check"
    );

    // Aggregate targets: TTFT p50 150 ≤ 160 met, TPOT p50 75 ≤ 80 met, ITL p90 200 > 150 missed.
    // Per request (ttft ≤ 160, tpot ≤ 80): A and E are good.
    let slo: SloSpec = "ttft_p50=160ms,tpot_p50=80ms,itl_p90=150ms"
        .parse()
        .unwrap();
    let s = summarize(&trace(), 2.0, &slo);
    assert_eq!(s.good_requests, Some(2));
    close(s.goodput.unwrap(), 1.0);
    close(s.slo_attainment.unwrap(), 2.0 / 6.0);
    let checks: Vec<(bool, f64)> = s
        .slo_checks
        .iter()
        .map(|c| (c.met, c.actual_ms.unwrap()))
        .collect();
    assert_eq!(checks.len(), 3);
    assert!(checks[0].0 && checks[1].0 && !checks[2].0);
    close(checks[0].1, 150.0);
    close(checks[1].1, 75.0);
    close(checks[2].1, 200.0);
}

#[test]
fn empty_stats_are_zero() {
    assert_eq!(Stats::from_seconds(&[]), Stats::default());
    let s = summarize(&[], 0.0, &"ttft=1ms".parse().unwrap());
    assert_eq!(
        (s.completed, s.request_throughput, s.slo_attainment),
        (0, 0.0, Some(0.0))
    );
}

#[test]
fn only_chunks_with_text_are_timestamped() {
    let mut r = RequestRecord::default();
    // Chat role-only delta: no text.
    assert!(!handle_event(
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        0.01,
        &mut r
    )
    .unwrap());
    assert!(!handle_event(
        r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        0.02,
        &mut r
    )
    .unwrap());
    assert!(!handle_event(
        r#"{"choices":[{"index":0,"text":" there","finish_reason":"length"}]}"#,
        0.03,
        &mut r
    )
    .unwrap());
    // Usage-only chunk.
    assert!(!handle_event(
        r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#,
        0.04,
        &mut r
    )
    .unwrap());
    assert!(handle_event("[DONE]", 0.05, &mut r).unwrap());
    assert_eq!(r.chunk_s, vec![0.02, 0.03]);
    assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(9), Some(2)));
    assert_eq!(r.finish_reason.as_deref(), Some("length"));
    // Error JSON in the stream fails the request with its message.
    let e = handle_event(
        r#"{"error":{"message":"out of KV cache","type":"server_error"}}"#,
        0.06,
        &mut r,
    )
    .unwrap_err();
    assert!(e.to_string().contains("out of KV cache"), "{e}");
    assert!(handle_event("not json", 0.07, &mut r).is_err());
}

/// The server's verdicts on per-request targets (sloserve's `usage.sloserve`)
/// are counted over completed requests; none reported gives `None`.
#[test]
fn server_target_verdicts_are_counted() {
    let slo = SloSpec::default();
    assert_eq!(summarize(&trace(), 1.0, &slo).server_targets, None);
    let mut recs = trace();
    recs[0].server_ttft_met = Some(true);
    recs[0].server_tpot_met = Some(false);
    recs[1].server_ttft_met = Some(false);
    recs[3].server_ttft_met = Some(true); // failed: not counted
    let t = summarize(&recs, 1.0, &slo).server_targets.unwrap();
    assert_eq!(
        (t.ttft_met, t.ttft_missed, t.tpot_met, t.tpot_missed),
        (1, 1, 0, 1)
    );
}

#[test]
fn usage_chunk_carries_the_servers_target_verdicts() {
    let mut r = RequestRecord::default();
    handle_event(
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"sloserve":{"ttft_met":true,"tpot_met":false}}}"#,
        0.1,
        &mut r,
    )
    .unwrap();
    assert_eq!(
        (r.server_ttft_met, r.server_tpot_met),
        (Some(true), Some(false))
    );
    let mut plain = RequestRecord::default();
    handle_event(
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        0.1,
        &mut plain,
    )
    .unwrap();
    assert_eq!((plain.server_ttft_met, plain.server_tpot_met), (None, None));
}
