//! The tuning procedure on hand-made point tables: the interactive pick
//! (largest batch meeting the SLO, backed off one step; TPOT constraint; none
//! met; noise), the batch pick (most output tok/s), cost per million output
//! tokens, early stop, confidence intervals, and the plan of configurations.

use clap::Parser;
use sloserve_engine::Profile;
use sloserve_tune::procedure::{
    cost_per_million_output_tokens, percentile_ci, recommend_batch, recommend_interactive,
    should_stop, verdict, Knobs, PointMetrics, SloTargets,
};
use sloserve_tune::run::plan;
use sloserve_tune::TuneArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TuneArgs,
}

fn tune_args(flags: &[&str]) -> TuneArgs {
    Cli::try_parse_from(std::iter::once("tune").chain(flags.iter().copied()))
        .expect("flags parse")
        .args
}

/// A complete, failure-free point of the default series.
fn pt(seqs: usize, ttft_p95: f64, tpot_p50: f64, tok_s: f64) -> PointMetrics {
    pt_in(seqs, 512, 128, ttft_p95, tpot_p50, tok_s)
}

fn pt_in(
    seqs: usize,
    budget: usize,
    chunk: usize,
    ttft_p95: f64,
    tpot_p50: f64,
    tok_s: f64,
) -> PointMetrics {
    PointMetrics {
        knobs: Knobs {
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            max_prefill_chunk: chunk,
        },
        completed: 64,
        failed: 0,
        partial: false,
        ttft_p95_ms: Some(ttft_p95),
        tpot_p50_ms: Some(tpot_p50),
        output_tok_s: tok_s,
    }
}

const TTFT_1S: SloTargets = SloTargets {
    ttft_p95_ms: 1000.0,
    tpot_p50_ms: None,
};

/// TTFT P95 grows with the batch: 4, 8, 16 meet 1 s; 32 and 64 do not.
fn sweep() -> Vec<PointMetrics> {
    vec![
        pt(4, 200.0, 30.0, 100.0),
        pt(8, 400.0, 35.0, 180.0),
        pt(16, 900.0, 45.0, 300.0),
        pt(32, 1800.0, 60.0, 420.0),
        pt(64, 3500.0, 90.0, 480.0),
    ]
}

#[test]
fn slo_met_up_to_16_recommends_8() {
    let points = sweep();
    let r = recommend_interactive(&points, &TTFT_1S, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 8);
    assert_eq!(r.point, 1);
    assert!(r.slo_met);
    assert_eq!(r.ttft_p95_ms, Some(400.0));
    assert!(
        r.reason.contains("max_num_seqs=16 is the largest") && r.reason.contains("backed off"),
        "{}",
        r.reason
    );
    assert!(
        r.reason.contains("max_num_seqs=32, misses it"),
        "{}",
        r.reason
    );
    assert_eq!(r.cost_per_million_output_tokens, None);
    // Input order does not matter.
    let mut shuffled = points.clone();
    shuffled.reverse();
    let r2 = recommend_interactive(&shuffled, &TTFT_1S, None).unwrap();
    assert_eq!(r2.knobs.max_num_seqs, 8);
    assert_eq!(r2.point, 3);
}

#[test]
fn none_meeting_the_slo_recommends_the_smallest_and_says_so() {
    let slo = SloTargets {
        ttft_p95_ms: 100.0,
        tpot_p50_ms: None,
    };
    let r = recommend_interactive(&sweep(), &slo, Some(2.0)).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 4);
    assert!(!r.slo_met);
    assert!(
        r.reason.contains("No measured configuration meets the SLO")
            && r.reason.contains("does NOT meet"),
        "{}",
        r.reason
    );
    assert!(r.cost_per_million_output_tokens.is_some());
}

#[test]
fn tpot_target_constrains_the_pick() {
    // TTFT alone would allow 16 (→ 8); TPOT P50 ≤ 40 ms stops at 8 (→ 4).
    let slo = SloTargets {
        ttft_p95_ms: 1000.0,
        tpot_p50_ms: Some(40.0),
    };
    let points = sweep();
    let v = verdict(&points[2], &slo);
    assert!(!v.meets && v.ttft_met && v.tpot_met == Some(false));
    assert!(v.why.contains("TPOT P50 45.0 ms > 40 ms"), "{}", v.why);
    let r = recommend_interactive(&points, &slo, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 4);
    assert!(r.slo_met);
    // A point without TPOT samples (one output token each) cannot miss a TPOT target.
    let mut single = pt(4, 200.0, 0.0, 10.0);
    single.tpot_p50_ms = None;
    assert!(verdict(&single, &slo).meets);
}

