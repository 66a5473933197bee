//! The Batch API's flags (`--data-dir`, `--no-batch-api`, sizes, quota,
//! retention, cost), beside the server's other flag groups.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// Flags of the Batch API (`/v1/files`, `/v1/batches`).
#[derive(Args, Debug, Clone)]
pub struct BatchApiArgs {
    /// Where batch files and jobs are kept (SQLite + files); created if absent.
    #[arg(long, default_value = "sloserve-data")]
    pub data_dir: PathBuf,
    /// Serve no Batch API (no /v1/files, /v1/batches; nothing written to --data-dir).
    #[arg(long)]
    pub no_batch_api: bool,
    /// Largest batch input file in bytes (suffixes KiB, MiB, GiB accepted).
    #[arg(long, default_value = "200MiB", value_parser = sloserve_engine::knobs::parse_bytes)]
    pub max_batch_file_bytes: u64,
    /// Bytes of Batch API files one API key may hold, its uploads and its
    /// batches' output files together (suffixes accepted; default: no quota).
    /// An upload past it is refused with 413 `quota_exceeded`.
    #[arg(long, value_parser = sloserve_engine::knobs::parse_bytes)]
    pub batch_quota_bytes_per_key: Option<u64>,
    /// Most requests in one batch input file.
    #[arg(long, default_value_t = 50_000)]
    pub max_batch_lines: u64,
    /// Batch lines in flight at once, over all batches (default: max_num_seqs,
    /// at most half the batch class's waiting-queue bound).
    #[arg(long)]
    pub batch_max_inflight: Option<usize>,
    /// Delete ended batches and unused files older than this (e.g. 30d, 12h, 90m, 3600s).
    #[arg(long, value_parser = parse_duration)]
    pub batch_retention: Option<Duration>,
    /// Price of the machine per hour: batch objects report cost per million output tokens.
    #[arg(long)]
    pub machine_cost_per_hour: Option<f64>,
}

/// "30d" / "12h" / "90m" / "3600s" / "3600".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((t, 1));
    num.trim()
        .parse::<u64>()
        .map(|n| Duration::from_secs(n * mult))
        .map_err(|_| format!("'{s}' is not a duration (e.g. 30d, 12h, 90m, 3600s)"))
}
