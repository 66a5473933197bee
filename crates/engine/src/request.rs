//! What a client asks the engine for: prompt tokens, sampling, stop conditions and
//! the SLO class with its optional targets.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sampler::SamplingParams;
pub use sloserve_slo::{Asked, SloClass, SloTargets};

/// When generation stops. The first condition met wins; `Length` is also reported
/// when the sequence reaches the model's context length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopConditions {
    /// Most tokens to generate (at least 1); `None`: as many as the context
    /// leaves after the prompt (the engine decides at submit).
    pub max_tokens: Option<usize>,
    /// Tokens that always stop generation (reason `Stop`); the stop token is emitted.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence ids (filled by the caller from the tokenizer);
    /// they stop generation unless `ignore_eos`.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Keep generating through EOS (benchmarks); `stop_token_ids` still apply.
    #[serde(default)]
    pub ignore_eos: bool,
}

impl StopConditions {
    pub fn max_tokens(max_tokens: usize) -> Self {
        StopConditions {
            max_tokens: Some(max_tokens),
            stop_token_ids: Vec::new(),
            eos_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }

    /// Whether `token` ends generation with reason `Stop`.
    #[inline]
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.stop_token_ids.contains(&token)
            || (!self.ignore_eos && self.eos_token_ids.contains(&token))
    }
}

/// One generation request as the engine sees it (token ids, no text).
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    /// The SLO fields it came with (class, objective, targets), read once at the
    /// edge; the engine resolves them against its profile at submit
    /// (`sloserve_slo::resolve`): an interactive request whose predicted TTFT
    /// exceeds its target by `ttft_reject_factor` is refused, and steps carrying its
    /// decodes are sized to its TPOT target (else the relative bound
    /// `max_batch_interference`).
    pub slo: Asked,
    /// Prefix-cache isolation: the request reuses (and adds to) only blocks cached
    /// under the same salt (vLLM's `cache_salt`, mixed with the API key's scope by
    /// the server). 0: the shared cache.
    pub cache_salt: u64,
    /// The client's own deadline for this request, from its arrival (the server's
    /// `x-request-timeout-ms`). A batch request, which is never refused for its
    /// predicted latency, is refused at submit only when it is predicted to start
    /// after this (`DeadlineUnreachable`), and finishes `TimedOut` if it is still
    /// waiting when it passes. `None`: no deadline of its own.
    pub deadline: Option<Duration>,
    /// The flow it is queued fairly in within its class (the gateway's fairness
    /// id, `x-llm-d-inference-fairness-id`, read and bounded by the server):
    /// waiting requests start in start-time fair order across flows, so one flow's
    /// burst does not delay another flow's request behind all of it. `None` (or
    /// empty): the one flow of requests without an id, first come first served.
    pub fairness: Option<String>,
    /// Constrained decoding: a compiled grammar; each sequence gets a fresh matcher.
    pub constraint: Option<crate::sampler::constraint::SharedConstraint>,
    /// Score the prompt: `Some(k)` sends the logprob (and rank) of every prompt
    /// token after the first, with its `k` best alternatives (capped at
    /// `MAX_TOP_LOGPROBS`), as [`crate::Event::PromptLogprobs`] events before the
    /// first generated token. Such a request computes logits for every prompt
    /// position (in chunks of at most [`PROMPT_SCORING_CHUNK`] tokens) and does not
    /// read the prefix cache (a cached prefix has no logits); with it,
    /// `max_tokens` may be 0 (scoring only: no token is sampled, the request
    /// finishes `Length`). `None`: the ordinary path, no extra rows.
    pub prompt_logprobs: Option<usize>,
    /// A pooled request (an embedding, a reranker's score): its prompt is
    /// prefilled and nothing is sampled; the rows `pooling` names pool into one
    /// [`crate::Event::Pooled`] vector before `Finished` (`max_tokens` must be 0).
    /// It reads no cached prefix (a cached prefix has no hidden states, and its
    /// output must not depend on what the cache holds). `None`: generation.
    pub pooling: Option<crate::pooling::Pooling>,
}

