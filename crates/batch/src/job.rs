//! One batch from `validating` to a terminal status: validate the input file,
//! feed its unfinished lines to the endpoint (bounded by the service's shared
//! in-flight permits), commit each result as it finishes, and finalize the output
//! and error files in input order. Resumable at every point: a restart runs the
//! same function on the same batch and skips the lines that have results. Each
//! result counts against the owner's file quota as it is written: one that would
//! pass it is not recorded, and the batch stops, `failed` with `quota_exceeded`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use crate::error::Result;
use crate::line::{run_line, unrun, Outcome};
use crate::owner::Owner;
use crate::reader::read_lines;
use crate::service::BatchService;
use crate::store::LineUsage;
use crate::types::{BatchError, BatchErrors, BatchObject, BatchStatus};
use crate::unix_now;
use crate::validate::{parse_line, validate_file, ParsedLine};

/// Asks a running job to stop feeding lines (cancel, or its owner's quota
/// reached); the result bytes it holds against the quota.
#[derive(Default)]
pub struct JobControl {
    cancelled: AtomicBool,
    over_quota: AtomicBool,
    /// Result bytes counted against the owner's quota, not yet in a file.
    held: AtomicU64,
    wake: Notify,
}

impl JobControl {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.wake.notify_waiters();
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn stop_over_quota(&self) {
        self.over_quota.store(true, Ordering::Release);
        self.wake.notify_waiters();
    }

    fn is_over_quota(&self) -> bool {
        self.over_quota.load(Ordering::Acquire)
    }
}

/// The code of a batch stopped by its owner's quota.
const QUOTA_CODE: &str = "quota_exceeded";

/// Whether `b` was stopped by its owner's quota (known on resume from its errors).
fn stopped_by_quota(b: &BatchObject) -> bool {
    b.errors
        .as_ref()
        .is_some_and(|e| e.data.iter().any(|e| e.code == QUOTA_CODE))
}

/// Why feeding stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    AllFed,
    Cancelled,
    Expired,
    OverQuota,
    Stopping,
}

/// Runs batch `id` to the end (or until the service stops).
pub async fn run(svc: Arc<BatchService>, id: String, ctl: Arc<JobControl>) {
    if let Err(e) = drive(&svc, &id, &ctl).await {
        tracing::error!(batch = %id, error = %e, "batch job failed; it resumes at the next start");
    }
    svc.job_ended(&id);
}

async fn drive(svc: &Arc<BatchService>, id: &str, ctl: &Arc<JobControl>) -> Result<()> {
    // Every line runs as the batch's owner (its key's cache scope and class ceiling).
    let Some((mut batch, owner)) = svc.store().batch(id)? else {
        return Ok(());
    };
    let input = svc.store().file_path(&batch.input_file_id);
    if batch.status == BatchStatus::Validating {
        let (path, endpoint, max, max_bytes) = (
            input.clone(),
            batch.endpoint.clone(),
            svc.config().max_lines,
            svc.config().max_line_bytes,
        );
        let checked = tokio::task::spawn_blocking(move || {
            validate_file(&path, Some(&endpoint), max, max_bytes)
        })
        .await
        .unwrap_or_else(|e| {
            Err(vec![crate::types::BatchError {
                code: "internal_error".into(),
                message: format!("validation failed: {e}"),
                param: None,
                line: None,
            }])
        });
        batch = svc.store().update_batch(id, |b| match checked {
            Ok(s) => {
                b.status = BatchStatus::InProgress;
                b.in_progress_at = Some(unix_now());
                b.request_counts.total = s.total;
                b.model = s.model;
            }
            Err(errors) => {
                b.status = BatchStatus::Failed;
                b.failed_at = Some(unix_now());
                b.errors = Some(BatchErrors {
                    object: "list".into(),
                    data: errors,
                });
            }
        })?;
        if batch.status == BatchStatus::Failed {
            tracing::info!(batch = %id, "batch failed validation");
            return Ok(());
        }
        tracing::info!(batch = %id, lines = batch.request_counts.total, "batch in progress");
    }
    let mut end = match batch.status {
        BatchStatus::InProgress => {
            let ends = (batch.expires_at, ctl);
            feed(svc, id, &owner, &batch.endpoint, &input, ends).await?
        }
        BatchStatus::Cancelling => End::Cancelled,
        BatchStatus::Finalizing if stopped_by_quota(&batch) => End::OverQuota,
        BatchStatus::Finalizing => End::AllFed,
        _ => return Ok(()),
    };
    if end == End::Stopping {
        return Ok(());
    }
    // A cancel that came after the last line was handed out (or before a crash
    // during finalizing) still counts.
    let cancelled = ctl.is_cancelled()
        || svc
            .store()
            .batch(id)?
            .is_some_and(|(b, _)| b.cancelling_at.is_some());
    if end == End::AllFed && cancelled {
        end = End::Cancelled;
    }
    let r = finalize(svc, id, &owner, &input, &batch.endpoint, end, ctl).await;
    svc.release(&owner, ctl.held.swap(0, Ordering::AcqRel));
    r
}

