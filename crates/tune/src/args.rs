//! `TuneArgs`: every `sloserve tune` flag, and how one measured point's
//! `sloserve bench` configuration ([`BenchArgs`]) is made from them.

use std::path::PathBuf;

use clap::{Args, Parser};
use serde::{Deserialize, Serialize};
use sloserve_bench::dataset::DatasetSpec;
use sloserve_bench::slo::{SloMetric, SloTarget};
use sloserve_bench::{BenchArgs, Endpoint, SloSpec, WorkloadSpec};

/// The default model file (fetched by `make model`).
pub use sloserve_model::DEFAULT_MODEL_PATH as DEFAULT_MODEL;

/// Fewest measured requests per point when `--num-requests` is not given.
pub const MIN_REQUESTS_PER_POINT: usize = 48;
/// Measured requests per request in flight when `--num-requests` is not given:
/// every slot of the batch turns over this many times.
pub const REQUESTS_PER_SLOT: usize = 4;
/// Most warmup requests per point when `--warmup` is not given: they run at
/// once, before the prefix cache holds anything, so more only costs time.
pub const MAX_DEFAULT_WARMUP: usize = 8;

/// Run the engine at a sequence of configurations under a bench workload and
/// recommend an interactive configuration (the largest batch meeting the SLO,
/// backed off one step) and a batch one (the most output tokens per second).
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct TuneArgs {
    /// GGUF model file.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// fast (quantized weights; 8-bit activations in decode steps, f32 products for
    /// prompts), int8 (8-bit activations throughout, as llama.cpp: faster prefill,
    /// llama.cpp's accuracy) or exact (f32 on dequantized weights).
    #[arg(long, default_value = "fast", value_parser = ["fast", "int8", "exact"])]
    pub precision: String,
    /// Engine profile every measured configuration starts from (interactive, batch, mixed).
    #[arg(long, default_value = "interactive")]
    pub profile: String,
    /// TOML of engine settings laid over the profile before the tuned knobs
    /// (same keys as `sloserve serve --config`), e.g. to size the KV cache.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Batch sizes to measure, ascending (`max_num_seqs`).
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64")]
    pub max_num_seqs: Vec<usize>,
    /// Token budgets per step to measure (`max_num_batched_tokens`); default: the profile's.
    #[arg(long, value_delimiter = ',')]
    pub max_num_batched_tokens: Vec<usize>,
    /// Prefill chunk sizes to measure (`max_prefill_chunk`); default: the profile's.
    #[arg(long, value_delimiter = ',')]
    pub max_prefill_chunk: Vec<usize>,
    /// Pair `--max-num-batched-tokens` and `--max-prefill-chunk` element-wise
    /// instead of measuring every combination (a list of one value pairs with all).
    #[arg(long)]
    pub paired: bool,

    #[command(flatten)]
    pub workload: WorkloadArgs,

    /// TTFT P95 target (`1s`, `800ms`; a bare number is milliseconds).
    #[arg(long, default_value = "1s", value_parser = parse_threshold_ms)]
    #[serde(rename = "slo_ttft_p95_ms")]
    pub slo_ttft_p95: f64,
    /// Optional TPOT P50 target (`50ms`), checked together with the TTFT target.
    #[arg(long, value_parser = parse_threshold_ms)]
    #[serde(rename = "slo_tpot_p50_ms")]
    pub slo_tpot_p50: Option<f64>,
    /// Machine cost per hour (any currency): reports cost per million output tokens.
    #[arg(long)]
    pub machine_cost_per_hour: Option<f64>,
    /// Time bound of the whole tune, in minutes: no point starts that the
    /// remaining time cannot hold, and a running point stops sending at the bound.
    #[arg(long, default_value_t = 30.0)]
    pub max_minutes: f64,
    /// Measure every batch size, instead of stopping a series after two
    /// consecutive SLO violations.
    #[arg(long)]
    pub no_early_stop: bool,
    /// Write interactive.toml, batch.toml, tune.json, report.md, plots and
    /// each point's bench report (points/) here.
    #[arg(long, default_value = "out/tune")]
    pub out: PathBuf,
    /// No progress bar or progress lines (the final table is still printed).
    #[arg(long)]
    pub quiet: bool,
    /// Measure nothing: re-apply the procedure with this run's SLO and cost
    /// flags to the points of an earlier `tune.json`, writing to `--out`
    /// (the workload and configurations are the file's).
    #[arg(long, value_name = "TUNE_JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reanalyze: Option<PathBuf>,
}

