//! `parallel_for`: the compute pool the per-token kernels run on. One persistent set
//! of workers (as many as the rayon pool's threads, the caller being one of them)
//! that spin between jobs instead of sleeping, so the ~100 parallel sections of a
//! decode step each start in well under a microsecond (a work-stealing pool wakes
//! sleeping threads per section). Tasks are handed out through one atomic counter;
//! workers that find no job for `SPIN` park until the next one.
//!
//! A job waits only for the workers that joined it. A worker that is not running
//! when a job opens (parked, or its core taken by another process on a shared
//! machine) is not waited for: the caller runs the tasks itself, closes the job, and
//! waits for the workers still inside it, which hold a task or are about to find
//! none. (Waiting for every worker to acknowledge every job made each of a step's
//! ~100 sections wait for a descheduled worker: 15-40x slower decoding beside
//! another busy process.)
//!
//! Invariants: `job` is written only while the job is closed and no worker is inside
//! (`active == 0` after the close); a worker reads it only after it has counted
//! itself in `active` and then seen the same open state again, so a job that closed
//! (or a newer one) in between is never read.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before it parks.
const SPIN: Duration = Duration::from_micros(500);

/// A job: `f(task)` for every task in `0..tasks`, borrowed for the job's length.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// `generation << 1 | open`: bumped (and opened) once per job, closed when the
    /// submitter has run out of tasks.
    state: AtomicU64,
    /// The current job, written by the submitter while the job is closed and no
    /// worker is inside it (see the module's invariants).
    job: UnsafeCell<Option<Job>>,
    /// The next task index to hand out.
    next: AtomicUsize,
    /// Workers inside the current job (between their entry and their exit).
    active: AtomicUsize,
    /// Whether a task panicked on a worker during the current job.
    panicked: AtomicBool,
    /// Parked workers (changed only under this lock) and their wake-up.
    parked: Mutex<usize>,
    wake: Condvar,
}

const OPEN: u64 = 1;

// SAFETY: `job` is written only by the submitter while it holds `Pool::submit`, with
// the job closed and no worker inside it (`active == 0` seen after the close); a worker
// reads it only after counting itself in `active` and seeing the same open state again
// (SeqCst), which a submitter that already waited for `active == 0` can no longer
// show. The closure it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

struct Pool {
    shared: &'static Shared,
    workers: usize,
    /// Held while a job runs: a second caller (another thread, or a task that
    /// itself calls `parallel_for`) runs its job inline instead.
    submit: Mutex<()>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        }));
        let workers = rayon::current_num_threads().saturating_sub(1);
        for i in 0..workers {
            std::thread::Builder::new()
                .name(format!("sloserve-spin-{i}"))
                .spawn(move || worker(shared))
                .expect("spawn compute worker");
        }
        Pool {
            shared,
            workers,
            submit: Mutex::new(()),
        }
    })
}

/// Threads a `parallel_for` job runs on (the caller included).
pub fn threads() -> usize {
    pool().workers + 1
}

/// Runs a GEMM's tiles on the pool: `m` rows in chunks of `row_chunk`, `panels` column
/// panels in runs of whole panels, enough tasks (four a thread) to balance the pool;
/// `f(rows, panels)` runs once per task, and the tasks cover every (row, panel) once.
pub fn parallel_tiles(
    m: usize,
    row_chunk: usize,
    panels: usize,
    f: &(dyn Fn(Range<usize>, Range<usize>) + Sync),
) {
    if m == 0 || panels == 0 {
        return;
    }
    let m_chunks = m.div_ceil(row_chunk);
    let per_task = (panels * m_chunks).div_ceil(threads() * 4).clamp(1, panels);
    let groups = panels.div_ceil(per_task);
    parallel_for(m_chunks * groups, &|t| {
        let (mc, g) = (t / groups, t % groups);
        let rows = mc * row_chunk..((mc + 1) * row_chunk).min(m);
        f(rows, g * per_task..((g + 1) * per_task).min(panels));
    });
}

/// Rows per task of the row-wise work (`parallel_rows`) on hidden-state rows: a
/// small batch's rows run on the caller alone.
pub const ROWS_PER_TASK: usize = 8;

/// Splits `out`, rows of `width`, into runs of `rows_per_task` whole rows and runs
/// `f(first_row, run)` on the pool for each run: the per-row work of a large batch
/// (norms, residual adds, copies) on every thread, a small batch's on the caller.
pub fn parallel_rows(
    out: &mut [f32],
    width: usize,
    rows_per_task: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    if width == 0 {
        return;
    }
    let rows = out.len() / width;
    let per = rows_per_task.max(1);
    let ptr = crate::kernels::cpu::OutPtr(out.as_mut_ptr());
    parallel_for(rows.div_ceil(per), &|t| {
        let (lo, hi) = (t * per, ((t + 1) * per).min(rows));
        // SAFETY: task t alone gets rows lo..hi, which lie inside `out` (hi <= rows).
        let run =
            unsafe { std::slice::from_raw_parts_mut(ptr.get().add(lo * width), (hi - lo) * width) };
        f(lo, run);
    });
}

