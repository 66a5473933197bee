//! sloserve tune: run the engine itself at a sequence of configurations
//! (`max_num_seqs` 4, 8, 16, … and optionally token budgets and prefill chunk
//! sizes) under a `sloserve bench` workload, then recommend
//!
//! * an **interactive** configuration: the largest batch whose TTFT P95 (and
//!   TPOT P50, if given) meets the SLO, backed off one step, and
//! * a **batch** configuration: the most output tokens per second (the lowest
//!   cost per million output tokens),
//!
//! written as `interactive.toml` / `batch.toml` for `sloserve serve --config`,
//! and from the two a `mixed.toml` (both classes on one replica, see [`mixed`]),
//! with `tune.json`, `report.md` and plots. The procedure itself is pure
//! functions in [`procedure`]; [`run`] measures (each point: load the model,
//! start the server in-process on a free loopback port, run the bench
//! workload with warmup, shut down); [`report`] writes the outputs.
//!
//! Entry points: [`TuneArgs`] (a `clap::Args`) and [`run_tune`] (async;
//! [`run_tune_blocking`] builds its own Tokio runtime for a synchronous `main`).

pub mod args;
pub mod charts;
pub mod mixed;
pub mod outputs;
pub mod procedure;
pub mod progress;
pub mod report;
pub mod run;

pub use args::{TuneArgs, WorkloadArgs};
pub use procedure::{Knobs, PointMetrics, Recommendation, SloTargets, Verdict};
pub use report::{NotMeasured, TunePoint, TuneReport};
pub use run::{run_tune, run_tune_blocking};