/// The workload of every point: the `sloserve bench` flags of the same names
/// ([`WorkloadSpec`], shared with it), and how many requests each point runs.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadArgs {
    /// Endpoint: completions or chat.
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
    /// Load shape, dataset, lengths, SLO classes and seed, as `sloserve bench` takes them.
    #[command(flatten)]
    #[serde(flatten)]
    pub spec: WorkloadSpec,
    /// Measured requests per point (default: the larger of 48 and 4 per request in flight).
    #[arg(long)]
    pub num_requests: Option<usize>,
    /// Requests sent and discarded before each point's measured run
    /// (default: one per request in flight, at most 8; they also fill the prefix cache).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Per-request timeout (seconds).
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
}

/// `1s`, `800ms`, `250` (ms) → milliseconds, as the thresholds of `sloserve bench --slo`.
pub fn parse_threshold_ms(s: &str) -> Result<f64, String> {
    format!("ttft={s}")
        .parse::<SloTarget>()
        .map(|t| t.threshold_ms)
}

/// `sloserve bench` with every default (as if run with no flags).
pub fn bench_defaults() -> BenchArgs {
    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: BenchArgs,
    }
    P::try_parse_from(["bench"])
        .expect("bench's defaults parse")
        .a
}

/// How many requests are in flight at a point, and how they arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PointLoad {
    Closed(usize),
    Open {
        rate: f64,
        max_concurrency: Option<usize>,
    },
}

impl WorkloadArgs {
    /// The load of the point with this batch size.
    pub fn load_for(&self, max_num_seqs: usize) -> PointLoad {
        match (self.spec.concurrency, self.spec.request_rate) {
            (Some(c), _) => PointLoad::Closed(c),
            (None, Some(rate)) => PointLoad::Open {
                rate,
                max_concurrency: self.spec.max_concurrency,
            },
            (None, None) => PointLoad::Closed(max_num_seqs),
        }
    }

    /// Requests in flight at a point (an open loop's cap, or the batch size when uncapped).
    fn in_flight(&self, load: PointLoad, max_num_seqs: usize) -> usize {
        match load {
            PointLoad::Closed(c) => c,
            PointLoad::Open {
                max_concurrency, ..
            } => max_concurrency.unwrap_or(max_num_seqs),
        }
    }

    /// Measured requests at a point.
    pub fn requests_for(&self, load: PointLoad, max_num_seqs: usize) -> usize {
        self.num_requests.unwrap_or_else(|| {
            (REQUESTS_PER_SLOT * self.in_flight(load, max_num_seqs)).max(MIN_REQUESTS_PER_POINT)
        })
    }

    /// Warmup requests at a point.
    pub fn warmup_for(&self, load: PointLoad, max_num_seqs: usize) -> usize {
        self.warmup
            .unwrap_or_else(|| self.in_flight(load, max_num_seqs).min(MAX_DEFAULT_WARMUP))
    }

    /// One sentence on how load is applied, for the report.
    pub fn load_description(&self) -> String {
        let w = &self.spec;
        match (w.concurrency, w.request_rate) {
            (Some(c), _) => format!("closed loop, {c} requests in flight at every point"),
            (None, Some(r)) => format!(
                "open loop, {} requests/s (burstiness {}){}",
                sloserve_bench::sweep::fmt_rate(r),
                w.burstiness,
                w.max_concurrency
                    .map(|m| format!(", at most {m} in flight"))
                    .unwrap_or_default()
            ),
            (None, None) => {
                "closed loop, as many requests in flight as the point's max_num_seqs (each batch size measured full)".into()
            }
        }
    }

    /// The workload flags as `sloserve bench` takes them (load flags excluded).
    pub fn workload_flags(&self) -> Vec<String> {
        let w = &self.spec;
        let mut f = vec![
            "--dataset".to_string(),
            w.dataset.to_string(),
            "--input-len".into(),
            w.input_len.to_string(),
        ];
        let mut push = |k: &str, v: String| {
            f.push(k.to_string());
            f.push(v);
        };
        if self.endpoint != Endpoint::Completions {
            push("--endpoint", "chat".into());
        }
        if let Some(d) = &w.input_len_dist {
            push("--input-len-dist", d.to_string());
        }
        if let Some(n) = w.output_len {
            push("--output-len", n.to_string());
        }
        if let Some(d) = &w.output_len_dist {
            push("--output-len-dist", d.to_string());
        }
        if w.dataset == DatasetSpec::Prefix {
            push("--prefix-len", w.prefix_len.to_string());
            if w.num_prefixes != 1 {
                push("--num-prefixes", w.num_prefixes.to_string());
            }
        }
        if let Some(b) = w.ignore_eos {
            push("--ignore-eos", b.to_string());
        }
        if let Some(m) = &w.slo_class {
            push("--slo-class", m.to_string());
        }
        if w.seed != 0 {
            push("--seed", w.seed.to_string());
        }
        f
    }