/// Feeds every line without a result; returns when all have results or feeding stops.
async fn feed(
    svc: &Arc<BatchService>,
    id: &str,
    owner: &Owner,
    endpoint: &str,
    input: &std::path::Path,
    (expires_at, ctl): (Option<u64>, &Arc<JobControl>),
) -> Result<End> {
    let done = svc.store().done_lines(id)?;
    // Results written before a restart hold their bytes still.
    let written = svc.store().result_bytes(id)?;
    svc.hold(owner, written, true)?;
    ctl.held.fetch_add(written, Ordering::AcqRel);
    svc.job_started(id);
    // Lines are read on a blocking thread and handed over through a small channel.
    let (tx, mut rx) = mpsc::channel::<ParsedLine>(64);
    let (path, ep) = (input.to_path_buf(), endpoint.to_string());
    let max_bytes = svc.config().max_line_bytes;
    std::thread::spawn(move || {
        let Ok(lines) = read_lines(&path, max_bytes) else {
            return;
        };
        for (n, text) in lines.flatten() {
            if done.contains(&n) {
                continue;
            }
            // Validated when the batch started: a line that no longer parses is skipped.
            if let Ok(p) = parse_line(n, &text, Some(&ep)) {
                if tx.blocking_send(p).is_err() {
                    return;
                }
            }
        }
    });
    let expiry = expires_at.map(|t| Duration::from_secs(t.saturating_sub(unix_now())));
    let deadline = tokio::time::sleep(expiry.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline);
    let mut tasks = tokio::task::JoinSet::new();
    let mut end = End::AllFed;
    loop {
        if ctl.is_cancelled() {
            end = End::Cancelled;
            break;
        }
        if ctl.is_over_quota() {
            end = End::OverQuota;
            break;
        }
        if svc.is_stopping() {
            end = End::Stopping;
            break;
        }
        let permit = tokio::select! {
            p = svc.permits().acquire_owned() => p.expect("permits never close"),
            _ = ctl.wake.notified() => continue,
            _ = svc.stopping_notified() => continue,
            _ = &mut deadline => { end = End::Expired; break; }
        };
        let Some(line) = rx.recv().await else { break };
        let (svc2, id2, owner2, ctl2) = (svc.clone(), id.to_string(), owner.clone(), ctl.clone());
        tasks.spawn(async move {
            let _permit = permit;
            one_line(&svc2, &id2, &owner2, &ctl2, line).await
        });
        while tasks.try_join_next().is_some() {}
    }
    // On cancel, expiry and quota the running lines are stopped (their engine
    // requests cancelled as their futures drop): each either committed its result
    // or is written as not run (not at all past the quota). Otherwise they finish.
    if matches!(end, End::Cancelled | End::Expired | End::OverQuota) {
        tasks.abort_all();
    }
    while tasks.join_next().await.is_some() {
        // A result that passes the quota after the last line was handed out stops
        // the batch too (it used to end `completed`, its unrun lines in no file).
        if end == End::AllFed && ctl.is_over_quota() {
            end = End::OverQuota;
            tasks.abort_all();
        }
    }
    if svc.is_stopping() {
        return Ok(End::Stopping);
    }
    Ok(end)
}

/// Runs one line until it has a final answer; true if the server is stopping.
async fn one_line(
    svc: &BatchService,
    id: &str,
    owner: &Owner,
    ctl: &JobControl,
    line: ParsedLine,
) -> bool {
    loop {
        match run_line(svc.dispatch(), owner, &line).await {
            Outcome::Done(out, usage) => {
                let ok = out.is_success();
                if !hold(svc, id, owner, ctl, &out) {
                    return false;
                }
                match svc.store().commit_result(id, line.line, &out, usage) {
                    Ok(true) => svc.line_done(id, ok, &usage),
                    Ok(false) => unhold(svc, owner, ctl, &out),
                    Err(e) => {
                        unhold(svc, owner, ctl, &out);
                        tracing::error!(batch = %id, line = line.line, error = %e, "cannot record a result")
                    }
                }
                return false;
            }
            Outcome::Later(d) => tokio::time::sleep(d).await,
            // Unavailable: draining (the service is told to stop) or the engine restarting.
            Outcome::Stopped => tokio::time::sleep(Duration::from_secs(1)).await,
        }
        if svc.is_stopping() {
            return true;
        }
    }
}

