//! Graceful shutdown: the SIGTERM / ctrl-c signal, then draining — `/ready` and new
//! requests answer 503 while in-flight requests finish (up to the deadline, after
//! which they are aborted), then the listener closes and the engine stops.

use std::sync::Arc;
use std::time::Duration;

use crate::state::AppState;

/// Resolves on SIGTERM or ctrl-c (SIGINT).
pub async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("ctrl-c received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}

/// Marks the server draining and waits for in-flight requests, at most the
/// configured timeout; then aborts what is left. Returns whether all finished.
pub async fn drain(state: &Arc<AppState>) -> bool {
    let deadline = state.shutdown_timeout;
    tracing::info!(
        in_flight = state.inflight(),
        deadline_s = deadline.as_secs_f64(),
        "draining: refusing new requests, finishing in-flight ones"
    );
    state.begin_drain();
    let finished = tokio::time::timeout(deadline, state.wait_idle())
        .await
        .is_ok();
    if !finished {
        tracing::warn!(
            in_flight = state.inflight(),
            "shutdown deadline passed; aborting the requests still running"
        );
        state.engine.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), state.wait_idle()).await;
    }
    finished
}
