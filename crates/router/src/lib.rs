//! `sloserve route`: the OpenAI-compatible router in front of replicas — SLO-class
//! fleets, prefix affinity with bounded load over least outstanding work, batch
//! spill-over, health checks with ejection, one retry, streamed pass-through;
//! hardened like a replica (API keys, connection cap, header/idle/body timeouts,
//! an upstream timeout, a body limit enforced before any replica sees the body).
//!
//! Entry points: [`run`] (the command; builds its own runtime), [`serve_on`] (a
//! listener and a shutdown signal), [`spawn`] (in-process, for tests).

pub mod auth;
pub mod backend;
pub mod batch_api;
pub mod config;
pub mod error;
pub mod guard;
pub mod health;
pub mod histogram;
pub mod keys;
pub mod listen;
pub mod metrics;
pub mod owners;
pub mod picker;
pub mod proxy;
pub mod request;
pub mod routes;
pub mod state;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub use config::{Policy, RouteArgs, RouterConfig};
pub use error::RouterError;
pub use state::RouterState;

/// Longest wait for open answers (streams) after SIGTERM / ctrl-c.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves `listener` (and runs the health checks) until `shutdown` resolves and
/// the open connections have finished.
pub async fn serve_on(
    listener: TcpListener,
    state: Arc<RouterState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let health = health::spawn(state.clone());
    let app = routes::router(state.clone());
    listen::serve(listener, app, &state.cfg.guard, shutdown).await;
    health.abort();
    Ok(())
}

/// `sloserve route`: serves until SIGTERM / ctrl-c.
pub fn run(args: RouteArgs) -> anyhow::Result<()> {
    let cfg = RouterConfig::from_args(&args)?;
    let state = Arc::new(RouterState::new(cfg)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sloserve-route")
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async {
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        for f in &state.picker.fleets {
            let urls: Vec<&str> = f.backends.iter().map(|b| b.url.as_str()).collect();
            tracing::info!(fleet = %f.name, replicas = ?urls, "fleet");
        }
        tracing::info!(addr = %listener.local_addr()?, policy = ?state.cfg.policy,
            spill_over = state.cfg.spill_over, api_keys = state.cfg.guard.keys.keys.len(),
            max_body_bytes = state.cfg.max_body_bytes,
            upstream_timeout = ?state.cfg.guard.upstream_timeout,
            upstream_deadline = ?state.cfg.guard.upstream_deadline, "sloserve route: listening");
        let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
        let served = serve_on(listener, state, async move {
            signal().await;
            let _ = stopped_tx.send(());
        });
        tokio::pin!(served);
        tokio::select! {
            r = &mut served => return r,
            _ = stopped_rx => {}
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, served).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    "sloserve route: answers still open after {SHUTDOWN_GRACE:?}; stopping"
                );
                Ok(())
            }
        }
    })
}

async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
    tracing::info!("sloserve route: stopping");
}

/// A router started in-process by [`spawn`]; dropping it stops the router.
pub struct RouterHandle {
    pub addr: SocketAddr,
    pub state: Arc<RouterState>,
    _stop: oneshot::Sender<()>,
}

/// Starts a router for `cfg` on a free loopback port in the current runtime.
pub async fn spawn(cfg: RouterConfig) -> anyhow::Result<RouterHandle> {
    let state = Arc::new(RouterState::new(cfg)?);
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(serve_on(listener, state.clone(), async move {
        let _ = rx.await;
    }));
    Ok(RouterHandle {
        addr,
        state,
        _stop: tx,
    })
}
