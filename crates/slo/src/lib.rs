//! The SLO contract of one request: its class ([`SloClass`]), its latency targets
//! ([`SloTargets`]), the request headers that carry them ([`headers`]), what a request
//! asked for ([`Asked`]) and the one rule that decides what it runs under
//! ([`resolve`]: body > header > objective > profile default, capped by the key's
//! ceiling). Server, engine, router, batch and bench all use this crate; it
//! depends on nothing of theirs.

mod asked;
mod class;
mod error;
pub mod headers;
mod key;
mod resolve;

pub use asked::{check_target_ms, Asked};
pub use class::SloClass;
pub use error::SloError;
pub use key::{cache_scope_salt, key_digest, match_key, presented_key, KeySpec};
pub use resolve::{resolve, Policy, SloTargets};
