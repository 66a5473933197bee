//! Token sampling for one sequence: greedy, temperature, top-k, top-p, min-p, seed,
//! presence/frequency penalties, and the top-N logprobs of each sampled token.
//! (Interface stub: to be implemented.)

use serde::{Deserialize, Serialize};

/// Sampling parameters of one request (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: usize,
    /// 1.0 means disabled.
    pub top_p: f32,
    /// 0.0 means disabled.
    pub min_p: f32,
    /// Same seed (and same logits) => same tokens.
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Return the top-N logprobs of each sampled token (None: no logprobs at all;
    /// Some(0): only the sampled token's own logprob).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// One sampled token with its logprob (log-softmax of the raw logits) and, when
/// asked, the most likely alternatives (id, logprob), best first.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Per-sequence sampler state: the RNG and the output token counts for penalties.
pub struct Sampler {
    params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab_size: usize) -> Self {
        let _ = vocab_size;
        Sampler { params }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Samples the next token from one logits row. `logits` is not modified.
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        let _ = logits;
        todo!("sampler")
    }

    /// Records a generated token (for presence/frequency penalties). `sample` calls
    /// this itself; the engine calls it when it replays tokens after preemption.
    pub fn observe(&mut self, token: u32) {
        let _ = token;
    }
}