    /// The load flags of `sloserve bench` for the point with this batch size.
    pub fn load_flags(&self, max_num_seqs: usize) -> Vec<String> {
        let load = self.load_for(max_num_seqs);
        let mut f = match load {
            PointLoad::Closed(c) => vec!["--concurrency".to_string(), c.to_string()],
            PointLoad::Open {
                rate,
                max_concurrency,
            } => {
                let mut f = vec![
                    "--request-rate".to_string(),
                    sloserve_bench::sweep::fmt_rate(rate),
                ];
                if self.spec.burstiness != 1.0 {
                    f.extend(["--burstiness".into(), self.spec.burstiness.to_string()]);
                }
                if let Some(m) = max_concurrency {
                    f.extend(["--max-concurrency".into(), m.to_string()]);
                }
                f
            }
        };
        f.extend([
            "--num-requests".into(),
            self.requests_for(load, max_num_seqs).to_string(),
            "--warmup".into(),
            self.warmup_for(load, max_num_seqs).to_string(),
        ]);
        f
    }

    /// The `sloserve bench` run of one point: this workload, the point's load,
    /// `slo` checked, against `url`.
    pub fn bench_args(
        &self,
        url: &str,
        model: &str,
        max_num_seqs: usize,
        slo: &SloSpec,
    ) -> BenchArgs {
        let load = self.load_for(max_num_seqs);
        let mut b = bench_defaults();
        b.url = url.to_string();
        b.endpoint = self.endpoint;
        b.model = Some(model.to_string());
        b.api_key = None;
        b.workload = self.spec.clone();
        match load {
            PointLoad::Closed(c) => {
                b.workload.concurrency = Some(c);
                b.workload.request_rate = None;
                b.workload.max_concurrency = None;
            }
            PointLoad::Open {
                rate,
                max_concurrency,
            } => {
                b.workload.concurrency = None;
                b.workload.request_rate = Some(rate);
                b.workload.max_concurrency = max_concurrency;
            }
        }
        b.num_requests = Some(self.requests_for(load, max_num_seqs));
        b.duration = None;
        b.warmup = self.warmup_for(load, max_num_seqs);
        b.sweep = None;
        b.slo = Some(slo.clone());
        b.timeout = self.timeout;
        b.out = None;
        b.quiet = true;
        b
    }
}

impl TuneArgs {
    /// The TTFT (and TPOT) targets as `sloserve bench --slo` takes them.
    pub fn slo_spec(&self) -> SloSpec {
        let mut targets = vec![SloTarget {
            metric: SloMetric::Ttft,
            percentile: Some(95.0),
            threshold_ms: self.slo_ttft_p95,
        }];
        if let Some(t) = self.slo_tpot_p50 {
            targets.push(SloTarget {
                metric: SloMetric::Tpot,
                percentile: Some(50.0),
                threshold_ms: t,
            });
        }
        SloSpec { targets }
    }

    /// Check flag values that clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.max_num_seqs.is_empty() && self.max_num_seqs.iter().all(|&n| n > 0),
            "--max-num-seqs needs one or more values, each at least 1"
        );
        anyhow::ensure!(
            self.max_num_batched_tokens.iter().all(|&n| n > 0),
            "--max-num-batched-tokens values must be at least 1"
        );
        anyhow::ensure!(
            self.max_prefill_chunk.iter().all(|&n| n > 0),
            "--max-prefill-chunk values must be at least 1"
        );
        if self.paired {
            let (a, b) = (
                self.max_num_batched_tokens.len(),
                self.max_prefill_chunk.len(),
            );
            anyhow::ensure!(
                a <= 1 || b <= 1 || a == b,
                "--paired needs --max-num-batched-tokens and --max-prefill-chunk lists of the same length (or one value)"
            );
        }
        anyhow::ensure!(
            self.max_minutes.is_finite() && self.max_minutes > 0.0,
            "--max-minutes must be positive"
        );
        if let Some(c) = self.machine_cost_per_hour {
            anyhow::ensure!(
                c.is_finite() && c >= 0.0,
                "--machine-cost-per-hour must be a non-negative number"
            );
        }
        let w = &self.workload;
        w.spec.validate()?;
        anyhow::ensure!(
            w.num_requests != Some(0),
            "--num-requests must be at least 1"
        );
        anyhow::ensure!(w.timeout > 0.0, "--timeout must be positive");
        Ok(())
    }
}
