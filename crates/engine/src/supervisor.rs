//! The engine thread's supervision: after a panic anywhere in a loop turn (commands,
//! step, stats), the requests in flight fail with a generic error (the panic and
//! their ids are logged, never sent), and the engine restarts on the same runner
//! (`ModelRunner::reset`) with every KV block free and an empty prefix cache. Too
//! many panics in a row, or a failed restart, stop it for good.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::core::EngineCore;
use crate::event::FinishReason;

/// Panics with no successful step between them before the engine gives up.
pub const MAX_PANICS_IN_A_ROW: u32 = 3;

/// What failed requests are told (the details are in the log).
pub const ENGINE_FAILURE: &str = "internal engine error";

/// The text of a panic payload.
pub fn panic_message(p: &(dyn Any + Send)) -> &str {
    p.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// Handles a panic of the engine loop: fails what `core` holds and returns a fresh
/// core on the same runner, or `None` when the engine cannot go on.
pub(crate) fn recover(
    core: EngineCore,
    panic: Box<dyn Any + Send>,
    in_a_row: u32,
) -> Option<EngineCore> {
    let mut core = core;
    let ids = catch_unwind(AssertUnwindSafe(|| core.request_ids())).unwrap_or_default();
    tracing::error!(
        panic = panic_message(&*panic),
        request_ids = ?ids,
        in_a_row,
        "engine thread panicked; failing its requests"
    );
    let reason = FinishReason::Error(ENGINE_FAILURE.into());
    if catch_unwind(AssertUnwindSafe(|| core.fail_all(reason))).is_err() {
        tracing::error!("failing the requests panicked too; their streams just end");
    }
    if in_a_row > MAX_PANICS_IN_A_ROW {
        tracing::error!(
            panics = in_a_row,
            "engine panicked {in_a_row} times in a row; giving up"
        );
        return None;
    }
    match catch_unwind(AssertUnwindSafe(move || core.restart())) {
        Ok(Ok(core)) => {
            tracing::warn!("engine restarted: KV pool and prefix cache empty, serving again");
            Some(core)
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "engine cannot restart");
            None
        }
        Err(p) => {
            tracing::error!(panic = panic_message(&*p), "engine restart panicked");
            None
        }
    }
}
