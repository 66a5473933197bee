//! `parallel_for`: the compute pool the per-token kernels run on. One persistent set
//! of workers (as many as the rayon pool's threads, the caller being one of them)
//! that spin between jobs instead of sleeping, so the ~100 parallel sections of a
//! decode step each start in well under a microsecond (a work-stealing pool wakes
//! sleeping threads per section). Tasks are handed out through one atomic counter;
//! workers that find no job for `SPIN` park until the next one.

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
    /// Bumped once per job; workers wait for it to change.
    generation: AtomicU64,
    /// The current job, written by the submitter before it bumps `generation`.
    job: UnsafeCell<Option<Job>>,
    /// The next task index to hand out.
    next: AtomicUsize,
    /// Workers that have not finished the current job.
    busy: AtomicUsize,
    /// Whether a task panicked on a worker during the current job.
    panicked: AtomicBool,
    /// Parked workers (changed only under this lock) and their wake-up.
    parked: Mutex<usize>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the submitter while it holds `Pool::submit` and no
// worker is inside a job (busy == 0); workers read it only after an Acquire load of
// the new generation, which the submitter Release-stored after writing it. The
// closure it points to is `Sync`.
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
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
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
    // SAFETY: the job outlives its use: this function returns only after every worker
    // has left the job (busy == 0), and no worker is inside one now (see Shared).
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
    s.busy.store(p.workers, Ordering::Relaxed);
    s.generation.fetch_add(1, Ordering::Release);
    {
        let parked = s.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *parked > 0 {
            s.wake.notify_all();
        }
    }
    {
        // Waits for the workers even if a task panics here: they use `f` until then.
        let _wait = WaitForWorkers(s);
        run_tasks(s, f, tasks);
    }
    if s.panicked.swap(false, Ordering::Relaxed) {
        panic!("a compute task panicked on a pool worker");
    }
}

/// Spins (then yields) until every worker has left the current job.
struct WaitForWorkers(&'static Shared);

impl Drop for WaitForWorkers {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.0.busy.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                // A worker was descheduled (a busy machine): let it run.
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
        let start = Instant::now();
        let mut spins = 0u32;
        let gen = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            spins += 1;
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut parked = s.parked.lock().unwrap_or_else(|e| e.into_inner());
                *parked += 1;
                while s.generation.load(Ordering::Acquire) == seen {
                    parked = s.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                *parked -= 1;
                break s.generation.load(Ordering::Acquire);
            }
            std::hint::spin_loop();
        };
        seen = gen;
        // SAFETY: the submitter wrote the job before bumping the generation we just
        // Acquire-loaded, and keeps it alive until we decrement `busy`.
        let job = unsafe { (*s.job.get()).expect("a job with its generation") };
        let run = AssertUnwindSafe(|| run_tasks(s, unsafe { &*job.f }, job.tasks));
        if catch_unwind(run).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.busy.fetch_sub(1, Ordering::Release);
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