/// The bytes `out` takes in an output or error file.
fn file_bytes(out: &crate::types::OutputLine) -> u64 {
    serde_json::to_vec(out).map_or(0, |v| v.len() as u64 + 1)
}

/// Counts `out` against the owner's quota before it is recorded; false (and the
/// job told to stop) when it would pass the quota.
fn hold(
    svc: &BatchService,
    id: &str,
    owner: &Owner,
    ctl: &JobControl,
    out: &crate::types::OutputLine,
) -> bool {
    let bytes = file_bytes(out);
    match svc.hold(owner, bytes, false) {
        Ok(true) => {
            ctl.held.fetch_add(bytes, Ordering::AcqRel);
            true
        }
        Ok(false) => {
            if !ctl.is_over_quota() {
                tracing::warn!(batch = %id, "the owner's file quota is reached; the batch stops");
            }
            ctl.stop_over_quota();
            false
        }
        Err(e) => {
            // The store failed: recording the result will fail (and say so) too.
            tracing::error!(batch = %id, error = %e, "cannot read the owner's held bytes");
            true
        }
    }
}

/// Gives back what [`hold`] counted for a result that was not recorded.
fn unhold(svc: &BatchService, owner: &Owner, ctl: &JobControl, out: &crate::types::OutputLine) {
    let bytes = file_bytes(out);
    svc.release(owner, bytes);
    ctl.held.fetch_sub(
        bytes.min(ctl.held.load(Ordering::Acquire)),
        Ordering::AcqRel,
    );
}

/// Lines left unrun get an error line (as far as the owner's quota allows; none
/// past it); then the output and error files are written.
async fn finalize(
    svc: &Arc<BatchService>,
    id: &str,
    owner: &Owner,
    input: &std::path::Path,
    endpoint: &str,
    end: End,
    ctl: &JobControl,
) -> Result<()> {
    let now = unix_now();
    let quota = svc.config().quota_bytes_per_owner.unwrap_or(0);
    svc.store().update_batch(id, |b| {
        if end == End::Cancelled && b.cancelling_at.is_none() {
            b.cancelling_at = Some(now);
        }
        if end == End::OverQuota && !stopped_by_quota(b) {
            b.errors = Some(BatchErrors {
                object: "list".into(),
                data: vec![BatchError {
                    code: QUOTA_CODE.into(),
                    message: format!(
                        "the batch stopped: its output and error lines would take this API key's \
                         files over its quota of {quota} bytes (--batch-quota-bytes-per-key); \
                         the lines that finished are in its output and error files, the rest did \
                         not run"
                    ),
                    param: None,
                    line: None,
                }],
            });
        }
        b.status = BatchStatus::Finalizing;
        b.finalizing_at.get_or_insert(now);
    })?;
    if matches!(end, End::Cancelled | End::Expired) {
        let (code, msg) = match end {
            End::Expired => (
                "batch_expired",
                "This line was not executed because the batch expired.",
            ),
            _ => (
                "batch_cancelled",
                "This line was not executed because the batch was cancelled.",
            ),
        };
        let done = svc.store().done_lines(id)?;
        for (n, text) in read_lines(input, svc.config().max_line_bytes)?.flatten() {
            if done.contains(&n) {
                continue;
            }
            if let Ok(p) = parse_line(n, &text, Some(endpoint)) {
                let out = unrun(&p.custom_id, code, msg);
                if !hold(svc, id, owner, ctl, &out) {
                    break;
                }
                if svc
                    .store()
                    .commit_result(id, n, &out, LineUsage::default())?
                {
                    svc.line_done(id, false, &LineUsage::default());
                } else {
                    unhold(svc, owner, ctl, &out);
                }
            }
        }
    }
    let (output, errors) = svc.write_outputs(id, owner)?;
    let b = svc.store().update_batch(id, |b| {
        b.output_file_id = output;
        b.error_file_id = errors;
        let now = unix_now();
        b.status = match end {
            End::Cancelled => {
                b.cancelled_at = Some(now);
                BatchStatus::Cancelled
            }
            End::Expired => {
                b.expired_at = Some(now);
                BatchStatus::Expired
            }
            End::OverQuota => {
                b.failed_at = Some(now);
                BatchStatus::Failed
            }
            _ => {
                b.completed_at = Some(now);
                BatchStatus::Completed
            }
        };
    })?;
    tracing::info!(batch = %id, status = b.status.as_str(), completed = b.request_counts.completed,
        failed = b.request_counts.failed, output_tokens = b.usage.output_tokens, "batch finished");
    Ok(())
}
