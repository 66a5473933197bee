//! One batch from `validating` to a terminal status: validate the input file,
//! feed its unfinished lines to the endpoint (bounded by the service's shared
//! in-flight permits), commit each result as it finishes, and finalize the output
//! and error files in input order. Resumable at every point: a restart runs the
//! same function on the same batch and skips the lines that have results.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use crate::error::Result;
use crate::line::{run_line, unrun, Outcome};
use crate::owner::Owner;
use crate::reader::read_lines;
use crate::service::BatchService;
use crate::store::LineUsage;
use crate::types::{BatchErrors, BatchStatus};
use crate::unix_now;
use crate::validate::{parse_line, validate_file, ParsedLine};

/// Asks a running job to stop feeding lines (cancel).
#[derive(Default)]
pub struct JobControl {
    cancelled: AtomicBool,
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
}

/// Why feeding stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    AllFed,
    Cancelled,
    Expired,
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
    finalize(svc, id, &owner, &input, &batch.endpoint, end).await
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
        let (svc2, id2, owner2) = (svc.clone(), id.to_string(), owner.clone());
        tasks.spawn(async move {
            let _permit = permit;
            one_line(&svc2, &id2, &owner2, line).await
        });
        while tasks.try_join_next().is_some() {}
    }
    // On cancel and expiry the running lines are stopped (their engine requests
    // cancelled as their futures drop): each either committed its result or is
    // written as not run. Otherwise they finish.
    if matches!(end, End::Cancelled | End::Expired) {
        tasks.abort_all();
    }
    while tasks.join_next().await.is_some() {}
    if svc.is_stopping() {
        return Ok(End::Stopping);
    }
    Ok(end)
}

/// Runs one line until it has a final answer; true if the server is stopping.
async fn one_line(svc: &BatchService, id: &str, owner: &Owner, line: ParsedLine) -> bool {
    loop {
        match run_line(svc.dispatch(), owner, &line).await {
            Outcome::Done(out, usage) => {
                let ok = out.is_success();
                match svc.store().commit_result(id, line.line, &out, usage) {
                    Ok(true) => svc.line_done(id, ok, &usage),
                    Ok(false) => {}
                    Err(e) => {
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

/// Lines left unrun get an error line; then the output and error files are written.
async fn finalize(
    svc: &Arc<BatchService>,
    id: &str,
    owner: &Owner,
    input: &std::path::Path,
    endpoint: &str,
    end: End,
) -> Result<()> {
    let now = unix_now();
    svc.store().update_batch(id, |b| {
        if end == End::Cancelled && b.cancelling_at.is_none() {
            b.cancelling_at = Some(now);
        }
        b.status = BatchStatus::Finalizing;
        b.finalizing_at.get_or_insert(now);
    })?;
    if end != End::AllFed {
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
                if svc.store().commit_result(
                    id,
                    n,
                    &unrun(&p.custom_id, code, msg),
                    LineUsage::default(),
                )? {
                    svc.line_done(id, false, &LineUsage::default());
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