#[test]
fn only_the_smallest_meeting_is_kept_without_backing_off() {
    let mut points = sweep();
    points[1].ttft_p95_ms = Some(1200.0);
    points[2].ttft_p95_ms = Some(1500.0);
    let r = recommend_interactive(&points, &TTFT_1S, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 4);
    assert!(r.slo_met);
    assert!(r.reason.contains("no smaller step"), "{}", r.reason);
}

#[test]
fn a_pass_after_a_miss_is_noise() {
    let mut points = sweep();
    points[1].ttft_p95_ms = Some(1100.0); // 8 misses, 16 passes again
    let r = recommend_interactive(&points, &TTFT_1S, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 4);
    assert!(r.reason.contains("taken for noise"), "{}", r.reason);
}

#[test]
fn every_point_meeting_backs_off_from_the_largest() {
    let slo = SloTargets {
        ttft_p95_ms: 10_000.0,
        tpot_p50_ms: None,
    };
    let r = recommend_interactive(&sweep(), &slo, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 32);
    assert!(r.reason.contains("larger ones may too"), "{}", r.reason);
}

#[test]
fn failures_and_partial_points_do_not_meet() {
    let mut points = sweep();
    points[2].failed = 3;
    let v = verdict(&points[2], &TTFT_1S);
    assert!(!v.meets && v.why.contains("3 failed"), "{}", v.why);
    let r = recommend_interactive(&points, &TTFT_1S, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 4); // largest clean run is 4..8
    points[2].failed = 0;
    points[2].partial = true;
    assert!(verdict(&points[2], &TTFT_1S)
        .why
        .contains("cut short by the time bound"));
    // No TTFT at all (nothing completed) misses.
    let mut empty = pt(4, 0.0, 0.0, 0.0);
    empty.completed = 0;
    empty.ttft_p95_ms = None;
    assert!(!verdict(&empty, &TTFT_1S).meets);
}

#[test]
fn across_series_the_faster_candidate_wins() {
    let points = vec![
        pt_in(4, 256, 64, 300.0, 30.0, 90.0),
        pt_in(8, 256, 64, 500.0, 35.0, 150.0),
        pt_in(16, 256, 64, 1500.0, 50.0, 250.0),
        pt_in(4, 512, 128, 250.0, 30.0, 110.0),
        pt_in(8, 512, 128, 450.0, 35.0, 190.0),
        pt_in(16, 512, 128, 900.0, 45.0, 300.0),
        pt_in(32, 512, 128, 2000.0, 70.0, 400.0),
    ];
    // Series 256/64: largest 8 → 4 (90 tok/s); series 512/128: largest 16 → 8 (190 tok/s).
    let r = recommend_interactive(&points, &TTFT_1S, None).unwrap();
    assert_eq!(
        r.knobs,
        Knobs {
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            max_prefill_chunk: 128
        }
    );
    assert!(r.reason.contains("most output throughput"), "{}", r.reason);
}

#[test]
fn batch_picks_the_most_output_tokens_per_second() {
    let mut points = sweep();
    let r = recommend_batch(&points, &TTFT_1S, Some(3.6)).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 64);
    assert!(!r.slo_met, "64 misses the TTFT SLO but is the batch pick");
    assert!(r.reason.contains("480.0 tok/s"), "{}", r.reason);
    assert!(
        r.reason.contains("ahead of max_num_seqs=32"),
        "{}",
        r.reason
    );
    // 3.6 per hour at 480 tok/s: 3.6 / (480 · 3600) · 1e6.
    let c = r.cost_per_million_output_tokens.unwrap();
    assert!((c - 3.6 / (480.0 * 3600.0) * 1e6).abs() < 1e-12, "{c}");
    // A faster point with failures is not considered.
    points[4].failed = 2;
    let r = recommend_batch(&points, &TTFT_1S, None).unwrap();
    assert_eq!(r.knobs.max_num_seqs, 32);
    assert!(r.reason.contains("not considered"), "{}", r.reason);
    assert!(recommend_batch(&[], &TTFT_1S, None).is_none());
    assert!(recommend_interactive(&[], &TTFT_1S, None).is_none());
}

#[test]
fn cost_per_million_output_tokens_is_hourly_cost_over_hourly_tokens() {
    // 1000 tok/s = 3.6 M tokens per hour; at 3.6 per hour that is 1.0 per million.
    assert_eq!(cost_per_million_output_tokens(3.6, 1000.0), Some(1.0));
    assert!((cost_per_million_output_tokens(2.0, 250.0).unwrap() - 2.0 / 0.9).abs() < 1e-12);
    assert_eq!(cost_per_million_output_tokens(0.0, 100.0), Some(0.0));
    assert_eq!(cost_per_million_output_tokens(1.0, 0.0), None);
}

#[test]
fn series_stop_after_two_consecutive_misses() {
    assert!(!should_stop(&[]));
    assert!(!should_stop(&[false]));
    assert!(!should_stop(&[true, false]));
    assert!(!should_stop(&[false, true]));
    assert!(should_stop(&[true, false, false]));
    assert!(!should_stop(&[false, true, false]));
}

