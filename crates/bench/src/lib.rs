//! sloserve bench: drive any OpenAI-compatible server with streaming requests
//! and measure the SLOs the way users feel them (TTFT, TPOT, ITL, E2E latency,
//! throughput, goodput), under closed- or open-loop load, with sweeps, reports
//! and plots.
//!
//! Entry points: [`BenchArgs`] (a `clap::Args` holding every flag) and
//! [`run_bench`] (async; [`run_bench_blocking`] for a synchronous caller),
//! which returns the [`BenchReport`] also written as `results.json`.
//! The pieces are public for `sloserve tune`: [`WorkloadSpec`] (the workload
//! flags both commands share), [`dataset`] + [`workload`] build requests, [`client`] sends one, [`load`] drives many, [`metrics`]
//! summarises (pure functions), [`report`] writes JSON, markdown and plots.

pub mod args;
pub mod client;
pub mod dataset;
pub mod load;
pub mod metrics;
pub mod progress;
pub mod record;
pub mod report;
pub mod run;
pub mod slo;
pub mod spec;
pub mod sse;
pub mod sweep;
pub mod words;
pub mod workload;

pub use args::{BenchArgs, Endpoint};
pub use load::LoadSpec;
pub use metrics::Summary;
pub use record::RequestRecord;
pub use report::{BenchReport, PointReport};
pub use run::{run_bench, run_bench_blocking};
pub use slo::SloSpec;
pub use spec::WorkloadSpec;
pub use sweep::{Sweep, SweepVar};
pub use workload::{workload, RequestSpec};
