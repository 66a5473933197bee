//! `run_bench`: resolve the model, build the workload, run every load point (warmup, measured run), summarise, report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};

use crate::args::BenchArgs;
use crate::client::{normalize_base_url, Client, ClientConfig};
use crate::load::{drive, LoadSpec, RunPlan};
use crate::metrics::summarize;
use crate::progress::Progress;
use crate::record::RequestRecord;
use crate::report::{table, write_outputs, BenchReport, PointReport, SCHEMA};
use crate::workload::{workload, DURATION_POOL};

/// Run `sloserve bench` as configured by `args`: every load point in turn,
/// printing progress (stderr) and tables (stdout) unless `--quiet`, and
/// writing results.json, report.md and plots when `--out` is set.
/// Needs a Tokio runtime (call it from `#[tokio::main]`, or use [`run_bench_blocking`]).
pub async fn run_bench(mut args: BenchArgs) -> anyhow::Result<BenchReport> {
    args.validate()?;
    // Record the effective values in the report's config.
    args.workload.ignore_eos = Some(args.workload.ignore_eos());
    let started_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut cfg = ClientConfig {
        base_url: args.url.clone(),
        endpoint: args.endpoint,
        model: args.model.clone().unwrap_or_default(),
        api_key: args.api_key.clone(),
        ignore_eos: args.workload.ignore_eos(),
        timeout: Duration::from_secs_f64(args.timeout),
    };
    if args.model.is_none() {
        cfg.model = Client::new(cfg.clone())
            .first_model()
            .await
            .context("no --model given, and listing the server's models failed")?;
    }
    args.model = Some(cfg.model.clone());
    let client = Client::new(cfg.clone());

    let per_point = args.requests_per_point();
    let points = args.load_points();
    for load in &points {
        if let (
            None,
            LoadSpec::Open {
                rate,
                max_concurrency: None,
                ..
            },
        ) = (per_point, load)
        {
            if rate.is_infinite() {
                bail!("--request-rate inf with only --duration would send without bound: add --num-requests or --max-concurrency");
            }
        }
    }
    let all = workload(
        &args.workload,
        args.warmup + per_point.unwrap_or(DURATION_POOL),
    )?;
    let warm = Arc::new(all[..args.warmup].to_vec());
    let work = Arc::new(all[args.warmup..].to_vec());
    let slo = args.slo.clone().unwrap_or_default();
    let mut reports = Vec::new();
    for load in points {
        let label = load.label();
        if !warm.is_empty() {
            let conc = match load {
                LoadSpec::Closed { concurrency } => concurrency,
                LoadSpec::Open {
                    max_concurrency, ..
                } => max_concurrency.unwrap_or(warm.len()),
            };
            let plan = RunPlan {
                load: LoadSpec::Closed {
                    concurrency: conc.min(warm.len()),
                },
                num_requests: Some(warm.len()),
                duration: None,
                seed: args.workload.seed,
            };
            if !args.quiet {
                eprintln!("[{label}] warming up with {} requests", warm.len());
            }
            drive(
                &client,
                warm.clone(),
                &plan,
                Arc::new(|_: &RequestRecord| {}),
            )
            .await;
        }
        let progress = Progress::start(&label, per_point, args.quiet);
        let plan = RunPlan {
            load,
            num_requests: per_point,
            duration: args.duration.map(Duration::from_secs_f64),
            seed: args.workload.seed,
        };
        let (records, duration) = drive(&client, work.clone(), &plan, progress.on_done()).await;
        progress.finish();
        let summary = summarize(&records, duration, &slo);
        let class_names: BTreeSet<String> =
            records.iter().filter_map(|r| r.class.clone()).collect();
        let classes: BTreeMap<String, _> = class_names
            .into_iter()
            .map(|c| {
                let of_class: Vec<RequestRecord> = records
                    .iter()
                    .filter(|r| r.class.as_deref() == Some(&c))
                    .cloned()
                    .collect();
                let s = summarize(&of_class, duration, &slo);
                (c, s)
            })
            .collect();
        let value = args.sweep.as_ref().map(|_| match load {
            LoadSpec::Closed { concurrency } => concurrency as f64,
            LoadSpec::Open { rate, .. } => rate,
        });
        let point = PointReport {
            label,
            load,
            value,
            warmup_requests: warm.len(),
            summary,
            classes,
            requests: records,
        };
        if !args.quiet {
            println!("{}", table::point_text(&point));
        }
        reports.push(point);
    }

    let mut notes = Vec::new();
    let missing: usize = reports.iter().map(|p| p.summary.usage_missing).sum();
    if missing > 0 {
        notes.push(format!(
            "the server sent no `usage` for {missing} successful requests: their output tokens are counted as content chunks and their input tokens are the workload's word-count estimate"
        ));
    }
    let report = BenchReport {
        schema: SCHEMA.into(),
        started_unix_s,
        url: normalize_base_url(&args.url),
        endpoint: args.endpoint,
        model: cfg.model,
        sweep: args.sweep.clone(),
        notes,
        points: reports,
        config: args,
    };
    if !report.config.quiet {
        if report.points.len() > 1 {
            println!("{}", table::sweep_text(&report.points));
        }
        for n in &report.notes {
            eprintln!("note: {n}");
        }
    }
    if let Some(dir) = &report.config.out {
        let files = write_outputs(&report, dir)?;
        if !report.config.quiet {
            eprintln!("wrote {} files to {}", files.len(), dir.display());
        }
    }
    Ok(report)
}

/// [`run_bench`] on a fresh multi-threaded Tokio runtime, for a synchronous `main`.
pub fn run_bench_blocking(args: BenchArgs) -> anyhow::Result<BenchReport> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the Tokio runtime")?
        .block_on(run_bench(args))
}
