//! `BenchArgs`: every `sloserve bench` flag, as a `clap::Args` that `sloserve` (and `tune`) embed.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::load::LoadSpec;
use crate::slo::SloSpec;
use crate::spec::WorkloadSpec;
use crate::sweep::{Sweep, SweepVar};

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

    /// What is sent and how it arrives (shared with `sloserve tune`).
    #[command(flatten)]
    #[serde(flatten)]
    pub workload: WorkloadSpec,
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

    /// SLO targets, e.g. `ttft_p95=500ms,tpot_p50=66ms` or `ttft=500ms,e2el=5s`.
    #[arg(long)]
    pub slo: Option<SloSpec>,
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
    /// The load points to run: one per sweep value, or the single configured load.
    pub fn load_points(&self) -> Vec<LoadSpec> {
        let w = &self.workload;
        let open = |rate: f64| LoadSpec::Open {
            rate,
            burstiness: w.burstiness,
            max_concurrency: w.max_concurrency,
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
            None => match (w.concurrency, w.request_rate) {
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
        self.workload.validate()?;
        anyhow::ensure!(
            self.num_requests != Some(0),
            "--num-requests must be at least 1"
        );
        if let Some(s) = &self.sweep {
            anyhow::ensure!(
                !(s.var == SweepVar::Concurrency && self.workload.request_rate.is_some()),
                "--sweep concurrency=... is closed-loop: drop --request-rate"
            );
            anyhow::ensure!(
                !(s.var == SweepVar::Rate && self.workload.concurrency.is_some()),
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