#[test]
fn percentile_confidence_interval_brackets_the_percentile() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    let (lo, hi) = percentile_ci(&v, 95.0).unwrap();
    assert!(
        lo < 95.0 && hi > 95.0 && lo >= 88.0 && hi <= 100.0,
        "{lo} {hi}"
    );
    let (lo, hi) = percentile_ci(&v, 50.0).unwrap();
    assert!(lo < 50.0 && hi > 50.0, "{lo} {hi}");
    assert_eq!(percentile_ci(&[1.0], 95.0), None);
    // Few samples: the upper end is the maximum.
    let few = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    assert_eq!(percentile_ci(&few, 95.0).unwrap().1, 6.0);
}

#[test]
fn flags_parse_and_plan_the_grid() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
    let a = tune_args(&[
        "--max-num-seqs",
        "64,4,16",
        "--slo-ttft-p95",
        "800ms",
        "--slo-tpot-p50",
        "50",
        "--dataset",
        "prefix",
        "--concurrency",
        "8",
    ]);
    assert_eq!(a.slo_ttft_p95, 800.0);
    assert_eq!(a.slo_tpot_p50, Some(50.0));
    assert_eq!(a.slo_spec().to_string(), "ttft_p95=800ms,tpot_p50=50ms");
    assert_eq!(tune_args(&["--slo-ttft-p95", "1s"]).slo_ttft_p95, 1000.0);
    assert!(Cli::try_parse_from(["tune", "--slo-ttft-p95", "soon"]).is_err());
    assert!(Cli::try_parse_from(["tune", "--concurrency", "2", "--request-rate", "3"]).is_err());
    a.validate().unwrap();

    // Default series: the profile's budget and chunk, batch sizes sorted.
    let base = Profile::load("interactive").unwrap();
    let p = plan(&a, &base).unwrap();
    assert_eq!(p.series.len(), 1);
    let seqs: Vec<usize> = p.series[0].iter().map(|q| q.knobs.max_num_seqs).collect();
    assert_eq!(seqs, vec![4, 16, 64]);
    assert!(p.series[0].iter().all(|q| q.config.max_num_batched_tokens
        == base.max_num_batched_tokens
        && q.config.max_num_seqs == q.knobs.max_num_seqs));

    // A grid of budgets × chunks; an explicit budget below max_num_seqs is left out.
    let g = tune_args(&[
        "--max-num-seqs",
        "8,32",
        "--max-num-batched-tokens",
        "16,256",
        "--max-prefill-chunk",
        "64,128",
    ]);
    let p = plan(&g, &base).unwrap();
    assert_eq!(p.series.len(), 4);
    assert_eq!(p.not_measured.len(), 2, "{:?}", p.not_measured);
    assert!(p.not_measured.iter().all(|n| n.knobs.max_num_seqs == 32
        && n.knobs.max_num_batched_tokens == 16
        && n.reason.contains("invalid")));
    // Paired: element-wise.
    let pr = tune_args(&[
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "256,512",
        "--max-prefill-chunk",
        "64,128",
        "--paired",
    ]);
    let p = plan(&pr, &base).unwrap();
    let keys: Vec<(usize, usize)> = p.series.iter().map(|s| s[0].knobs.series()).collect();
    assert_eq!(keys, vec![(256, 64), (512, 128)]);
    // The profile's budget is raised to a larger batch, with a note.
    let big = tune_args(&["--max-num-seqs", "1024"]);
    let p = plan(&big, &base).unwrap();
    assert_eq!(p.series[0][0].config.max_num_batched_tokens, 1024);
    assert!(p.notes[0].contains("1024"), "{:?}", p.notes);

    // The bench run of a point: the point's batch size as concurrency by default.
    let d = tune_args(&["--dataset", "prefix", "--prefix-len", "400"]);
    let b = d
        .workload
        .bench_args("http://127.0.0.1:1", "m", 16, &d.slo_spec());
    assert_eq!(b.workload.concurrency, Some(16));
    assert_eq!(b.num_requests, Some(64));
    assert_eq!(b.warmup, 8, "one per request in flight, at most 8");
    assert_eq!(b.workload.prefix_len, 400);
    assert!(b.quiet && b.slo.is_some());
    b.validate().unwrap();
    let small = d
        .workload
        .bench_args("http://127.0.0.1:1", "m", 4, &d.slo_spec());
    assert_eq!(small.num_requests, Some(48));
    assert_eq!(small.warmup, 4);
    assert!(tune_args(&["--max-num-seqs", "0"]).validate().is_err());
    assert!(tune_args(&["--max-minutes", "0"]).validate().is_err());
}
