//! `sloserve batch run`: a batch file through an in-process [`Dispatch`] (vLLM's
//! `run-batch`): the same line formats as the Batch API, results written in input
//! order as they finish, resumable from a partial output file.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use futures_util::stream::{FuturesOrdered, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;

use crate::line::{run_line, Dispatch, Outcome};
use crate::owner::Owner;
use crate::reader::read_lines;
use crate::types::OutputLine;
use crate::validate::{parse_line, validate_file, ParsedLine};

/// Where an offline run reads and writes.
#[derive(Debug, Clone)]
pub struct OfflineRun {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Error lines go here; without it they go to `output` (as vLLM's run-batch).
    pub errors: Option<PathBuf>,
    pub concurrency: usize,
    pub max_lines: u64,
    /// Longest input line (the server's `--max-body-bytes`).
    pub max_line_bytes: usize,
    pub progress: bool,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OfflineSummary {
    pub skipped: u64,
    pub completed: u64,
    pub failed: u64,
    pub output_tokens: u64,
    pub secs: f64,
}

/// The `custom_id`s already in `path`, after cutting off a torn last line.
fn done_ids(path: &Path, into: &mut HashSet<String>) -> anyhow::Result<()> {
    let Ok(mut f) = OpenOptions::new().read(true).write(true).open(path) else {
        return Ok(());
    };
    let mut good = 0u64;
    let mut reader = BufReader::new(&mut f);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = reader
            .read_line(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        match serde_json::from_str::<OutputLine>(buf.trim_end()) {
            Ok(l) if buf.ends_with('\n') => {
                into.insert(l.custom_id);
                good += n as u64;
            }
            _ => break,
        }
    }
    drop(reader);
    if good < f.metadata()?.len() {
        eprintln!(
            "{}: dropping a partial last line left by an interrupted run",
            path.display()
        );
        f.set_len(good)?;
    }
    f.seek(SeekFrom::End(0))?;
    Ok(())
}

fn append(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {} for writing", path.display()))
}

/// Runs every line of `run.input` whose `custom_id` is not yet in the outputs.
pub async fn run(run: &OfflineRun, dispatch: Arc<dyn Dispatch>) -> anyhow::Result<OfflineSummary> {
    let input = run.input.clone();
    let (max, max_bytes) = (run.max_lines, run.max_line_bytes);
    let summary =
        tokio::task::spawn_blocking(move || validate_file(&input, None, max, max_bytes)).await?;
    let total = match summary {
        Ok(s) => s.total,
        Err(errors) => {
            for e in &errors {
                eprintln!("{}: {}", run.input.display(), e.message);
            }
            bail!(
                "{}: {} problem(s); nothing was run",
                run.input.display(),
                errors.len()
            );
        }
    };
    let mut done = HashSet::new();
    done_ids(&run.output, &mut done)?;
    if let Some(e) = &run.errors {
        done_ids(e, &mut done)?;
    }
    let mut out = append(&run.output)?;
    let mut err = run.errors.as_deref().map(append).transpose()?;
    let bar = if run.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} lines ({eta} left) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut s = OfflineSummary {
        skipped: done.len() as u64,
        ..Default::default()
    };
    bar.set_position(s.skipped);
    let t0 = Instant::now();
    let permits = Arc::new(Semaphore::new(run.concurrency.max(1)));
    let mut pending = FuturesOrdered::new();
    let mut lines = read_lines(&run.input, max_bytes)?;
    let window = 2 * run.concurrency.max(1);
    loop {
        while pending.len() < window {
            let Some(item) = lines.next() else { break };
            let (n, text) = item?;
            let p: ParsedLine =
                parse_line(n, &text, None).map_err(|e| anyhow::anyhow!(e.message))?;
            if done.contains(&p.custom_id) {
                continue;
            }
            let (d, permits) = (dispatch.clone(), permits.clone());
            pending.push_back(async move {
                let _permit = permits.acquire().await.expect("open");
                loop {
                    // The operator's own file: lines run with no key.
                    match run_line(d.as_ref(), &Owner::NONE, &p).await {
                        Outcome::Done(o, u) => return Ok((*o, u)),
                        Outcome::Later(wait) => tokio::time::sleep(wait).await,
                        Outcome::Stopped => {
                            bail!("line {}: the engine is unavailable (503)", p.line)
                        }
                    }
                }
            });
        }
        let Some(r) = pending.next().await else { break };
        let (line, usage) = r?;
        let ok = line.is_success();
        let f = if ok {
            &mut out
        } else {
            err.as_mut().unwrap_or(&mut out)
        };
        let mut text = serde_json::to_string(&line)?;
        text.push('\n');
        f.write_all(text.as_bytes())?;
        if ok {
            s.completed += 1
        } else {
            s.failed += 1
        }
        s.output_tokens += usage.output_tokens;
        bar.inc(1);
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{:.1} tok/s, {} failed",
            s.output_tokens as f64 / secs,
            s.failed
        ));
    }
    out.flush()?;
    if let Some(e) = err.as_mut() {
        e.flush()?;
    }
    s.secs = t0.elapsed().as_secs_f64();
    bar.finish_with_message(format!(
        "{} done, {} failed, {} skipped",
        s.completed, s.failed, s.skipped
    ));
    Ok(s)
}
