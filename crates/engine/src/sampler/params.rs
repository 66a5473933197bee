//! A request's sampling parameters (the one place each sampling field and its
//! default is decided) and the sampled token with its logprobs.

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
    /// vLLM's / Hugging Face's: the logits of tokens seen in the prompt or the
    /// output are divided by it (multiplied when negative); 1.0 means disabled.
    #[serde(default = "no_repetition_penalty")]
    pub repetition_penalty: f32,
    /// OpenAI's `logit_bias`: (token, bias) added to the raw logit before
    /// penalties; -100 all but bans a token, +100 all but forces it.
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
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
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

fn no_repetition_penalty() -> f32 {
    1.0
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
