//! OpenAI's Batch API for sloserve: `/v1/files` and `/v1/batches` kept in SQLite,
//! each batch's lines run through the server's own endpoints in the `batch` SLO
//! class, exactly once across restarts; plus `sloserve batch` (offline runs and a
//! client for any server with the Batch API).

pub mod cli;
pub mod client;
pub mod error;
pub mod http;
mod job;
pub mod line;
pub mod metrics;
pub mod offline;
pub mod owner;
pub mod reader;
mod schema;
pub mod service;
pub mod store;
pub mod types;
pub mod validate;

pub use error::Error;
pub use line::{Dispatch, Reply};
pub use owner::Owner;
pub use service::{BatchConfig, BatchService};

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