/// Most prompt positions of one scoring request (`Request::prompt_logprobs`) per
/// step: bounds its logits rows (this many times the vocabulary, 4 bytes each:
/// 39 MB for a 152k vocabulary).
pub const PROMPT_SCORING_CHUNK: usize = 64;

impl Request {
    /// A greedy request generating at most `max_tokens` tokens, default class.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::greedy(),
            stop: StopConditions::max_tokens(max_tokens),
            slo: Asked::default(),
            cache_salt: 0,
            deadline: None,
            fairness: None,
            constraint: None,
            prompt_logprobs: None,
            pooling: None,
        }
    }

    /// A pooled request (`Request::pooling`) of `prompt`, default class.
    pub fn pooled(prompt: Vec<u32>, pooling: crate::pooling::Pooling) -> Self {
        Request {
            pooling: Some(pooling),
            ..Request::greedy(prompt, 0)
        }
    }

    pub fn with_class(mut self, class: SloClass) -> Self {
        self.slo.class = Some(class);
        self
    }

    pub fn with_ttft_slo_ms(mut self, ms: f64) -> Self {
        self.slo.ttft_ms = Some(ms);
        self
    }

    pub fn with_tpot_slo_ms(mut self, ms: f64) -> Self {
        self.slo.tpot_ms = Some(ms);
        self
    }

    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Scores the prompt with `k` alternatives per position
    /// ([`Request::prompt_logprobs`]).
    pub fn with_prompt_logprobs(mut self, k: usize) -> Self {
        self.prompt_logprobs = Some(k);
        self
    }

    /// Queued fairly in flow `id` (the gateway's fairness id).
    pub fn with_fairness(mut self, id: impl Into<String>) -> Self {
        self.fairness = Some(id.into());
        self
    }
}

/// A flow's key in admission's per-flow counts: a hash of its fairness id
/// (the empty id, requests without one, is one flow too). Two ids that collide
/// share a count, which only makes admission a little less fair to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct FlowKey(u64);

impl FlowKey {
    pub fn of(id: &str) -> Self {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same id maps to the same key in every
        // thread (admission at submit, the scheduler when it leaves the queue).
        let mut h = std::hash::DefaultHasher::new();
        id.hash(&mut h);
        FlowKey(h.finish())
    }
}

/// What the engine decided for an accepted request (returned on its stream).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    /// The class it runs as.
    pub class: SloClass,
    pub targets: SloTargets,
    /// The TTFT target it may be refused or shed for: its own (a profile's
    /// default target is best effort, never a refusal).
    pub refuse_ttft_ms: Option<f64>,
    /// Most tokens it may generate (its `max_tokens`, or what the context leaves).
    pub max_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_class_parses_and_serializes_lowercase() {
        assert_eq!(
            "interactive".parse::<SloClass>().unwrap(),
            SloClass::Interactive
        );
        assert_eq!(" Batch ".parse::<SloClass>().unwrap(), SloClass::Batch);
        assert!("bulk".parse::<SloClass>().is_err());
        #[derive(Deserialize, Serialize)]
        struct W {
            c: SloClass,
        }
        let w: W = toml::from_str("c = \"batch\"").unwrap();
        assert_eq!(w.c, SloClass::Batch);
        assert_eq!(
            toml::to_string(&W {
                c: SloClass::Interactive
            })
            .unwrap()
            .trim(),
            "c = \"interactive\""
        );
    }

    #[test]
    fn stop_tokens_respect_ignore_eos() {
        let mut s = StopConditions::max_tokens(4);
        s.stop_token_ids = vec![7];
        s.eos_token_ids = vec![2];
        assert!(s.is_stop_token(7) && s.is_stop_token(2) && !s.is_stop_token(3));
        s.ignore_eos = true;
        assert!(s.is_stop_token(7) && !s.is_stop_token(2));
    }
}
