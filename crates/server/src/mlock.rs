//! `--mlock`: after the model and its KV cache are loaded, lock every page the
//! process holds in RAM (`mlockall(MCL_CURRENT)`), so the kernel never swaps weights
//! out under memory pressure and a step never waits on a page fault. Only what is
//! mapped now is locked (`MCL_FUTURE` is not set): a later allocation beyond the
//! lock limit must not fail a request. As llama.cpp's `--mlock`, a refusal (the
//! `RLIMIT_MEMLOCK` limit, `ulimit -l`) is a warning that says how much was asked
//! and how much is allowed, and the server runs on unlocked.

/// Locks the process's current pages; logs what was locked or why not.
pub fn lock_current_pages() {
    // SAFETY: mlockall takes flags only and touches no memory of ours.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT) };
    if r == 0 {
        tracing::info!(
            locked = %status_kb("VmLck").map_or("unknown".into(), mib),
            "--mlock: every page the process holds is locked in RAM"
        );
        return;
    }
    let err = std::io::Error::last_os_error();
    let limit = memlock_limit().map_or("unknown".into(), |l| match l {
        None => "unlimited".into(),
        Some(b) => mib(b / 1024),
    });
    tracing::warn!(
        error = %err,
        resident = %status_kb("VmRSS").map_or("unknown".into(), mib),
        limit,
        "--mlock: the pages could not be locked; serving unlocked (raise the limit: \
         `ulimit -l unlimited`, systemd LimitMEMLOCK=infinity, or CAP_IPC_LOCK)"
    );
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// A `/proc/self/status` field in kB (`VmRSS`, `VmLck`).
fn status_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// `RLIMIT_MEMLOCK`'s soft limit in bytes (`Some(None)`: unlimited).
fn memlock_limit() -> Option<Option<u64>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    (r == 0).then_some((lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse() {
        assert!(status_kb("VmRSS").is_some_and(|kb| kb > 0));
        assert!(status_kb("NoSuchField").is_none());
        assert!(memlock_limit().is_some());
    }
}
