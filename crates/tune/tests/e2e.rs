//! End to end: a tiny tune (max_num_seqs 2 and 4, six requests each, short
//! prompts) on the real default model, each point served in-process and
//! benched; then every output: tune.json, the TOML configs (parsed back the
//! way `sloserve serve --config` reads them), report.md and the plots.

#[path = "../../bench/tests/support/plots.rs"]
mod plots;

use std::path::{Path, PathBuf};

use clap::Parser;
use sloserve_engine::{EngineConfig, Profile};
use sloserve_tune::{run_tune, TuneArgs, TuneReport};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: TuneArgs,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    let p = root().join(sloserve_model::DEFAULT_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model` first",
        p.display()
    );
    p
}

fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tune-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The TOML file as `sloserve serve --profile interactive --config FILE` reads it.
fn served_config(path: &Path) -> EngineConfig {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Profile::load("interactive")
        .unwrap()
        .with_overrides_toml(&text)
        .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()))
}

#[test]
fn tiny_tune_on_the_real_model() {
    let dir = out_dir("tiny");
    let cfg = dir.with_extension("base.toml");
    // A small KV cache and context keep each point's model load quick.
    std::fs::write(&cfg, "kv_cache_memory = 67108864\nmax_model_len = 1024\n").unwrap();
    let m = model();
    let flags = [
        "--model",
        m.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
        "--max-num-seqs",
        "4,2",
        "--dataset",
        "prefix",
        "--prefix-len",
        "48",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--num-requests",
        "6",
        "--warmup",
        "2",
        "--slo-ttft-p95",
        "60s",
        "--machine-cost-per-hour",
        "1.5",
        "--max-minutes",
        "5",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ];
    let args = Cli::try_parse_from(std::iter::once("tune").chain(flags))
        .unwrap()
        .args;
    let t0 = std::time::Instant::now();
    let report = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run_tune(args))
        .expect("tune runs");
    eprintln!("tiny tune took {:.1}s", t0.elapsed().as_secs_f64());

    // Both points measured, in ascending batch size, with every request served.
    let seqs: Vec<usize> = report.points.iter().map(|p| p.knobs.max_num_seqs).collect();
    assert_eq!(seqs, vec![2, 4]);
    for p in &report.points {
        assert_eq!(
            p.summary.completed, 6,
            "{}: {:?}",
            p.knobs, p.summary.errors
        );
        assert_eq!(p.summary.failed, 0);
        assert_eq!(p.warmup_requests, 2);
        assert!(!p.metrics.partial);
        assert!(p.verdict.meets, "{}: {}", p.knobs, p.verdict.why);
        assert_eq!(p.engine_config.max_num_seqs, p.knobs.max_num_seqs);
        assert_eq!(p.engine_config.kv_cache_memory, Some(64 << 20));
        assert!(p.summary.ttft_ms.count == 6 && p.summary.output_throughput > 0.0);
        assert_eq!(p.summary.total_output_tokens, 6 * 8);
        assert!(
            p.engine.prefix_cache_hit_rate > 0.0,
            "the shared prefix is reused"
        );
        assert!(dir.join(&p.report_dir).join("results.json").exists());
        assert!(dir.join(&p.report_dir).join("report.md").exists());
    }
    assert!(report.not_measured.is_empty(), "{:?}", report.not_measured);

    // Both meet a 60 s SLO: the largest (4) is backed off to 2. Batch: the faster.
    let inter = report.interactive.as_ref().unwrap();
    assert_eq!(inter.knobs.max_num_seqs, 2);
    assert!(inter.slo_met);
    let batch = report.batch.as_ref().unwrap();
    let fastest = report
        .points
        .iter()
        .max_by(|a, b| {
            a.summary
                .output_throughput
                .total_cmp(&b.summary.output_throughput)
        })
        .unwrap();
    assert_eq!(batch.knobs, fastest.knobs);
    let c = batch.cost_per_million_output_tokens.unwrap();
    assert!((c - 1.5 / (batch.output_tok_s * 3600.0) * 1e6).abs() < 1e-9);

    // The configs load as `serve --config` reads them, and are the measured ones.
    for (file, rec) in [("interactive.toml", inter), ("batch.toml", batch)] {
        let path = dir.join(file);
        let served = served_config(&path);
        let measured = &report.points[rec.point].engine_config;
        assert_eq!(&served, measured, "{file}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(&EngineConfig::from_toml_str(&text).unwrap(), measured);
        assert!(text.starts_with("# sloserve tune:"), "{text}");
        assert!(text.contains("sloserve serve --model"), "{text}");
    }

    // mixed.toml: the mixed profile at the batch pick's size, the SLO as the
    // interactive class's default TTFT target, the --config's KV cache kept.
    let mixed_text = std::fs::read_to_string(dir.join("mixed.toml")).unwrap();
    assert!(mixed_text.contains("NOT measured"), "{mixed_text}");
    let mixed = EngineConfig::from_toml_str(&mixed_text).unwrap();
    let profile = Profile::load("mixed").unwrap();
    assert_eq!(mixed.max_num_seqs, batch.knobs.max_num_seqs);
    assert_eq!(mixed.default_ttft_slo_ms, Some(60_000.0));
    assert_eq!(mixed.default_tpot_slo_ms, profile.default_tpot_slo_ms);
    assert_eq!(mixed.kv_cache_memory, Some(64 << 20));
    assert!(mixed.slo_classes && mixed.enable_preemption);
    assert_eq!(mixed.max_step_ms, profile.max_step_ms);

    // tune.json round-trips.
    let back = TuneReport::load(&dir.join("tune.json")).unwrap();
    assert_eq!(back.points.len(), 2);
    assert_eq!(back.interactive, report.interactive);

    // report.md: every point, the SLO, why, the commands; plots valid.
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for needle in [
        "## Every point measured",
        "TTFT P95 ≤ 60000 ms",
        "**interactive**",
        "**batch**",
        "backed off one step",
        "sloserve serve --model",
        "sloserve bench --dataset prefix",
        "--concurrency 2",
        "ttft_vs_max_num_seqs.png",
        "cost / M output tok",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}:\n{md}");
    }
    for stem in [
        "ttft_vs_max_num_seqs",
        "tpot_vs_max_num_seqs",
        "throughput_vs_max_num_seqs",
    ] {
        plots::check_plot(&dir, stem);
    }

    // Re-analysed under an impossible SLO: same points, nothing measured, no pick meets it.
    let again = out_dir("tiny-again");
    let json = dir.join("tune.json");
    let r2 = run(&[
        "--reanalyze",
        json.to_str().unwrap(),
        "--slo-ttft-p95",
        "0.001ms",
        "--quiet",
        "--out",
        again.to_str().unwrap(),
    ]);
    assert_eq!(r2.points.len(), 2);
    // (JSON keeps the numbers to within an ulp or so.)
    assert_eq!(
        r2.points[0].summary.completed,
        report.points[0].summary.completed
    );
    assert!((r2.points[0].summary.ttft_ms.p95 - report.points[0].summary.ttft_ms.p95).abs() < 1e-6);
    assert!(r2.points.iter().all(|p| !p.verdict.meets));
    assert!(!r2.interactive.as_ref().unwrap().slo_met);
    assert_eq!(r2.interactive.as_ref().unwrap().knobs.max_num_seqs, 2);
    assert!(Path::new(&r2.points[0].report_dir)
        .join("results.json")
        .exists());
    let md = std::fs::read_to_string(again.join("report.md")).unwrap();
    assert!(
        md.contains("re-analysed from") && md.contains("No measured configuration meets the SLO")
    );
    served_config(&again.join("interactive.toml"));
    let _ = std::fs::remove_dir_all(&again);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&cfg);
}

fn run(flags: &[&str]) -> TuneReport {
    let args = Cli::try_parse_from(std::iter::once("tune").chain(flags.iter().copied()))
        .unwrap()
        .args;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run_tune(args))
        .expect("tune runs")
}

#[test]
fn a_series_stops_after_two_misses_and_an_unmet_slo_is_said_so() {
    let dir = out_dir("early");
    let m = model();
    let report = run(&[
        "--model",
        m.to_str().unwrap(),
        "--max-num-seqs",
        "1,2,4",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--num-requests",
        "3",
        "--warmup",
        "0",
        "--slo-ttft-p95",
        "0.001ms",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let seqs: Vec<usize> = report.points.iter().map(|p| p.knobs.max_num_seqs).collect();
    assert_eq!(seqs, vec![1, 2], "two misses stop the series");
    assert_eq!(report.not_measured.len(), 1);
    assert_eq!(report.not_measured[0].knobs.max_num_seqs, 4);
    assert!(report.not_measured[0].reason.contains("early stop"));
    let inter = report.interactive.as_ref().unwrap();
    assert_eq!(inter.knobs.max_num_seqs, 1);
    assert!(!inter.slo_met);
    let toml = std::fs::read_to_string(dir.join("interactive.toml")).unwrap();
    assert!(toml.contains("NOT met"), "{toml}");
    served_config(&dir.join("interactive.toml"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("No measured configuration meets the SLO"));
    assert!(md.contains("### Not measured") && md.contains("early stop"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_time_bound_cuts_a_point_short_and_skips_the_rest() {
    let dir = out_dir("bound");
    let m = model();
    let report = run(&[
        "--model",
        m.to_str().unwrap(),
        "--max-num-seqs",
        "2,4",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--num-requests",
        "1000",
        "--warmup",
        "0",
        "--max-minutes",
        "0.05",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(report.points.len(), 1);
    let p = &report.points[0];
    assert!(p.metrics.partial);
    let ran = p.summary.completed + p.summary.failed;
    assert!(ran > 0 && ran < 1000, "{ran}");
    assert!(p.verdict.why.contains("cut short by the time bound"));
    assert!(p.wall_s < 60.0, "the point stopped sending at the bound");
    assert_eq!(report.not_measured.len(), 1);
    assert!(report.not_measured[0].reason.contains("time bound"));
    assert!(report.notes.iter().any(|n| n.contains("time bound")));
    // Only a cut-short point: it is still reported, and never said to meet the SLO.
    assert!(!report.interactive.as_ref().unwrap().slo_met);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains(&format!("{ran} of 1000")), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}
