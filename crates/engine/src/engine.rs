//! The engine loop on its own OS thread, and `EngineHandle`, the thread-safe handle
//! the server uses: `submit` (admission-checked, returns a `RequestStream`),
//! `stats`, `shutdown` (drain), `abort` and `cancel`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::admission::{AdmissionState, RequestLimits};
use crate::cached_index::CachedIndex;
use crate::config::EngineConfig;
use crate::core::{EngineCore, StepReport};
use crate::disk_tier::DiskView;
use crate::error::EngineError;
use crate::event::{Event, FinishInfo, FinishReason, RequestStream, RequestTimings, SloReport};
use crate::prefix_cache::CacheChange;
use crate::request::{Admitted, FlowKey, Request, SloClass};
use crate::runner::{ModelRunner, RunnerInfo};
use crate::stats::EngineStats;
use crate::supervisor;

enum Command {
    Submit(Box<NewRequest>),
    /// Finish every request now with `Aborted`.
    Abort,
    /// Finish one request now with `reason`.
    Cancel {
        id: u64,
        reason: FinishReason,
    },
    /// Re-check the stopping flag.
    Wake,
}

struct NewRequest {
    id: u64,
    req: Request,
    admitted: Admitted,
    tx: UnboundedSender<Event>,
    arrival: Instant,
}

struct Shared {
    admission: Mutex<AdmissionState>,
    /// The prefix cache's blocks, for admission at submit.
    cached: CachedIndex,
    /// The disk tier's index, for admission at submit and prefetch.
    disk: std::sync::OnceLock<DiskView>,
    stats: Mutex<EngineStats>,
    stopping: AtomicBool,
    alive: AtomicBool,
    /// The engine stopped because it could not recover from a panic.
    failed: AtomicBool,
    restarts: AtomicU64,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct HandleInner {
    tx: Sender<Command>,
    shared: Arc<Shared>,
    info: RunnerInfo,
    limits: RequestLimits,
    cfg: EngineConfig,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Starts engines.
pub struct Engine;

/// Receives the prefix cache's changes, in order, once per step: the changes and
/// the token ids of every `Stored` block, `block_size` ids each, in the order of
/// the `Stored` changes (e.g. to publish KV-cache events).
pub type CacheSink = Box<dyn FnMut(&[CacheChange], &[u32]) + Send>;

/// Handle to a running engine; cheap to clone and usable from any thread or task.
/// When the last handle is dropped the engine finishes in-flight requests and its
/// thread exits.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<HandleInner>,
}

/// Admission held for the later choices of a request ([`EngineHandle::submit_choices`]):
/// counted in its class's queue until submitted; released when dropped.
pub struct Reserved {
    engine: EngineHandle,
    class: crate::request::SloClass,
    flow: FlowKey,
    prompt_len: usize,
    left: usize,
}

impl Reserved {
    /// Choices still held.
    pub fn left(&self) -> usize {
        self.left
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.left > 0 {
            let sh = &*self.engine.inner.shared;
            let (class, flow, left) = (self.class, self.flow, self.left);
            lock(&sh.admission).release(class, flow, left, left * self.prompt_len);
        }
    }
}

impl Engine {
    /// Starts the engine loop on its own OS thread ("sloserve-engine") driving
    /// `runner`. The KV pool has `min(runner's blocks, config budget)` blocks.
    pub fn start(
        runner: Box<dyn ModelRunner>,
        config: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        Self::start_with_cache_sink(runner, config, None)
    }