/// Runs `f(task)` for every task in `0..tasks` on the pool and returns when all are
/// done. Tasks run in no particular order, each exactly once.
pub fn parallel_for(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let p = pool();
    if tasks <= 1 || p.workers == 0 {
        (0..tasks).for_each(f);
        return;
    }
    let _guard = match p.submit.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            (0..tasks).for_each(f);
            return;
        }
    };
    let s = p.shared;
    // SAFETY: the job is closed and no worker is inside it (the previous call waited
    // for `active == 0` after closing), so no worker reads `job` while it is written;
    // it outlives its use: this function returns only after closing the job and
    // waiting for the workers inside it (`CloseJob`).
    unsafe {
        let f: *const (dyn Fn(usize) + Sync + '_) = f;
        *s.job.get() = Some(Job {
            f: std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f),
            tasks,
        });
    }
    s.next.store(0, Ordering::Relaxed);
    s.panicked.store(false, Ordering::Relaxed);
    let generation = (s.state.load(Ordering::Relaxed) >> 1) + 1;
    s.state.store(generation << 1 | OPEN, Ordering::SeqCst);
    {
        let parked = s.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *parked > 0 {
            s.wake.notify_all();
        }
    }
    {
        // Closes the job and waits for the workers inside it even if a task panics
        // here: they use `f` until they leave.
        let _close = CloseJob(s, generation);
        run_tasks(s, f, tasks);
    }
    if s.panicked.swap(false, Ordering::Relaxed) {
        panic!("a compute task panicked on a pool worker");
    }
}

/// Closes the job (no worker enters it from now on), then spins (then yields)
/// until the workers inside it have left. Every task is claimed by then, so they
/// are running one or finding none.
struct CloseJob(&'static Shared, u64);

impl Drop for CloseJob {
    fn drop(&mut self) {
        self.0.state.store(self.1 << 1, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.0.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                // A worker inside was descheduled (a busy machine): let it run.
                std::thread::yield_now();
            }
        }
    }
}

fn run_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        let t = s.next.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            break;
        }
        f(t);
    }
}

fn worker(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let state = next_open_job(s, &mut seen);
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) == state {
            // SAFETY: counted in `active`, we saw the job still open after that, so
            // its submitter has not finished waiting for `active == 0` and keeps the
            // job (written before it opened it, SeqCst) alive until we leave.
            let job = unsafe { (*s.job.get()).expect("an open job") };
            let run = AssertUnwindSafe(|| run_tasks(s, unsafe { &*job.f }, job.tasks));
            if catch_unwind(run).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits (spins for `SPIN`, then parks) for a job newer than `seen` that is still
/// open; returns its state. Jobs that open and close meanwhile are skipped (their
/// submitter ran their tasks).
fn next_open_job(s: &Shared, seen: &mut u64) -> u64 {
    let fresh = |state: u64, seen: &mut u64| {
        if state >> 1 == *seen {
            return false;
        }
        *seen = state >> 1;
        state & OPEN != 0
    };
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = s.state.load(Ordering::SeqCst);
        if fresh(state, seen) {
            return state;
        }
        spins += 1;
        if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
            let mut parked = s.parked.lock().unwrap_or_else(|e| e.into_inner());
            *parked += 1;
            let state = loop {
                let state = s.state.load(Ordering::SeqCst);
                if fresh(state, seen) {
                    break state;
                }
                parked = s.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
            };
            *parked -= 1;
            return state;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_task_once() {
        for tasks in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                parallel_for(tasks, &|t| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
        }
    }

    #[test]
    fn many_short_jobs_run_every_task_once() {
        // Jobs that open and close faster than a worker wakes: workers skip or join
        // them at any point, and no task is run twice or lost.
        let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        let mut want = vec![0usize; 64];
        for round in 0..20_000usize {
            let tasks = 2 + round % 63;
            parallel_for(tasks, &|t| {
                if t % 17 == 5 && round % 1000 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            want.iter_mut().take(tasks).for_each(|w| *w += 1);
            if round % 5000 == 0 {
                std::thread::sleep(SPIN * 3); // let the workers park
            }
        }
        let got: Vec<usize> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn tiles_cover_every_row_and_panel_once() {
        for (m, chunk, panels) in [(0, 64, 5), (5, 64, 0), (1, 64, 1), (200, 64, 37), (7, 2, 3)] {
            let hits: Vec<AtomicUsize> = (0..m * panels).map(|_| AtomicUsize::new(0)).collect();
            parallel_tiles(m, chunk, panels, &|rows, ps| {
                assert!(rows.len() <= chunk && !rows.is_empty() && !ps.is_empty());
                for r in rows {
                    for p in ps.clone() {
                        hits[r * panels + p].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{m} {chunk} {panels}"
            );
        }
    }

    #[test]
    fn rows_are_handed_out_whole_once_with_their_index() {
        for (rows, width, per) in [
            (0, 3, 8),
            (1, 3, 8),
            (8, 3, 8),
            (33, 5, 8),
            (10, 1, 3),
            (4, 2, 0),
        ] {
            let mut out = vec![0f32; rows * width];
            parallel_rows(&mut out, width, per, &|r0, run| {
                assert_eq!(run.len() % width, 0, "a run of whole rows");
                for (i, row) in run.chunks_exact_mut(width).enumerate() {
                    for v in row.iter_mut() {
                        *v += (r0 + i) as f32 + 1.0;
                    }
                }
            });
            let want: Vec<f32> = (0..rows * width)
                .map(|j| (j / width) as f32 + 1.0)
                .collect();
            assert_eq!(out, want, "{rows} rows of {width}, {per} a task");
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_still_works() {
        let r = std::panic::catch_unwind(|| {
            parallel_for(64, &|t| {
                if t % 7 == 3 {
                    panic!("task {t}");
                }
            })
        });
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        parallel_for(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..20 {
                        parallel_for(4, &|_| {
                            parallel_for(3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 20 * 4 * 3);
    }
}
