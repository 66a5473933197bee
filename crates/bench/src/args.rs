//! `BenchArgs`: every `sloserve bench` flag, as a `clap::Args` that `sloserve` (and `tune`) embed.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::dataset::{DatasetSpec, LenDist};
use crate::load::LoadSpec;
use crate::slo::SloSpec;
use crate::sweep::{Sweep, SweepVar};
use crate::workload::ClassMix;

/// Which OpenAI-compatible endpoint to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/completions` with `prompt`.
    Completions,
    /// `POST /v1/chat/completions` with `messages`.
    Chat,
}

/// Benchmark an OpenAI-compatible server: TTFT, TPOT, ITL, E2E latency,
/// throughput and goodput under closed- or open-loop load.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct BenchArgs {
    /// Server base URL (`/v1/...` is appended; a trailing `/v1` is accepted).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Endpoint: completions (`/v1/completions`) or chat (`/v1/chat/completions`).
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
    /// Model name to send; by default the first model `GET /v1/models` lists.
    #[arg(long)]
    pub model: Option<String>,
    /// API key, sent as `Authorization: Bearer KEY` (never written to results).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    #[serde(skip)]
    pub api_key: Option<String>,

    /// Closed loop: keep N requests in flight.
    #[arg(long, conflicts_with = "request_rate")]
    pub concurrency: Option<usize>,
    /// Open loop: send R requests/s (`inf` = all at once), Poisson arrivals
    /// unless `--burstiness` says otherwise. Default when neither this nor
    /// `--concurrency` is given: `inf`.
    #[arg(long)]
    #[serde(default, with = "crate::sweep::opt_rate_serde")]
    pub request_rate: Option<f64>,
    /// Gamma shape of open-loop inter-arrival times: 1 = Poisson, <1 burstier, >1 more regular.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Cap on in-flight requests in open-loop mode.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Requests per load point (default 100, or unbounded with `--duration`).
    #[arg(long)]
    pub num_requests: Option<usize>,
    /// Stop sending new requests after this long per point (`90`, `90s`, `2m`).
    #[arg(long, value_parser = parse_duration_s)]
    pub duration: Option<f64>,
    /// Requests sent (and discarded) before each point's measured run.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Sweep a load variable, one report per point: `concurrency=1,2,4,8` or `rate=1,2,inf`.
    #[arg(long)]
    pub sweep: Option<Sweep>,

    /// Dataset: `synthetic`, `sharegpt:FILE`, `prefix`, or `jsonl:FILE`
    /// (one `{"prompt"|"messages", "output_len"?, "slo_class"?}` per line).
    #[arg(long, default_value = "synthetic")]
    pub dataset: DatasetSpec,
    /// Prompt length in tokens (words ≈ tokens) for synthetic; the unique
    /// question's length for `prefix`.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Draw prompt lengths instead: `uniform:LO-HI`.
    #[arg(long)]
    pub input_len_dist: Option<LenDist>,
    /// Output tokens (`max_tokens`); default 128, or the dataset's own lengths.
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Draw output lengths instead: `uniform:LO-HI`.
    #[arg(long)]
    pub output_len_dist: Option<LenDist>,
    /// `prefix` dataset: tokens in the shared system prompt.
    #[arg(long, default_value_t = 256)]
    pub prefix_len: usize,
    /// `prefix` dataset: number of distinct shared prefixes.
    #[arg(long, default_value_t = 1)]
    pub num_prefixes: usize,
    /// Send `ignore_eos` so outputs have exactly `max_tokens` tokens
    /// (default: true for synthetic and prefix, false otherwise).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ignore_eos: Option<bool>,
    /// SLO-class mix, e.g. `interactive=0.7,batch=0.3` (or one class name):
    /// sent as `slo_class` in the body and the `X-SLO-Class` header.
    #[arg(long)]
    pub slo_class: Option<ClassMix>,
    /// SLO targets, e.g. `ttft_p95=500ms,tpot_p50=66ms` or `ttft=500ms,e2el=5s`.
    #[arg(long)]
    pub slo: Option<SloSpec>,
    /// Seed for prompts, lengths, classes and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-request timeout (seconds).
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,

    /// Write results.json, report.md and plots (PNG + SVG) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress bar, progress lines or console table.
    #[arg(long)]
    pub quiet: bool,
}

impl BenchArgs {
    /// `ignore_eos` as sent: the flag, else true for synthetic/prefix.
    pub fn ignore_eos(&self) -> bool {
        self.ignore_eos.unwrap_or(matches!(
            self.dataset,
            DatasetSpec::Synthetic | DatasetSpec::Prefix
        ))
    }

    /// The load points to run: one per sweep value, or the single configured load.
    pub fn load_points(&self) -> Vec<LoadSpec> {
        let open = |rate: f64| LoadSpec::Open {
            rate,
            burstiness: self.burstiness,
            max_concurrency: self.max_concurrency,
        };
        match &self.sweep {
            Some(Sweep {
                var: SweepVar::Concurrency,
                values,
            }) => values
                .iter()
                .map(|&c| LoadSpec::Closed {
                    concurrency: c.max(1.0) as usize,
                })
                .collect(),
            Some(Sweep {
                var: SweepVar::Rate,
                values,
            }) => values.iter().map(|&r| open(r)).collect(),
            None => match (self.concurrency, self.request_rate) {
                (Some(c), _) => vec![LoadSpec::Closed { concurrency: c }],
                (None, Some(r)) => vec![open(r)],
                (None, None) => vec![open(f64::INFINITY)],
            },
        }
    }

    /// Requests per point: `--num-requests`, else 100 (unbounded when `--duration` is set).
    pub fn requests_per_point(&self) -> Option<usize> {
        match (self.num_requests, self.duration) {
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(100),
        }
    }

    /// Check flag combinations that clap cannot express.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.concurrency != Some(0),
            "--concurrency must be at least 1"
        );
        anyhow::ensure!(
            self.num_requests != Some(0),
            "--num-requests must be at least 1"
        );
        anyhow::ensure!(
            self.burstiness > 0.0 && self.burstiness.is_finite(),
            "--burstiness must be positive"
        );
        if let Some(r) = self.request_rate {
            anyhow::ensure!(r > 0.0, "--request-rate must be positive (or inf)");
        }
        if let Some(s) = &self.sweep {
            anyhow::ensure!(
                !(s.var == SweepVar::Concurrency && self.request_rate.is_some()),
                "--sweep concurrency=... is closed-loop: drop --request-rate"
            );
            anyhow::ensure!(
                !(s.var == SweepVar::Rate && self.concurrency.is_some()),
                "--sweep rate=... is open-loop: use --max-concurrency instead of --concurrency"
            );
        }
        anyhow::ensure!(self.timeout > 0.0, "--timeout must be positive");
        Ok(())
    }
}

/// Parse `90`, `90s`, `1500ms`, `2m`, `1h` into seconds.
pub fn parse_duration_s(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v * scale),
        _ => Err(format!("bad duration {s:?} (want e.g. 90s, 2m)")),
    }
}
