//! sloserve's scheduling core: the `ModelRunner` contract, sampling, and the engine
//! that decides step by step which tokens of which requests run: continuous
//! batching with chunked prefill, a paged KV block pool, a radix prefix cache, and
//! SLO classes (interactive / batch) with priority preemption. No candle here.
//!
//! Entry points: [`Engine::start`] -> [`EngineHandle`]; [`EngineHandle::submit`] a
//! [`Request`] -> [`RequestStream`] of [`Event`]s; [`EngineConfig`] / [`Profile`].

pub mod runner;
pub mod sampler;

pub mod admission;
pub mod block_pool;
mod budget;
mod cached_index;
pub mod config;
mod core;
mod departures;
pub mod disk_tier;
pub mod engine;
pub mod error;
pub mod event;
pub mod knobs;
pub mod pooling;
pub mod prefix_cache;
pub mod profile;
pub mod request;
mod scheduler;
mod sequence;
pub mod speculate;
pub mod stats;
pub mod step_cost;
pub mod supervisor;
pub mod thread_priority;

#[cfg(any(test, feature = "mock"))]
pub mod mock;

#[cfg(test)]
mod tests;

pub use runner::{Batch, BatchSeq, Logits, ModelRunner, RunnerError, RunnerInfo};
pub use sampler::{SampledToken, Sampler, SamplingParams};

pub use admission::RequestLimits;
pub use block_pool::{BlockPool, BlockTable};
pub use config::{AdmissionConfig, ClassLimits, EngineConfig, KvCacheType, StepBudgetPolicy};
pub use engine::{Engine, EngineHandle, Reserved};
pub use error::EngineError;
pub use event::{
    Completion, Event, FinishInfo, FinishReason, PromptLogprob, RequestStream, RequestTimings,
    SloReport,
};
pub use pooling::Pooling;
pub use prefix_cache::PrefixCache;
pub use profile::{Profile, BUILTIN_PROFILES};
pub use request::{
    Admitted, Asked, Request, SloClass, SloTargets, StopConditions, PROMPT_SCORING_CHUNK,
};
pub use stats::{
    Counters, DiskCounters, EngineStats, ForcedCounters, PerClass, SloAttainment, SpecCounters,
};
pub use step_cost::{ExpertRouting, StepCostFigures, StepCostModel, StepShape};
