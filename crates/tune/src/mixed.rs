//! The mixed recommendation: one replica for both classes, built from the tune's
//! interactive and batch picks (not measured as one configuration).
//!
//! Rule: the `mixed` profile (plus the tune's `--config`), with
//! * `max_num_seqs` and `max_num_batched_tokens` of the **batch** pick: batch rows
//!   may fill a step up to the batch size that gave the most tokens per second;
//! * the interactive class's default targets from the **SLO** the tune applied:
//!   TTFT = its TTFT P95 target, TPOT = its TPOT P50 target when one was given,
//!   else the profile's reading-speed default (50 ms). The scheduler then sizes
//!   each step so that its interactive rows keep those targets and gives batch
//!   rows what is left.
//!
//! The interactive pick's batch size does not appear: in a mixed replica the
//! targets, not a batch cap, protect interactive requests.

use std::path::Path;

use sloserve_engine::EngineConfig;

use crate::report::TuneReport;

/// The `mixed` profile's engine configuration for this report, or `None` when
/// the tune made no batch recommendation.
pub fn mixed_config(report: &TuneReport) -> anyhow::Result<Option<EngineConfig>> {
    let Some(batch) = &report.batch else {
        return Ok(None);
    };
    let slo = report.slo;
    let cfg = EngineConfig::load(
        "mixed",
        report.args.config.as_deref(),
        Default::default(),
        |c| {
            c.max_num_seqs = batch.knobs.max_num_seqs;
            c.max_num_batched_tokens = batch.knobs.max_num_batched_tokens.max(c.max_num_seqs);
            c.default_ttft_slo_ms = Some(slo.ttft_p95_ms);
            if let Some(t) = slo.tpot_p50_ms {
                c.default_tpot_slo_ms = Some(t);
            }
        },
    )?;
    Ok(Some(cfg))
}

/// `mixed.toml`'s text: a header saying where each value came from, then the configuration.
pub fn mixed_file_text(report: &TuneReport, cfg: &EngineConfig, path: &Path) -> String {
    let batch = format!(
        "max_num_seqs={}, budget {}",
        cfg.max_num_seqs, cfg.max_num_batched_tokens
    );
    let tpot = cfg
        .default_tpot_slo_ms
        .map_or("none".to_string(), |t| format!("{t} ms"));
    let ttft = cfg
        .default_ttft_slo_ms
        .map_or("none".to_string(), |t| format!("{t} ms"));
    format!(
        "# sloserve tune: mixed recommendation (both classes on one replica), NOT measured as one\n\
         # configuration: the `mixed` profile with the batch pick's size ({batch}) and the\n\
         # interactive class's default targets TTFT {ttft} (the SLO's P95), TPOT {tpot}.\n\
         # Batch rows fill each step up to what those targets leave. Measure it with\n\
         # scripts/bench_slo_steps.py before relying on it.\n\
         # serve: {}\n\
         # model: {} (precision {})\n\n{}",
        report.serve_command(path),
        report.model,
        report.args.precision,
        cfg.to_toml_string()
    )
}
