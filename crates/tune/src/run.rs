//! `run_tune`: plan the configurations, measure each (model loaded, server
//! started in-process on a free loopback port, bench workload with warmup,
//! server shut down), stop series early and honour the time bound, recommend,
//! write the outputs.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use sloserve_bench::metrics::ttft;
use sloserve_bench::run_bench;
use sloserve_engine::EngineConfig;
use sloserve_model::{LoadedModel, Precision};
use sloserve_server::{AppState, ServeArgs};

use crate::args::TuneArgs;
use crate::procedure::{
    percentile_ci, recommend_batch, recommend_interactive, should_stop, verdict, Knobs,
    PointMetrics, SloTargets,
};
use crate::progress::{fmt_duration, TuneProgress};
use crate::report::{self, EngineCounters, NotMeasured, TunePoint, TuneReport, SCHEMA};

/// The base configuration: the profile, then `--config`.
pub fn base_config(args: &TuneArgs) -> anyhow::Result<EngineConfig> {
    Ok(EngineConfig::load(
        &args.profile,
        args.config.as_deref(),
        Default::default(),
        |_| {},
    )?)
}

/// A planned configuration.
#[derive(Clone, Debug)]
pub struct Planned {
    pub knobs: Knobs,
    pub config: EngineConfig,
}

/// Every configuration to measure, by series (token budget × prefill chunk,
/// each in ascending `max_num_seqs`), plus the combinations left out and why.
#[derive(Clone, Debug)]
pub struct Plan {
    pub series: Vec<Vec<Planned>>,
    pub not_measured: Vec<NotMeasured>,
    pub notes: Vec<String>,
}

/// The configurations of `args` over `base`: the profile's budget is raised
/// to a larger `max_num_seqs`; an explicit budget smaller than it is left out.
pub fn plan(args: &TuneArgs, base: &EngineConfig) -> anyhow::Result<Plan> {
    let mut seqs = args.max_num_seqs.clone();
    seqs.sort_unstable();
    seqs.dedup();
    let budgets_given = !args.max_num_batched_tokens.is_empty();
    let budgets = if budgets_given {
        args.max_num_batched_tokens.clone()
    } else {
        vec![base.max_num_batched_tokens]
    };
    let chunks = if args.max_prefill_chunk.is_empty() {
        vec![base.max_prefill_chunk]
    } else {
        args.max_prefill_chunk.clone()
    };
    let pairs: Vec<(usize, usize)> = if args.paired {
        let n = budgets.len().max(chunks.len());
        (0..n)
            .map(|i| {
                (
                    budgets[i.min(budgets.len() - 1)],
                    chunks[i.min(chunks.len() - 1)],
                )
            })
            .collect()
    } else {
        budgets
            .iter()
            .flat_map(|&b| chunks.iter().map(move |&c| (b, c)))
            .collect()
    };
    let mut series = Vec::new();
    let mut skipped = Vec::new();
    let mut notes = Vec::new();
    let mut raised = Vec::new();
    for (budget, chunk) in pairs {
        let mut s = Vec::new();
        for &n in &seqs {
            let mut cfg = base.clone();
            cfg.max_num_seqs = n;
            cfg.max_num_batched_tokens = budget;
            cfg.max_prefill_chunk = chunk;
            if budget < n {
                if budgets_given {
                    skipped.push(NotMeasured {
                        knobs: Knobs {
                            max_num_seqs: n,
                            max_num_batched_tokens: budget,
                            max_prefill_chunk: chunk,
                        },
                        reason: "invalid: the token budget is smaller than max_num_seqs (every running sequence decodes each step)".into(),
                    });
                    continue;
                }
                // The profile's budget cannot hold this batch: raise it to the batch size.
                cfg.max_num_batched_tokens = n;
                raised.push(n.to_string());
            }
            cfg.validate()
                .with_context(|| format!("max_num_seqs={n}, budget {budget}, chunk {chunk}"))?;
            s.push(Planned {
                knobs: Knobs {
                    max_num_seqs: n,
                    max_num_batched_tokens: cfg.max_num_batched_tokens,
                    max_prefill_chunk: chunk,
                },
                config: cfg,
            });
        }
        if !s.is_empty() {
            series.push(s);
        }
    }
    if !raised.is_empty() {
        notes.push(format!(
            "the profile's token budget ({}) is smaller than max_num_seqs={}: those points use a budget equal to max_num_seqs",
            base.max_num_batched_tokens,
            raised.join(", ")
        ));
    }
    anyhow::ensure!(
        !series.is_empty(),
        "nothing to measure: every configuration is invalid"
    );
    Ok(Plan {
        series,
        not_measured: skipped,
        notes,
    })
}

