//! The flags (and `[guard]` TOML table) that make the router as safe to expose as a
//! replica: API keys, the connection cap, the header-read, idle, body-read and
//! upstream timeouts and the upstream deadline; `GuardConfig` is their effective form.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use serde::Deserialize;

use crate::keys::{read_key_file, ApiKeys, KeySpec};

#[derive(Args, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardArgs {
    /// API key clients must send (`Authorization: Bearer KEY` or `x-api-key: KEY`),
    /// the replicas' format: repeatable, `KEY:batch` routes the key's requests as
    /// batch. Also from SLOSERVE_API_KEY (comma-separated). The key is passed on.
    #[arg(
        long = "api-key",
        env = "SLOSERVE_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    #[serde(skip)]
    pub api_keys: Vec<KeySpec>,
    /// File of API keys: one `KEY[:CLASS]` a line (`#` comments), added to `--api-key`.
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// `/metrics` also needs a key (`/health` and `/ready` always stay open).
    #[arg(long)]
    #[serde(default)]
    pub metrics_require_key: bool,
    /// Most open client connections (default 1024); past it new ones get 503 except
    /// on `/health` and `/ready` (64 more are kept for those), then are refused.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers (default 10; slowloris bound).
    #[arg(long)]
    pub header_read_timeout: Option<f64>,
    /// Seconds an idle keep-alive client connection stays open (default 5).
    #[arg(long)]
    pub keep_alive_timeout: Option<f64>,
    /// Seconds a client has to send a request's whole body (default 30; 408 beyond).
    #[arg(long)]
    pub body_read_timeout: Option<f64>,
    /// Seconds a replica may take to send its answer's head and first byte, and
    /// between two bytes of its answer (default 60; 0: none). Past it the request
    /// goes to another replica, or a stream already begun ends with an error event.
    #[arg(long)]
    pub upstream_timeout: Option<f64>,
    /// Seconds a forwarded request may take in all, answer included (default 660:
    /// a replica's default `--request-timeout` and a minute; 0: none); a client's
    /// `x-request-timeout-ms` shortens it (plus 5 s for the replica's own answer).
    /// Past it the answer is cut: a 504, or an error event on a stream begun.
    #[arg(long)]
    pub upstream_deadline: Option<f64>,
}

/// The effective settings.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub keys: ApiKeys,
    pub max_connections: usize,
    pub header_read_timeout: Option<Duration>,
    pub keep_alive_timeout: Option<Duration>,
    pub body_read_timeout: Option<Duration>,
    pub upstream_timeout: Option<Duration>,
    pub upstream_deadline: Option<Duration>,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            keys: ApiKeys::default(),
            max_connections: 1024,
            header_read_timeout: secs(10.0),
            keep_alive_timeout: secs(5.0),
            body_read_timeout: secs(30.0),
            upstream_timeout: secs(60.0),
            upstream_deadline: secs(660.0),
        }
    }
}

/// Seconds as a `Duration`; 0 or less: `None` (no limit).
fn secs(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s))
}

fn timeout(name: &str, v: Option<f64>, slot: &mut Option<Duration>) -> anyhow::Result<()> {
    if let Some(s) = v {
        if !s.is_finite() || s < 0.0 {
            bail!("{name} must be a number of seconds (0: none), got {s}");
        }
        *slot = secs(s);
    }
    Ok(())
}

impl GuardConfig {
    /// Lays `g` (the file's table, then the flags) over these settings.
    pub fn apply(&mut self, g: &GuardArgs) -> anyhow::Result<()> {
        self.keys.keys.extend(g.api_keys.iter().cloned());
        if let Some(p) = &g.api_key_file {
            self.keys.keys.extend(read_key_file(p)?);
        }
        self.keys.metrics_require_key |= g.metrics_require_key;
        if let Some(n) = g.max_connections {
            if n == 0 {
                bail!("max_connections must be at least 1");
            }
            self.max_connections = n;
        }
        timeout(
            "header_read_timeout",
            g.header_read_timeout,
            &mut self.header_read_timeout,
        )?;
        timeout(
            "keep_alive_timeout",
            g.keep_alive_timeout,
            &mut self.keep_alive_timeout,
        )?;
        timeout(
            "body_read_timeout",
            g.body_read_timeout,
            &mut self.body_read_timeout,
        )?;
        timeout(
            "upstream_timeout",
            g.upstream_timeout,
            &mut self.upstream_timeout,
        )?;
        timeout(
            "upstream_deadline",
            g.upstream_deadline,
            &mut self.upstream_deadline,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_lay_over_the_defaults() {
        let mut c = GuardConfig::default();
        let g = GuardArgs {
            api_keys: vec!["k".parse().unwrap()],
            upstream_timeout: Some(0.0),
            header_read_timeout: Some(1.5),
            max_connections: Some(7),
            ..Default::default()
        };
        c.apply(&g).unwrap();
        assert!(c.keys.enabled());
        assert_eq!(c.upstream_timeout, None);
        assert_eq!(c.header_read_timeout, Some(Duration::from_millis(1500)));
        assert_eq!((c.max_connections, c.body_read_timeout), (7, secs(30.0)));
        let bad = GuardArgs {
            body_read_timeout: Some(-1.0),
            ..Default::default()
        };
        assert!(c.apply(&bad).is_err());
        let bad = GuardArgs {
            max_connections: Some(0),
            ..Default::default()
        };
        assert!(c.apply(&bad).is_err());
    }
}
