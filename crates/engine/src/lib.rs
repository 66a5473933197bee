//! sloserve's scheduling core: the `ModelRunner` contract, sampling, and (to come)
//! sequences, KV block pool, prefix cache, scheduler and engine loop. No candle here.

pub mod runner;
pub mod sampler;

pub use runner::{Batch, BatchSeq, Logits, ModelRunner, RunnerError, RunnerInfo};
pub use sampler::{SampledToken, Sampler, SamplingParams};