/// The 1-minute load average, where the system reports one.
pub fn load_avg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Measure one configuration: load the model, serve it on 127.0.0.1:0, run
/// the bench workload (warmup, then the measured requests, stopping at
/// `remaining`), shut the server down.
async fn measure(
    args: &TuneArgs,
    index: usize,
    p: &Planned,
    remaining: Duration,
    out: &Path,
    progress: &TuneProgress,
) -> anyhow::Result<TunePoint> {
    let t0 = Instant::now();
    let load_avg_start = load_avg_1m();
    let mut serve = ServeArgs::defaults();
    serve.model = args.model.clone();
    serve.profile = args.profile.clone();
    serve.config = args.config.clone();
    serve.precision = args
        .precision
        .parse::<Precision>()
        .map_err(anyhow::Error::msg)?;
    serve.shutdown_timeout = 10.0;
    let opts = serve.runner_options(&p.config);
    let path = args.model.clone();
    let model = tokio::task::spawn_blocking(move || LoadedModel::load(&path, &opts))
        .await
        .context("model loading panicked")?
        .with_context(|| format!("cannot load {}", args.model.display()))?;
    // The server logs the whole effective configuration at start: tune.json
    // and the TOML files have it, so keep it out of the progress output.
    let cfg = p.config.clone();
    let state =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            AppState::from_model(&serve, model, cfg)
        })?;
    let load_s = t0.elapsed().as_secs_f64();
    let mut server = sloserve_server::spawn(state.clone(), "127.0.0.1", 0)
        .await
        .context("cannot start the server")?;
    let url = format!("http://{}", server.addr);
    let mut bench = args.workload.bench_args(
        &url,
        &state.model_name,
        p.knobs.max_num_seqs,
        &args.slo_spec(),
    );
    bench.duration = Some(remaining.as_secs_f64().max(1.0));
    let rel_dir = format!("points/{}", p.knobs.slug());
    bench.out = Some(out.join(&rel_dir));
    let planned = bench.num_requests.unwrap_or(0);
    let warmup = bench.warmup;
    let watch = progress.watch(
        state.clone(),
        p.knobs.slug().replace('_', " "),
        warmup + planned,
    );
    let result = run_bench(bench).await;
    if let Some(w) = watch {
        w.abort();
    }
    let stats = state.engine.stats();
    let engine_counters = EngineCounters {
        num_kv_blocks: stats.kv_blocks_total,
        prefix_cache_hit_rate: stats.prefix_cache_hit_rate(),
        preemptions: stats.counters.preemptions,
        rejected: stats.rejected.interactive + stats.rejected.batch,
        engine_steps: stats.counters.steps,
    };
    server.shutdown();
    let stopped = server.wait().await;
    drop(state);
    let report = result.with_context(|| format!("benchmarking {}", p.knobs))?;
    stopped.context("stopping the server")?;
    let point = report
        .points
        .into_iter()
        .next()
        .context("the bench run measured no point")?;
    let s = &point.summary;
    let ran = s.completed + s.failed;
    let partial = ran < planned;
    let mut ttfts: Vec<f64> = point
        .requests
        .iter()
        .filter(|r| r.ok())
        .filter_map(ttft)
        .map(|v| v * 1e3)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let metrics = PointMetrics::from_summary(p.knobs, s, partial);
    let slo = slo_targets(args);
    Ok(TunePoint {
        index,
        knobs: p.knobs,
        verdict: verdict(&metrics, &slo),
        metrics,
        load: point.load,
        warmup_requests: point.warmup_requests,
        planned_requests: planned,
        ttft_p95_ci_ms: percentile_ci(&ttfts, 95.0),
        summary: point.summary,
        engine: engine_counters,
        load_avg_1m: [load_avg_start, load_avg_1m()],
        model_load_s: load_s,
        wall_s: t0.elapsed().as_secs_f64(),
        report_dir: rel_dir,
        engine_config: p.config.clone(),
    })
}

/// The SLO of `args`.
pub fn slo_targets(args: &TuneArgs) -> SloTargets {
    SloTargets {
        ttft_p95_ms: args.slo_ttft_p95,
        tpot_p50_ms: args.slo_tpot_p50,
    }
}

fn point_line(p: &TunePoint) -> String {
    let s = &p.summary;
    format!(
        "{}: TTFT P95 {:.0} ms, TPOT P50 {:.1} ms, {:.1} output tok/s over {} requests ({} failed): {}",
        p.knobs,
        s.ttft_ms.p95,
        s.tpot_ms.median,
        s.output_throughput,
        s.completed + s.failed,
        s.failed,
        p.verdict.why
    )
}

