//! `CompilePool`: grammar compiles on a fixed number of worker threads with a
//! bounded queue. A full queue refuses at once (`GrammarError::Busy`); a caller
//! waits at most its timeout; a job whose caller gave up never starts, and a running
//! one is asked to stop (its [`Ticket`]: llguidance's cancellation, checked between
//! phases). Work llguidance cannot interrupt runs on, but only on these workers,
//! which run below the engine's priority (`thread_priority::COMPILE_NICE`): a
//! client's schema may hold a worker's core for its whole timeout, and every
//! stream's next token comes first.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llguidance::CancellationHandle;
use sloserve_engine::thread_priority;

use crate::GrammarError;

/// One job's stop request, shared by its caller and its worker.
#[derive(Default)]
pub struct Ticket {
    abandoned: AtomicBool,
    cancel: Mutex<Option<CancellationHandle>>,
}

impl Ticket {
    /// Whether the caller gave up (the job should stop where it can).
    pub fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Cancels `h` when the caller gives up (at once if it already did).
    pub fn cancel_with(&self, h: CancellationHandle) {
        if let Ok(mut c) = self.cancel.lock() {
            *c = Some(h.clone());
        }
        if self.abandoned() {
            h.cancel();
        }
    }

    fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        if let Ok(c) = self.cancel.lock() {
            if let Some(h) = c.as_ref() {
                h.cancel();
            }
        }
    }
}

/// A job's work; what it returns delivers the result (after the job stopped
/// counting as running).
type Work = Box<dyn FnOnce(&Ticket) -> Box<dyn FnOnce() + Send> + Send>;

struct Job {
    work: Work,
    ticket: Arc<Ticket>,
}

/// The workers and their queue. Dropping it lets the workers end after their job.
pub struct CompilePool {
    queue: SyncSender<Job>,
    running: Arc<AtomicUsize>,
    workers: usize,
    queue_len: usize,
}

impl std::fmt::Debug for CompilePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompilePool")
            .field("workers", &self.workers)
            .field("queue", &self.queue_len)
            .field("running", &self.running())
            .finish()
    }
}

impl CompilePool {
    /// `workers` threads (at least 1), at most `queue_len` jobs waiting (at least 1).
    pub fn new(workers: usize, queue_len: usize) -> Result<Self, GrammarError> {
        let (workers, queue_len) = (workers.max(1), queue_len.max(1));
        let (tx, rx) = mpsc::sync_channel::<Job>(queue_len);
        let rx = Arc::new(Mutex::new(rx));
        let running = Arc::new(AtomicUsize::new(0));
        for i in 0..workers {
            let (rx, running) = (rx.clone(), running.clone());
            std::thread::Builder::new()
                .name(format!("grammar-compile-{i}"))
                .spawn(move || {
                    thread_priority::lower_current_thread(thread_priority::COMPILE_NICE);
                    work(&rx, &running)
                })
                .map_err(|e| GrammarError::Vocab(format!("spawning a compile worker: {e}")))?;
        }
        Ok(CompilePool {
            queue: tx,
            running,
            workers,
            queue_len,
        })
    }

    /// Jobs running on a worker now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Runs `f` on a worker and waits at most `timeout` (queueing included). Past
    /// it the job is abandoned: it never starts if still queued, and its ticket
    /// asks it to stop.
    pub fn run<T: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Ticket) -> T + Send + 'static,
    ) -> Result<T, GrammarError> {
        let (tx, rx) = mpsc::channel();
        let ticket = Arc::new(Ticket::default());
        let job = Job {
            work: Box::new(move |t: &Ticket| {
                let r = f(t);
                Box::new(move || {
                    let _ = tx.send(r);
                })
            }),
            ticket: ticket.clone(),
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(GrammarError::Busy(format!(
                    "{} grammar compiles are running and {} waiting; retry later",
                    self.workers, self.queue_len
                )))
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(GrammarError::Vocab("the compile workers are gone".into()))
            }
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                ticket.abandon();
                Err(GrammarError::CompileTimeout(timeout.as_millis() as u64))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(GrammarError::Invalid(
                "the grammar compiler panicked".into(),
            )),
        }
    }
}

/// A worker: takes jobs until the pool is dropped; skips abandoned ones.
fn work(rx: &Mutex<Receiver<Job>>, running: &AtomicUsize) {
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        if job.ticket.abandoned() {
            continue;
        }
        running.fetch_add(1, Ordering::SeqCst);
        let ticket = job.ticket;
        // A panic drops the job's sender: its caller hears "panicked".
        let deliver = catch_unwind(AssertUnwindSafe(|| (job.work)(&ticket)));
        running.fetch_sub(1, Ordering::SeqCst);
        if let Ok(deliver) = deliver {
            deliver();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Waits (bounded) until `cond` holds.
    fn wait_until(cond: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn compiles_run_below_the_engines_priority() {
        let pool = CompilePool::new(1, 1).unwrap();
        let caller = thread_priority::current_thread_nice();
        let worker = pool
            .run(Duration::from_secs(5), |_| {
                thread_priority::current_thread_nice()
            })
            .unwrap();
        let want = (caller + thread_priority::COMPILE_NICE).min(19);
        assert_eq!(worker, want, "caller {caller}");
    }

    #[test]
    fn bounded_queue_abandoned_jobs_and_recovery() {
        let pool = CompilePool::new(1, 1).unwrap();
        assert_eq!(pool.run(Duration::from_secs(5), |_| 7).unwrap(), 7);
        // A job that runs until its ticket says stop: the caller's timeout stops it.
        let stopped = Arc::new(AtomicBool::new(false));
        let s = stopped.clone();
        let e = pool
            .run(Duration::from_millis(50), move |t| {
                while !t.abandoned() {
                    std::thread::yield_now();
                }
                s.store(true, Ordering::SeqCst);
            })
            .unwrap_err();
        assert_eq!(e, GrammarError::CompileTimeout(50));
        assert!(wait_until(
            || pool.running() == 0 && stopped.load(Ordering::SeqCst)
        ));

        // One worker held, one job queued: the next is refused at once.
        let (hold_tx, hold_rx) = mpsc::channel::<()>();
        let pool = Arc::new(pool);
        let p = pool.clone();
        let holder = std::thread::spawn(move || {
            p.run(Duration::from_secs(10), move |_| {
                let _ = hold_rx.recv();
            })
        });
        assert!(wait_until(|| pool.running() == 1));
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        // Queued behind the held job, abandoned at its timeout: it never runs.
        let e = pool
            .run(Duration::from_millis(20), move |_| {
                r.store(true, Ordering::SeqCst)
            })
            .unwrap_err();
        assert_eq!(e, GrammarError::CompileTimeout(20));
        // The abandoned job still fills the queue until the worker skips it.
        assert!(matches!(
            pool.run(Duration::from_secs(1), |_| ()),
            Err(GrammarError::Busy(_))
        ));
        hold_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
        // The worker skips the abandoned job, then takes new ones again.
        assert!(wait_until(|| matches!(
            pool.run(Duration::from_secs(5), |_| 8),
            Ok(8)
        )));
        assert_eq!(pool.running(), 0);
        assert!(!ran.load(Ordering::SeqCst), "an abandoned job ran");
    }
}
