//! Active health checks: every interval each replica's `/health` and `/ready` must
//! answer 200 within the timeout, or it is ejected; a passing check re-admits it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::Full;

use crate::backend::Backend;
use crate::state::RouterState;
use crate::upstream::{error_chain, HttpClient};

/// Runs the checks until the task is aborted.
pub fn spawn(state: Arc<RouterState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let interval = state.cfg.health_interval;
        let timeout = interval.min(Duration::from_secs(2));
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let checks = state
                .picker
                .all_backends()
                .map(|b| check(&state.client, b, timeout));
            join_all(checks).await;
        }
    })
}

async fn check(client: &HttpClient, b: &Arc<Backend>, timeout: Duration) {
    let mut result = Ok(());
    for path in ["/health", "/ready"] {
        result = probe(client, &format!("{}{path}", b.url), timeout).await;
        if result.is_err() {
            break;
        }
    }
    match result {
        Ok(()) => b.report_check(true, ""),
        Err(why) => b.report_check(false, &why),
    }
}

async fn probe(client: &HttpClient, url: &str, timeout: Duration) -> Result<(), String> {
    let req = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => Err(format!("{url}: no answer in {timeout:?}")),
        Ok(Err(e)) => Err(format!("{url}: {}", error_chain(&e))),
        Ok(Ok(r)) if r.status().is_success() => Ok(()),
        Ok(Ok(r)) => Err(format!("{url}: {}", r.status())),
    }
}