/// Run `sloserve tune` as configured by `args`; writes every output to
/// `--out` and prints the table and recommendations to stdout.
/// Needs a Tokio runtime (or use [`run_tune_blocking`]).
pub async fn run_tune(args: TuneArgs) -> anyhow::Result<TuneReport> {
    args.validate()?;
    if let Some(path) = &args.reanalyze {
        return reanalyze(&args, path);
    }
    anyhow::ensure!(
        args.model.exists(),
        "model file {} not found (run `make model` for the default one)",
        args.model.display()
    );
    let started_unix_s = unix_now();
    let started = Instant::now();
    let bound = Duration::from_secs_f64(args.max_minutes * 60.0);
    let deadline = started + bound;
    let base = base_config(&args)?;
    let Plan {
        series,
        mut not_measured,
        mut notes,
    } = plan(&args, &base)?;
    let out = args.out.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let total: usize = series.iter().map(Vec::len).sum();
    let slo = slo_targets(&args);
    let progress = TuneProgress::start(total, bound, args.quiet);
    progress.println(&format!(
        "sloserve tune: {total} configuration(s) of {}; SLO {slo}; load: {}; time bound {}",
        args.model.display(),
        args.workload.load_description(),
        fmt_duration(bound)
    ));
    let load_avg_start = load_avg_1m();
    let mut points: Vec<TunePoint> = Vec::new();
    let mut time_bound_hit = false;
    'series: for (si, s) in series.iter().enumerate() {
        let mut meets = Vec::new();
        for (j, p) in s.iter().enumerate() {
            if !args.no_early_stop && should_stop(&meets) {
                let missed: Vec<String> = s[j - 2..j]
                    .iter()
                    .map(|q| q.knobs.max_num_seqs.to_string())
                    .collect();
                let why = format!(
                    "early stop: max_num_seqs={} both missed the SLO, and larger batches only add latency",
                    missed.join(" and ")
                );
                for q in &s[j..] {
                    not_measured.push(NotMeasured {
                        knobs: q.knobs,
                        reason: why.clone(),
                    });
                }
                progress.skipped(s.len() - j, &why);
                continue 'series;
            }
            let now = Instant::now();
            let remaining = deadline.saturating_duration_since(now);
            // The last point's time, scaled by the requests planned here.
            let estimate = points.last().map(|last| {
                let planned_here = args.workload.requests_for(
                    args.workload.load_for(p.knobs.max_num_seqs),
                    p.knobs.max_num_seqs,
                ) + args.workload.warmup_for(
                    args.workload.load_for(p.knobs.max_num_seqs),
                    p.knobs.max_num_seqs,
                );
                let planned_last = (last.planned_requests + last.warmup_requests).max(1);
                last.wall_s * planned_here as f64 / planned_last as f64
            });
            if remaining.is_zero() || estimate.is_some_and(|e| remaining.as_secs_f64() < 0.5 * e) {
                time_bound_hit = true;
                let why = format!(
                    "time bound: {} of {} left{}",
                    fmt_duration(remaining),
                    fmt_duration(bound),
                    estimate
                        .map(|e| format!(
                            ", this point needs about {}",
                            fmt_duration(Duration::from_secs_f64(e))
                        ))
                        .unwrap_or_default()
                );
                let rest: Vec<&Planned> = s[j..]
                    .iter()
                    .chain(series[si + 1..].iter().flatten())
                    .collect();
                for q in &rest {
                    not_measured.push(NotMeasured {
                        knobs: q.knobs,
                        reason: why.clone(),
                    });
                }
                progress.skipped(rest.len(), &why);
                break 'series;
            }
            let index = points.len();
            progress.point_started(index, &p.knobs.to_string());
            let point = measure(&args, index, p, remaining, &out, &progress).await?;
            if point.metrics.partial {
                time_bound_hit = true;
            }
            progress.point_done(index, &point_line(&point));
            meets.push(point.verdict.meets);
            points.push(point);
        }
    }
    progress.finish();
    if time_bound_hit {
        notes.push(format!(
            "the time bound (--max-minutes {}) was reached: see the points not measured or cut short",
            args.max_minutes
        ));
    }
    if let Some(c) = args.workload.spec.concurrency {
        let above: Vec<String> = points
            .iter()
            .filter(|p| p.knobs.max_num_seqs > c)
            .map(|p| p.knobs.max_num_seqs.to_string())
            .collect();
        if !above.is_empty() {
            notes.push(format!(
                "with --concurrency {c}, at most {c} sequences ever run at once: max_num_seqs={} are not exercised beyond {c} (omit --concurrency to measure each batch size full)",
                above.join(", ")
            ));
        }
    }
    let mut report = TuneReport {
        schema: SCHEMA.into(),
        started_unix_s,
        wall_s: started.elapsed().as_secs_f64(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        model: args.model.display().to_string(),
        load: args.workload.load_description(),
        slo,
        base_config: base,
        load_avg_1m: [load_avg_start, load_avg_1m()],
        cpus: std::thread::available_parallelism().map(|n| n.get()).ok(),
        points,
        not_measured,
        notes,
        interactive: None,
        batch: None,
        args,
    };
    recommend(&mut report);
    write_and_print(&report, &out)?;
    Ok(report)
}

