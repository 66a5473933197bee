//! The flags that make a replica safe to expose: API keys, prefix-cache scope,
//! connection and in-flight limits, and the timeouts (flattened into `ServeArgs`).

use std::time::Duration;

use clap::{Args, ValueEnum};

/// One `--api-key KEY[:CLASS]` (the contract crate's one parse).
pub use sloserve_slo::KeySpec as ApiKeySpec;

/// Whose requests may reuse each other's cached prompt blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrefixCacheScope {
    /// Every request (with the same `cache_salt`).
    Global,
    /// Only requests made with the same API key (and the same `cache_salt`).
    PerKey,
}

#[derive(Args, Debug, Clone)]
pub struct GuardArgs {
    /// API key clients must send (`Authorization: Bearer KEY` or `x-api-key: KEY`);
    /// repeatable. `KEY:batch` limits the key to the batch class. Also from
    /// SLOSERVE_API_KEY (comma-separated). No key: the API is open.
    #[arg(
        long = "api-key",
        env = "SLOSERVE_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<ApiKeySpec>,
    /// `/metrics` also needs a key (`/health` and `/ready` always stay open).
    #[arg(long)]
    pub metrics_require_key: bool,
    /// Believe the gateway's fairness id header (`x-llm-d-inference-fairness-id`):
    /// only when every request comes through a trusted hop (the llm-d gateway,
    /// `sloserve route`) that sets or strips it. Without it a request's flow is its
    /// API key (the key's digest), or none on a keyless server.
    #[arg(long)]
    pub trust_gateway_headers: bool,
    /// Whose requests share cached prompt blocks (default: per-key when keys are
    /// configured, else global).
    #[arg(long, value_enum)]
    pub prefix_cache_scope: Option<PrefixCacheScope>,
    /// Most open connections; past it new connections get 503 except on
    /// `/health` and `/ready` (a small reserve keeps those answering).
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Most requests being handled at once (past it: 503 with Retry-After at once;
    /// `/health`, `/ready` and `/metrics` are not counted).
    #[arg(long, default_value_t = 512)]
    pub max_inflight_requests: usize,
    /// Seconds a client has to send a request's headers (slowloris bound).
    #[arg(long, default_value_t = 10.0)]
    pub header_read_timeout: f64,
    /// Seconds a client has from its headers to the end of its body (408 and the
    /// connection closed past it; a request slot is taken only once the body is in).
    /// The Batch API's upload streams to disk and gets ten times this.
    #[arg(long, default_value_t = 30.0)]
    pub body_read_timeout: f64,
    /// Seconds an idle keep-alive connection stays open.
    #[arg(long, default_value_t = 5.0)]
    pub keep_alive_timeout: f64,
    /// Seconds a generation may take (0: no limit); per request, the header
    /// `x-request-timeout-ms` can shorten it.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds a response may wait with the client accepting no byte of it
    /// (its TCP window stays shut) before the connection is closed and the
    /// request cancelled, its KV blocks freed. The kernel buffers (ours 128 KiB,
    /// the client's receive buffer) fill before this clock starts.
    #[arg(long, default_value_t = 30.0)]
    pub stream_write_timeout: f64,
}

/// Seconds as a `Duration`; 0 or less (or not finite): `None`.
pub fn secs(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s))
}

impl GuardArgs {
    pub fn prefix_cache_scope(&self) -> PrefixCacheScope {
        self.prefix_cache_scope
            .unwrap_or(if self.api_keys.is_empty() {
                PrefixCacheScope::Global
            } else {
                PrefixCacheScope::PerKey
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_specs_parse_and_never_print() {
        let k: ApiKeySpec = "sk-abc:batch".parse().unwrap();
        assert_eq!(
            (k.key.as_str(), k.ceiling),
            ("sk-abc", Some(sloserve_engine::SloClass::Batch))
        );
        let k: ApiKeySpec = "a:b:c".parse().unwrap();
        assert_eq!((k.key.as_str(), k.ceiling), ("a:b:c", None));
        assert!("".parse::<ApiKeySpec>().is_err());
        assert!(":batch".parse::<ApiKeySpec>().is_err());
        let dbg = format!(
            "{:?}",
            "secret-key:interactive".parse::<ApiKeySpec>().unwrap()
        );
        assert!(!dbg.contains("secret"), "{dbg}");
        assert_eq!(secs(0.0), None);
        assert_eq!(secs(1.5), Some(Duration::from_millis(1500)));
    }
}
