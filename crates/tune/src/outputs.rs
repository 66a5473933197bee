//! The tune run's files in `--out`: `tune.json`, `interactive.toml`, `batch.toml`,
//! `mixed.toml`, the plots of `charts.rs` (PNG + SVG, drawn by the bench crate's
//! chart code) and `report.md`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sloserve_bench::report::files::{write_charts, write_json};

use crate::report::{config_file_text, render_markdown, TuneReport};
use crate::{charts, mixed};

/// Write `tune.json`, `interactive.toml`, `batch.toml`, `mixed.toml`, the plots and
/// `report.md` into `dir`. Returns the files written.
pub fn write_outputs(report: &TuneReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let json = dir.join("tune.json");
    write_json(&json, report)?;
    written.push(json);
    for (kind, rec) in [
        ("interactive", &report.interactive),
        ("batch", &report.batch),
    ] {
        let path = dir.join(format!("{kind}.toml"));
        match rec {
            Some(r) => {
                std::fs::write(&path, config_file_text(report, kind, r, &path))
                    .with_context(|| format!("writing {}", path.display()))?;
                written.push(path);
            }
            None => {
                // A stale recommendation from an earlier run must not survive.
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let mixed = dir.join("mixed.toml");
    match mixed::mixed_config(report)? {
        Some(cfg) => {
            std::fs::write(&mixed, mixed::mixed_file_text(report, &cfg, &mixed))
                .with_context(|| format!("writing {}", mixed.display()))?;
            written.push(mixed);
        }
        None => {
            let _ = std::fs::remove_file(&mixed);
        }
    }
    let charts = write_charts(dir, charts::charts(report))?;
    written.extend(charts.files);
    let md = dir.join("report.md");
    std::fs::write(&md, render_markdown(report, dir, &charts.stems))?;
    written.push(md);
    Ok(written)
}
