//! `BatchService`: the store, the dispatcher, the shared in-flight permits, the
//! running jobs and their live progress; the operations behind the HTTP routes.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use crate::error::{Error, Result};
use crate::job::{self, JobControl};
use crate::line::{new_id, Dispatch};
use crate::metrics::Counters;
use crate::owner::Owner;
use crate::store::{LineUsage, Store};
use crate::types::*;
use crate::unix_now;

/// The Batch API's settings (serve flags).
#[derive(Debug, Clone)]
pub struct BatchConfig {
    pub data_dir: PathBuf,
    pub max_file_bytes: u64,
    /// Bytes of files one owner (API key) may hold (`None`: no quota).
    pub quota_bytes_per_owner: Option<u64>,
    pub max_lines: u64,
    /// Longest input line: the synchronous endpoints' `--max-body-bytes`.
    pub max_line_bytes: usize,
    /// Lines in flight across all batches.
    pub max_inflight: usize,
    /// Terminal batches and unused files older than this are deleted.
    pub retention: Option<Duration>,
    pub machine_cost_per_hour: Option<f64>,
}

/// A running job's progress since it (re)started.
struct Live {
    control: Arc<JobControl>,
    started: Instant,
    lines: u64,
    output_tokens: u64,
}

pub struct BatchService {
    cfg: BatchConfig,
    store: Store,
    dispatch: Box<dyn Dispatch>,
    permits: Arc<Semaphore>,
    jobs: Mutex<HashMap<String, Live>>,
    stopping: AtomicBool,
    stop: Notify,
    counters: Counters,
    /// Result bytes of running batches not yet in a file, per owner: they count
    /// against the owner's quota as they are written ([`BatchService::hold`]).
    pending: Mutex<HashMap<Owner, u64>>,
}

impl BatchService {
    /// Opens the store under `cfg.data_dir` (created if absent).
    pub fn open(cfg: BatchConfig, dispatch: Box<dyn Dispatch>) -> Result<Arc<BatchService>> {
        let store = Store::open(&cfg.data_dir)?;
        Ok(Arc::new(BatchService {
            permits: Arc::new(Semaphore::new(cfg.max_inflight.max(1))),
            cfg,
            store,
            dispatch,
            jobs: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            stop: Notify::new(),
            counters: Counters::default(),
            pending: Mutex::new(HashMap::new()),
        }))
    }

