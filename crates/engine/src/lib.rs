//! sloserve's scheduling core: the `ModelRunner` contract, sampling, and the engine's
//! building blocks: requests and events, the paged KV block pool, the radix prefix
//! cache, configuration and profiles, admission control and stats. No candle here.

pub mod runner;
pub mod sampler;

pub mod admission;
pub mod block_pool;
pub mod config;
pub mod error;
pub mod event;
pub mod prefix_cache;
pub mod profile;
pub mod request;
pub mod stats;

pub use runner::{Batch, BatchSeq, Logits, ModelRunner, RunnerError, RunnerInfo};
pub use sampler::{SampledToken, Sampler, SamplingParams};

pub use admission::RequestLimits;
pub use block_pool::{BlockPool, BlockTable};
pub use config::{AdmissionConfig, ClassLimits, EngineConfig};
pub use error::EngineError;
pub use event::{Completion, Event, FinishInfo, FinishReason, RequestStream, RequestTimings};
pub use prefix_cache::PrefixCache;
pub use profile::{Profile, BUILTIN_PROFILES};
pub use request::{Request, SloClass, StopConditions};
pub use stats::{Counters, EngineStats, PerClass};
