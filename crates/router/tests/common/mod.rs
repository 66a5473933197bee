//! Test support for the router: real replicas of the default model started
//! in-process (each on its own thread and runtime, so a test can kill one abruptly
//! and start it again on the same port), a router on its own runtime, and the
//! server tests' blocking HTTP/SSE client.
#![allow(dead_code)]

pub mod fake;
#[path = "../../../server/tests/common/mod.rs"]
mod http;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use http::{get, metric, metric_sum, post, request, send, test_args, Resp, Streaming};
use sloserve_router::{RouterConfig, RouterState};
use sloserve_server::ServeArgs;

/// A real `sloserve serve` replica on loopback.
pub struct Replica {
    pub addr: SocketAddr,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    /// Starts a replica with `args` on `port` (0: a free one).
    pub fn start(args: ServeArgs, port: u16) -> Replica {
        let (tx, rx) = mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = sloserve_server::App::load(&args).expect("load the model");
                // A port just freed by a killed replica may take a moment to bind.
                let mut tries = 0;
                let h = loop {
                    match sloserve_server::spawn(app.clone(), "127.0.0.1", port).await {
                        Ok(h) => break h,
                        Err(e) if tries < 50 => {
                            tries += 1;
                            tracing::debug!("bind {port}: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("cannot bind the replica's port {port}: {e}"),
                    }
                };
                tx.send(h.addr).unwrap();
                let _ = kill_rx.await;
                // No graceful drain: the runtime's end below kills everything.
                std::mem::forget(h);
            });
            // Every connection task dies with the runtime: clients see resets, as
            // from a crashed process.
            rt.shutdown_background();
        });
        let addr = rx.recv().expect("replica failed to start");
        Replica {
            addr,
            kill: Some(kill_tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops it abruptly (open connections are reset, nothing drains).
    pub fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    pub fn metrics(&self) -> String {
        get(self.addr, "/metrics").text()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Small, fast replica settings (one compute thread, short context).
pub fn replica_args(profile: &str) -> ServeArgs {
    let mut a = test_args();
    a.profile = profile.into();
    a.engine.set("max-model-len", "512").unwrap();
    a
}

/// A router on its own runtime; dropped with the struct.
pub struct TestRouter {
    pub addr: SocketAddr,
    pub state: std::sync::Arc<RouterState>,
    _handle: sloserve_router::RouterHandle,
    _rt: tokio::runtime::Runtime,
}

impl TestRouter {
    pub fn start(cfg: RouterConfig) -> TestRouter {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let h = rt
            .block_on(sloserve_router::spawn(cfg))
            .expect("start the router");
        TestRouter {
            addr: h.addr,
            state: h.state.clone(),
            _handle: h,
            _rt: rt,
        }
    }

    pub fn metrics(&self) -> String {
        get(self.addr, "/metrics").text()
    }

    /// A per-backend metric of the router.
    pub fn backend_metric(&self, name: &str, url: &str) -> f64 {
        let prefix = format!("sloserve_router:{name}{{");
        let want = format!("backend=\"{url}\"}}");
        self.metrics()
            .lines()
            .find(|l| l.starts_with(&prefix) && l.contains(&want))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} for {url}"))
    }
}

/// Polls `f` every 50 ms until it holds or `secs` pass.
pub fn wait_until(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// `POST path` with extra headers and a JSON body.
pub fn post_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Resp {
    request(addr, "POST", path, headers, body.to_string().as_bytes())
}