    /// Resumes every unfinished batch and starts the retention sweeper (in a runtime).
    pub fn start(self: &Arc<Self>) -> Result<()> {
        use BatchStatus::*;
        let ids = self
            .store
            .batches_in(&[Validating, InProgress, Finalizing, Cancelling])?;
        if !ids.is_empty() {
            tracing::info!(batches = ids.len(), "resuming unfinished batches");
        }
        for id in ids {
            self.spawn_job(id);
        }
        if let Some(keep) = self.cfg.retention {
            let svc = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    let Some(s) = svc.upgrade() else { return };
                    let cutoff = unix_now().saturating_sub(keep.as_secs());
                    match s.store.delete_older_than(cutoff) {
                        Ok((0, 0)) => {}
                        Ok((b, f)) => tracing::info!(
                            batches = b,
                            files = f,
                            "retention: deleted old batches and files"
                        ),
                        Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
                    }
                    drop(s);
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            });
        }
        Ok(())
    }

    /// Stops feeding new lines (the server is draining); lines in flight finish.
    pub fn stop_feeding(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop.notify_waiters();
    }

    /// Waits until no job is running.
    pub async fn wait_idle(&self) {
        while !self.jobs().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The running jobs (a panic while holding the lock leaves the map usable).
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(crate) async fn stopping_notified(&self) {
        self.stop.notified().await
    }

    pub fn config(&self) -> &BatchConfig {
        &self.cfg
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn dispatch(&self) -> &dyn Dispatch {
        self.dispatch.as_ref()
    }

    pub(crate) fn permits(&self) -> Arc<Semaphore> {
        self.permits.clone()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, u64>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes `owner` holds against its quota: its files and the results its
    /// running batches have written so far.
    pub fn held_bytes(&self, owner: &Owner) -> Result<u64> {
        let files = self.store.held_bytes(owner)?;
        Ok(files.saturating_add(self.pending_bytes(owner)))
    }

    /// The results `owner`'s running batches have written, not yet in a file.
    pub fn pending_bytes(&self, owner: &Owner) -> u64 {
        self.pending().get(owner).copied().unwrap_or(0)
    }

    /// Counts `bytes` of a running batch's results against `owner`'s quota;
    /// `false` (nothing counted) when they would take it over. `force`: counted
    /// whatever the quota (results already written, found on resume).
    pub(crate) fn hold(&self, owner: &Owner, bytes: u64, force: bool) -> Result<bool> {
        let mut pending = self.pending();
        let now = pending.get(owner).copied().unwrap_or(0);
        if let (Some(quota), false) = (self.cfg.quota_bytes_per_owner, force) {
            let held = self.store.held_bytes(owner)?.saturating_add(now);
            if held.saturating_add(bytes) > quota {
                return Ok(false);
            }
        }
        pending.insert(owner.clone(), now.saturating_add(bytes));
        Ok(true)
    }

    /// Stops counting `bytes` held by [`hold`](Self::hold) (they are in a file now,
    /// or were never written).
    pub(crate) fn release(&self, owner: &Owner, bytes: u64) {
        let mut pending = self.pending();
        if let Some(n) = pending.get_mut(owner) {
            *n = n.saturating_sub(bytes);
            if *n == 0 {
                pending.remove(owner);
            }
        }
    }

    fn spawn_job(self: &Arc<Self>, id: String) {
        let control = Arc::new(JobControl::default());
        self.jobs().insert(
            id.clone(),
            Live {
                control: control.clone(),
                started: Instant::now(),
                lines: 0,
                output_tokens: 0,
            },
        );
        tokio::spawn(job::run(self.clone(), id, control));
    }

    pub(crate) fn job_started(&self, id: &str) {
        if let Some(l) = self.jobs().get_mut(id) {
            l.started = Instant::now();
        }
    }

    pub(crate) fn job_ended(&self, id: &str) {
        self.jobs().remove(id);
    }

    pub(crate) fn line_done(&self, id: &str, ok: bool, u: &LineUsage) {
        self.counters.line(ok, u);
        if let Some(l) = self.jobs().get_mut(id) {
            l.lines += 1;
            l.output_tokens += u.output_tokens;
        }
    }

    /// `owner`'s batch `id` with live speed, ETA and price (another owner's: not found).
    pub fn get_batch(&self, id: &str, owner: &Owner) -> Result<BatchObject> {
        let mut b = self
            .store
            .get_batch(id, owner)?
            .ok_or_else(|| Error::NotFound {
                kind: "batch",
                id: id.into(),
            })?;
        self.decorate(&mut b);
        Ok(b)
    }

    fn decorate(&self, b: &mut BatchObject) {
        let jobs = self.jobs();
        if let Some(l) = jobs.get(&b.id) {
            let secs = l.started.elapsed().as_secs_f64();
            if secs > 0.0 && l.lines > 0 {
                b.sloserve.tokens_per_second = Some(l.output_tokens as f64 / secs);
                let c = &b.request_counts;
                let left = c.total.saturating_sub(c.completed + c.failed);
                b.sloserve.eta_seconds = Some(left as f64 * secs / l.lines as f64);
            }
        }
        if let (Some(per_hour), true) = (self.cfg.machine_cost_per_hour, b.usage.output_tokens > 0)
        {
            let cost = b.sloserve.machine_seconds / 3600.0 * per_hour;
            b.sloserve.cost_per_million_output_tokens =
                Some(cost / b.usage.output_tokens as f64 * 1e6);
        }
    }

    pub fn list_batches(
        &self,
        owner: &Owner,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListObject<BatchObject>> {
        let (mut data, more) = self.store.list_batches(owner, after, limit)?;
        data.iter_mut().for_each(|b| self.decorate(b));
        Ok(ListObject::new(data, more, |b| b.id.clone()))
    }

    /// `POST /v1/batches`: checks the request (the input file must be `owner`'s)
    /// and starts the job, owned by `owner`.
    pub fn create_batch(self: &Arc<Self>, req: CreateBatch, owner: &Owner) -> Result<BatchObject> {
        if !is_batch_url(&req.endpoint) {
            return Err(Error::invalid(
                "endpoint",
                format!(
                    "endpoint: {:?} is not supported; use {}",
                    req.endpoint,
                    batch_urls_text()
                ),
            ));
        }
        if req.completion_window != COMPLETION_WINDOW {
            return Err(Error::invalid(
                "completion_window",
                format!(
                    "completion_window: only {COMPLETION_WINDOW:?} is supported, got {:?}",
                    req.completion_window
                ),
            ));
        }
        if let Some(m) = &req.metadata {
            if m.len() > 16
                || m.iter()
                    .any(|(k, v)| k.len() > 64 || v.as_str().is_none_or(|s| s.len() > 512))
            {
                return Err(Error::invalid("metadata",
                    "metadata: at most 16 string values, keys up to 64 and values up to 512 characters"));
            }
        }
        let file = self
            .store
            .get_file(&req.input_file_id, owner)?
            .ok_or_else(|| Error::NotFound {
                kind: "file",
                id: req.input_file_id.clone(),
            })?;
        if file.purpose != "batch" {
            return Err(Error::invalid(
                "input_file_id",
                format!(
                    "input_file_id: file {} has purpose {:?}, not \"batch\"",
                    file.id, file.purpose
                ),
            ));
        }
        let now = unix_now();
        let b = BatchObject {
            id: new_id("batch_"),
            object: "batch".into(),
            endpoint: req.endpoint,
            model: None,
            errors: None,
            input_file_id: req.input_file_id,
            completion_window: req.completion_window,
            status: BatchStatus::Validating,
            output_file_id: None,
            error_file_id: None,
            created_at: now,
            in_progress_at: None,
            expires_at: Some(now + 24 * 3600),
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            request_counts: RequestCounts::default(),
            usage: BatchUsage::default(),
            metadata: req.metadata,
            sloserve: BatchProgress::default(),
        };
        self.store.insert_batch(&b, owner)?;
        tracing::info!(batch = %b.id, file = %b.input_file_id, endpoint = %b.endpoint, "batch created");
        self.spawn_job(b.id.clone());
        Ok(b)
    }

    /// `POST /v1/batches/{id}/cancel` of `owner`'s batch.
    pub fn cancel_batch(&self, id: &str, owner: &Owner) -> Result<BatchObject> {
        let cur = self.get_batch(id, owner)?;
        if cur.status.is_terminal() {
            return Err(Error::Conflict(format!(
                "cannot cancel batch {id}: its status is {}",
                cur.status.as_str()
            )));
        }
        if matches!(
            cur.status,
            BatchStatus::Validating | BatchStatus::InProgress
        ) {
            self.store.update_batch(id, |b| {
                b.status = BatchStatus::Cancelling;
                b.cancelling_at = Some(unix_now());
            })?;
        }
        if let Some(l) = self.jobs().get(id) {
            l.control.cancel();
        }
        self.get_batch(id, owner)
    }

    /// Writes the output and error files from the results, in input order; they
    /// belong to the batch's `owner`.
    pub(crate) fn write_outputs(
        &self,
        id: &str,
        owner: &Owner,
    ) -> Result<(Option<String>, Option<String>)> {
        let ids = [format!("file-{id}-output"), format!("file-{id}-errors")];
        let tmp = ids
            .each_ref()
            .map(|f| self.store.file_path(&format!("{f}.tmp")));
        let mut w = [
            std::fs::File::create(&tmp[0])?,
            std::fs::File::create(&tmp[1])?,
        ]
        .map(std::io::BufWriter::new);
        let mut bytes = [0u64; 2];
        self.store.for_each_result(id, |ok, json| {
            let i = usize::from(!ok);
            w[i].write_all(json.as_bytes())?;
            w[i].write_all(b"\n")?;
            bytes[i] += json.len() as u64 + 1;
            Ok(())
        })?;
        let mut out = [None, None];
        for (i, mut writer) in w.into_iter().enumerate() {
            writer.flush()?;
            writer.get_ref().sync_all()?;
            drop(writer);
            if bytes[i] == 0 {
                std::fs::remove_file(&tmp[i])?;
                continue;
            }
            let _ = self.store.delete_file(&ids[i]);
            std::fs::rename(&tmp[i], self.store.file_path(&ids[i]))?;
            let name = if i == 0 { "output" } else { "errors" };
            self.store.insert_file(
                &FileObject {
                    id: ids[i].clone(),
                    object: "file".into(),
                    bytes: bytes[i],
                    created_at: unix_now(),
                    expires_at: self.cfg.retention.map(|r| unix_now() + r.as_secs()),
                    filename: format!("{id}_{name}.jsonl"),
                    purpose: "batch_output".into(),
                    status: "processed".into(),
                    status_details: None,
                },
                owner,
            )?;
            out[i] = Some(ids[i].clone());
        }
        let [o, e] = out;
        Ok((o, e))
    }

    /// The store, for the file routes.
    pub fn files(&self) -> &Store {
        &self.store
    }

    /// True while a batch that is not finished reads file `id`.
    pub fn file_in_use(&self, id: &str) -> Result<bool> {
        let jobs = self.jobs();
        for b in jobs.keys() {
            if self
                .store
                .batch(b)?
                .is_some_and(|(b, _)| b.input_file_id == id)
            {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