/// Apply the procedure to the report's points under its SLO and cost: each
/// point's verdict, the interactive and batch recommendations.
pub fn recommend(report: &mut TuneReport) {
    let slo = report.slo;
    for p in &mut report.points {
        p.verdict = verdict(&p.metrics, &slo);
    }
    let metrics: Vec<PointMetrics> = report.points.iter().map(|p| p.metrics.clone()).collect();
    let cost = report.args.machine_cost_per_hour;
    report.interactive = recommend_interactive(&metrics, &slo, cost);
    report.batch = recommend_batch(&metrics, &slo, cost);
    if let Some(b) = &mut report.batch {
        let series = b.knobs.series();
        let largest_measured = metrics
            .iter()
            .filter(|p| p.knobs.series() == series)
            .map(|p| p.knobs.max_num_seqs)
            .max();
        let larger_unmeasured = report
            .not_measured
            .iter()
            .any(|n| n.knobs.series() == series && n.knobs.max_num_seqs > b.knobs.max_num_seqs);
        if largest_measured == Some(b.knobs.max_num_seqs) && larger_unmeasured {
            b.reason.push_str(" Throughput was still rising at the largest batch measured, and larger ones were not measured: rerun with `--no-early-stop` (or a longer `--max-minutes`) to find the peak.");
        }
    }
}

fn write_and_print(report: &TuneReport, out: &Path) -> anyhow::Result<()> {
    let files = crate::outputs::write_outputs(report, out)?;
    println!("{}", report::console_text(report));
    if !report.args.quiet {
        eprintln!("wrote {} files to {}", files.len(), out.display());
    }
    Ok(())
}

/// `--reanalyze FILE`: the points of an earlier tune.json under this run's
/// SLO and cost flags, written to `--out`. Nothing is measured.
pub fn reanalyze(args: &TuneArgs, path: &Path) -> anyhow::Result<TuneReport> {
    let mut r = TuneReport::load(path)?;
    let src = path.parent().unwrap_or(Path::new("."));
    let same_dir = match (src.canonicalize(), args.out.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_dir {
        // Keep the links to each point's bench report working from elsewhere.
        let abs = src.canonicalize().unwrap_or_else(|_| src.to_path_buf());
        for p in &mut r.points {
            p.report_dir = abs.join(&p.report_dir).display().to_string();
        }
    }
    let old_slo = r.slo;
    r.slo = slo_targets(args);
    r.args.slo_ttft_p95 = args.slo_ttft_p95;
    r.args.slo_tpot_p50 = args.slo_tpot_p50;
    r.args.machine_cost_per_hour = args.machine_cost_per_hour;
    r.args.out = args.out.clone();
    r.args.quiet = args.quiet;
    r.notes.push(format!(
        "re-analysed from {} (measured under SLO {old_slo}; its early stops and time bound were decided then): the points are those measured, with the command below",
        path.display()
    ));
    r.notes.push(format!("measured with: `{}`", r.command));
    r.command = std::env::args().collect::<Vec<_>>().join(" ");
    recommend(&mut r);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_and_print(&r, &args.out)?;
    Ok(r)
}

/// The in-process server logs every request and its lifecycle at INFO, which
/// would bury the tune's progress: unless `RUST_LOG` says otherwise, the
/// tune's own threads log warnings and errors only.
fn warnings_only() -> Option<tracing::Dispatch> {
    if std::env::var_os("RUST_LOG").is_some() {
        return None;
    }
    Some(tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    ))
}

/// [`run_tune`] on a fresh multi-threaded Tokio runtime, for a synchronous
/// `main`. Unless `RUST_LOG` is set, the server's INFO logs are left out
/// (warnings and errors still show).
pub fn run_tune_blocking(args: TuneArgs) -> anyhow::Result<TuneReport> {
    let quiet = warnings_only();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(d) = quiet.clone() {
        // Each runtime thread keeps this default for its lifetime.
        builder.on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&d)));
    }
    let rt = builder.build().context("starting the Tokio runtime")?;
    match quiet {
        Some(d) => tracing::dispatcher::with_default(&d, || rt.block_on(run_tune(args))),
        None => rt.block_on(run_tune(args)),
    }
}
