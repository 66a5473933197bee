//! Thread priorities around the engine: work that only prepares, refuses or
//! constrains requests runs below the engine's own threads (Linux nice values;
//! raising one's own needs no privilege), so under a flood of such work every
//! running stream's next step comes first. Elsewhere a no-op.

/// Request preparation off the async workers (parsing bodies, chat templates,
/// tokenizing: the server's blocking pool).
pub const PREPARE_NICE: i32 = 5;
/// Grammar compiles (a client's schema may hold a worker's core for its whole
/// timeout).
pub const COMPILE_NICE: i32 = 10;

/// Raises the calling thread's nice value by `by` (at most 19).
pub fn lower_current_thread(by: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: `gettid` has no preconditions; `setpriority(PRIO_PROCESS, tid, n)`
    // with a thread id changes only that thread's nice value (Linux's per-thread
    // semantics) and touches no memory; `getpriority` only reads. A failure
    // leaves the priority as it was.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, (now + by).min(19));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = by;
}

/// The calling thread's nice value (0 where unknown).
pub fn current_thread_nice() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `lower_current_thread`; only reads (nice values here are
    // never -1, so errno needs no check).
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::getpriority(libc::PRIO_PROCESS, tid)
    }
    #[cfg(not(target_os = "linux"))]
    0
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_lowers_only_itself() {
        let caller = current_thread_nice();
        let lowered = std::thread::spawn(|| {
            lower_current_thread(PREPARE_NICE);
            current_thread_nice()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, (caller + PREPARE_NICE).min(19));
        assert_eq!(current_thread_nice(), caller, "the caller is untouched");
    }
}