    /// `start`, with `sink` called on the engine thread after each step (and
    /// after commands that freed blocks) with the prefix cache's changes and
    /// the token ids of the blocks they store (see [`CacheSink`]). Keep it
    /// quick: it runs between steps.
    pub fn start_with_cache_sink(
        runner: Box<dyn ModelRunner>,
        config: EngineConfig,
        sink: Option<CacheSink>,
    ) -> Result<EngineHandle, EngineError> {
        let shared = Arc::new(Shared {
            admission: Mutex::new(AdmissionState::default()),
            cached: CachedIndex::default(),
            disk: std::sync::OnceLock::new(),
            stats: Mutex::new(EngineStats::default()),
            stopping: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            failed: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let (init_tx, init_rx) = mpsc::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sloserve-engine".into())
            .spawn(move || match EngineCore::new(runner, config) {
                Err(e) => {
                    sh.alive.store(false, Ordering::Release);
                    let _ = init_tx.send(Err(e));
                }
                Ok(core) => {
                    let init = (core.info.clone(), core.limits, core.cfg().clone());
                    if let Some(v) = core.disk_view() {
                        let _ = sh.disk.set(v);
                    }
                    publish(&core, &sh, &StepReport::default());
                    let _ = init_tx.send(Ok(init));
                    run(core, rx, &sh, sink);
                }
            })
            .map_err(|e| EngineError::InvalidConfig(format!("cannot spawn engine thread: {e}")))?;
        let (info, limits, cfg) = init_rx.recv().map_err(|_| EngineError::EngineStopped)??;
        tracing::info!(
            kv_blocks = info.num_kv_blocks,
            block_size = info.block_size,
            max_model_len = info.max_model_len,
            "engine started"
        );
        Ok(EngineHandle {
            inner: Arc::new(HandleInner {
                tx,
                shared,
                info,
                limits,
                cfg,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }
}

impl EngineHandle {
    /// Checks and queues a request: the one place its shape, class, targets and
    /// `max_tokens` are decided (the returned stream says what was decided).
    /// Refuses at once (never hangs) when the engine is stopping, the request
    /// cannot fit the model or KV pool, or its class is overloaded.
    pub fn submit(&self, req: Request) -> Result<RequestStream, EngineError> {
        self.submit_choices(req, 1).map(|(stream, _)| stream)
    }

    /// [`Self::submit`] for a request of `n` choices: admission decides all `n`
    /// together (the queue bounds count every choice; refused at once, all or
    /// none), queues the first and holds the others' admission in [`Reserved`],
    /// for [`Self::submit_reserved`] (e.g. once the first choice's prompt is in
    /// the prefix cache). What is never submitted is released when it drops.
    pub fn submit_choices(
        &self,
        req: Request,
        n: usize,
    ) -> Result<(RequestStream, Reserved), EngineError> {
        let inner = &*self.inner;
        let sh = &*inner.shared;
        if sh.stopping.load(Ordering::Acquire) || !sh.alive.load(Ordering::Acquire) {
            return Err(EngineError::EngineStopped);
        }
        let admitted = inner.limits.decide(&inner.cfg, &req)?;
        let class = admitted.class;
        let prompt_len = req.prompt.len();
        // A scoring or pooled request reads no cached prefix
        // (`Request::prompt_logprobs`, `Request::pooling`).
        let reads_cache = req.prompt_logprobs.is_none() && req.pooling.is_none();
        let cached = match inner.cfg.enable_prefix_cache && reads_cache {
            true => {
                sh.cached
                    .cached_prefix_tokens(req.cache_salt, &req.prompt, inner.info.block_size)
            }
            false => 0,
        };
        // Past the RAM hit, the prefix on disk: loaded at admission (its files
        // read ahead now, while the request waits), so not predicted as prefill.
        let cached = match (sh.disk.get(), inner.cfg.enable_prefix_cache) {
            (Some(d), true) if req.prompt_logprobs.is_none() => {
                cached + d.prefetch(req.cache_salt, &req.prompt, cached)
            }
            _ => cached,
        };
        let n = n.max(1);
        let flow = FlowKey::of(req.fairness.as_deref().unwrap_or(""));
        lock(&sh.admission).try_admit_choices(
            &inner.cfg.admission,
            class,
            flow,
            prompt_len,
            cached,
            n,
            admitted.refuse_ttft_ms,
            req.deadline.map(|d| d.as_secs_f64()),
        )?;
        let reserved = Reserved {
            engine: self.clone(),
            class,
            flow,
            prompt_len,
            left: n - 1,
        };
        let stream = self.queue(req, admitted)?;
        Ok((stream, reserved))
    }

    /// Queues one choice whose admission `reserved` holds (not asked again); the
    /// shape checks still apply. `EngineStopped` once the engine stops.
    pub fn submit_reserved(
        &self,
        reserved: &mut Reserved,
        req: Request,
    ) -> Result<RequestStream, EngineError> {
        if reserved.left == 0 {
            return self.submit(req);
        }
        let inner = &*self.inner;
        let sh = &*inner.shared;
        if sh.stopping.load(Ordering::Acquire) || !sh.alive.load(Ordering::Acquire) {
            return Err(EngineError::EngineStopped);
        }
        let admitted = inner.limits.decide(&inner.cfg, &req)?;
        reserved.left -= 1;
        self.queue(req, admitted)
    }

    /// Sends an admitted request to the engine thread (its admission is released
    /// if the engine is gone).
    fn queue(&self, req: Request, admitted: Admitted) -> Result<RequestStream, EngineError> {
        let inner = &*self.inner;
        let sh = &*inner.shared;
        let (class, prompt_len) = (admitted.class, req.prompt.len());
        let flow = FlowKey::of(req.fairness.as_deref().unwrap_or(""));
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = unbounded_channel();
        let cmd = Command::Submit(Box::new(NewRequest {
            id,
            req,
            admitted,
            tx,
            arrival: Instant::now(),
        }));
        if inner.tx.send(cmd).is_err() {
            lock(&sh.admission).release(class, flow, 1, prompt_len);
            return Err(EngineError::EngineStopped);
        }
        Ok(RequestStream { id, admitted, rx })
    }

    /// The latest snapshot of the engine's gauges and counters.
    pub fn stats(&self) -> EngineStats {
        let sh = &*self.inner.shared;
        let mut st = lock(&sh.stats).clone();
        st.rejected = lock(&sh.admission).rejected;
        st
    }

    /// Seconds a new request of `class` is predicted to wait before it starts
    /// (the figure admission control refuses by; 0 when nothing waits ahead).
    pub fn predicted_wait_s(&self, class: SloClass) -> f64 {
        lock(&self.inner.shared.admission).predicted_wait_s(class)
    }

    /// The runner's info as the engine uses it (effective KV blocks, context length).
    pub fn info(&self) -> &RunnerInfo {
        &self.inner.info
    }

    /// The effective configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    pub fn limits(&self) -> RequestLimits {
        self.inner.limits
    }

    /// Whether the engine accepts requests.
    pub fn is_accepting(&self) -> bool {
        let sh = &*self.inner.shared;
        !sh.stopping.load(Ordering::Acquire) && sh.alive.load(Ordering::Acquire)
    }

    /// Whether the engine stopped on its own because it could not recover from a
    /// panic (the process should exit non-zero so an orchestrator restarts it).
    pub fn has_failed(&self) -> bool {
        self.inner.shared.failed.load(Ordering::Acquire)
    }

    /// Stops accepting requests (`submit` returns `EngineStopped`); requests already
    /// accepted run to completion, then the engine thread exits. Non-blocking.
    pub fn shutdown(&self) {
        self.inner.shared.stopping.store(true, Ordering::Release);
        let _ = self.inner.tx.send(Command::Wake);
    }

    /// Finishes every in-flight request now with `Aborted` (e.g. a second Ctrl-C).
    pub fn abort(&self) {
        let _ = self.inner.tx.send(Command::Abort);
    }

    /// Finishes request `id` now with `reason` (e.g. `StopString` when the caller
    /// matched a stop string): its stream still gets the final `Finished`, with the
    /// engine's token counts and timings. Nothing happens if it already finished.
    pub fn cancel(&self, id: u64, reason: FinishReason) {
        let _ = self.inner.tx.send(Command::Cancel { id, reason });
    }

    /// Waits until the engine thread has exited (after `shutdown`), at most
    /// `timeout` (`None`: forever). Returns whether it exited.
    pub fn wait_stopped(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        while self.inner.shared.alive.load(Ordering::Acquire) {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(t) = lock(&self.inner.thread).take() {
            let _ = t.join();
        }
        true
    }
}

/// What one turn of the loop did.
enum Turn {
    /// Nothing to run (commands handled).
    Idle,
    /// A step ran.
    Stepped,
    /// Stopping or every handle is gone, and nothing is left: the thread exits.
    Exit,
}

/// The loop's own state across turns.
struct LoopState {
    disconnected: bool,
    last_log: Instant,
    /// The prefix cache's changes of one turn (reused).
    cache_changes: Vec<CacheChange>,
    /// The token ids of the blocks `cache_changes` stores (reused).
    cache_tokens: Vec<u32>,
    sink: Option<CacheSink>,
}

/// The engine thread's loop: turns under `catch_unwind`; a panic fails the
/// requests in flight and restarts the engine ([`crate::supervisor`]).
fn run(mut core: EngineCore, rx: Receiver<Command>, sh: &Shared, sink: Option<CacheSink>) {
    let mut st = LoopState {
        disconnected: false,
        last_log: Instant::now(),
        cache_changes: Vec::new(),
        cache_tokens: Vec::new(),
        sink,
    };
    let mut panics_in_a_row = 0;
    loop {
        match catch_unwind(AssertUnwindSafe(|| turn(&mut core, &rx, sh, &mut st))) {
            Ok(Turn::Exit) => break,
            Ok(Turn::Idle) => {}
            Ok(Turn::Stepped) => panics_in_a_row = 0,
            Err(panic) => {
                panics_in_a_row += 1;
                match supervisor::recover(core, panic, panics_in_a_row) {
                    Some(fresh) => {
                        core = fresh;
                        lock(&sh.admission).clear_waiting();
                        sh.restarts.fetch_add(1, Ordering::Relaxed);
                        // The fresh cache's `Cleared` goes out now, not at the next step.
                        let _ = catch_unwind(AssertUnwindSafe(|| {
                            sync_cache_index(&mut core, sh, &mut st);
                            publish(&core, sh, &StepReport::default())
                        }));
                    }
                    None => {
                        sh.failed.store(true, Ordering::Release);
                        break;
                    }
                }
            }
        }
    }
    sh.stopping.store(true, Ordering::Release);
    // Requests that slipped in while stopping: tell them.
    while let Ok(cmd) = rx.try_recv() {
        if let Command::Submit(r) = cmd {
            let _ = r.tx.send(Event::Finished(FinishInfo {
                reason: FinishReason::Error("engine stopped".into()),
                prompt_tokens: r.req.prompt.len(),
                completion_tokens: 0,
                cached_prompt_tokens: 0,
                timings: RequestTimings::new(r.arrival),
                slo: SloReport::default(),
            }));
        }
    }
    sh.alive.store(false, Ordering::Release);
    tracing::info!("engine stopped");
}

/// One turn: take commands (blocking only when idle), step, publish.
fn turn(core: &mut EngineCore, rx: &Receiver<Command>, sh: &Shared, st: &mut LoopState) -> Turn {
    let mut handled = false;
    loop {
        let stopping = sh.stopping.load(Ordering::Acquire);
        let cmd = if handled || core.has_work() || st.disconnected || stopping {
            match rx.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    st.disconnected = true;
                    break;
                }
            }
        } else {
            // Blocked until the next command: idle time, not drain time (the
            // next step's interval starts afresh).
            lock(&sh.admission).mark_idle();
            match rx.recv() {
                Ok(c) => c,
                Err(_) => {
                    st.disconnected = true;
                    break;
                }
            }
        };
        handled = true;
        match cmd {
            Command::Submit(r) => {
                let NewRequest {
                    id,
                    req,
                    admitted,
                    tx,
                    arrival,
                } = *r;
                let seq = core.make_sequence(id, req, admitted, tx, arrival);
                core.add(seq);
            }
            Command::Abort => core.fail_all(FinishReason::Aborted),
            Command::Cancel { id, reason } => core.cancel(id, reason),
            Command::Wake => {}
        }
    }
    if !core.has_work() {
        if handled {
            // A cancel or abort freed blocks with no step to follow: publish now.
            sync_cache_index(core, sh, st);
            publish_idle(core, sh);
        }
        if st.disconnected || sh.stopping.load(Ordering::Acquire) {
            return Turn::Exit;
        }
        return Turn::Idle;
    }
    let report = core.step();
    sync_cache_index(core, sh, st);
    publish(core, sh, &report);
    if st.last_log.elapsed() >= COST_LOG_EVERY {
        st.last_log = Instant::now();
        log_step_cost(&lock(&sh.stats));
    }
    Turn::Stepped
}

/// How often a busy engine logs its step-time model.
const COST_LOG_EVERY: Duration = Duration::from_secs(30);

/// One log line with the step-time model's figures.
fn log_step_cost(st: &EngineStats) {
    let f = &st.step_cost;
    let [fixed, prefill, decode, ctx, large, expert] = f.coefficients.map(|c| c * 1e3);
    tracing::info!(
        fixed_ms = format_args!("{fixed:.2}"),
        per_prefill_token_ms = format_args!("{prefill:.3}"),
        per_decode_row_ms = format_args!("{decode:.3}"),
        per_1k_context_ms = format_args!("{ctx:.3}"),
        large_batch_ms = format_args!("{large:.2}"),
        per_expert_touched_ms = format_args!("{expert:.3}"),
        mean_rel_error = format_args!("{:.3}", f.mean_abs_rel_error),
        steps = f.steps_observed,
        batch_rows_deferred = st.counters.batch_rows_deferred,
        "step-time model"
    );
}

/// Brings the shared index of cached blocks up to date with the prefix cache.
fn sync_cache_index(core: &mut EngineCore, sh: &Shared, st: &mut LoopState) {
    core.take_cache_changes(&mut st.cache_changes, &mut st.cache_tokens);
    sh.cached.apply(&st.cache_changes);
    if let Some(sink) = st.sink.as_mut() {
        if !st.cache_changes.is_empty() {
            sink(&st.cache_changes, &st.cache_tokens);
        }
    }
    st.cache_changes.clear();
    st.cache_tokens.clear();
}

/// Publishes what commands changed while no step runs (the last step's time stays).
fn publish_idle(core: &mut EngineCore, sh: &Shared) {
    let report = StepReport {
        released: core.take_released(),
        ..StepReport::default()
    };
    let last = lock(&sh.stats).last_step_s;
    publish(core, sh, &report);
    lock(&sh.stats).last_step_s = last;
}

/// Publishes admission releases, the prefill rate and a stats snapshot.
fn publish(core: &EngineCore, sh: &Shared, report: &StepReport) {
    let out = &report.outcome;
    let mut st = core.snapshot();
    let prefill_rate = {
        let mut a = lock(&sh.admission);
        a.observe_slots(&st.running, core.cfg().max_num_seqs);
        a.observe_step(&report.released, out.secs, Instant::now());
        a.observe_prefill(out.prefill_tokens, out.secs);
        a.observe_cost_model(core.cost_model(), core.cfg().max_prefill_chunk);
        a.prefill_rate
    };
    st.prefill_tokens_per_s = prefill_rate;
    st.last_step_s = out.secs;
    st.engine_restarts = sh.restarts.load(Ordering::Relaxed);
    *lock(&sh.stats) = st;
}
