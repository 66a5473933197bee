//! Admission control at `submit`: request validation against the model and KV pool,
//! bounded waiting queues per SLO class, and refusal of interactive requests whose
//! predicted TTFT would break their SLO. Refusals are immediate (`Overloaded`, a 429
//! with a retry hint), never a hang.

use crate::config::AdmissionConfig;
use crate::error::EngineError;
use crate::request::{Request, SloClass};
use crate::stats::PerClass;

/// What a request must fit in (fixed at engine start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest sequence (prompt + output).
    pub max_model_len: usize,
    /// Longest prompt: `min(max_model_len - 1, num_kv_blocks * block_size)`.
    pub max_prompt_len: usize,
    pub vocab_size: usize,
}

impl RequestLimits {
    pub fn new(
        max_model_len: usize,
        num_kv_blocks: usize,
        block_size: usize,
        vocab_size: usize,
    ) -> Self {
        RequestLimits {
            max_model_len,
            max_prompt_len: max_model_len
                .saturating_sub(1)
                .min(num_kv_blocks * block_size),
            vocab_size,
        }
    }

    /// Checks a request's shape; the first violation is the error.
    pub fn validate(&self, req: &Request) -> Result<(), EngineError> {
        let len = req.prompt.len();
        if len == 0 {
            return Err(EngineError::InvalidRequest("empty prompt".into()));
        }
        if len > self.max_prompt_len {
            return Err(EngineError::PromptTooLong {
                len,
                max: self.max_prompt_len,
            });
        }
        if req.stop.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if len + req.stop.max_tokens > self.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "prompt ({len} tokens) + max_tokens ({}) exceeds the context length ({})",
                req.stop.max_tokens, self.max_model_len
            )));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {t} out of vocabulary ({})",
                self.vocab_size
            )));
        }
        if let Some(ms) = req.ttft_slo_ms {
            if ms.is_nan() || ms <= 0.0 {
                return Err(EngineError::InvalidRequest(
                    "ttft_slo_ms must be > 0".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Shared admission bookkeeping: requests and prompt tokens waiting to start, per
/// class, and the engine's measured prefill rate. Lives behind a mutex taken once
/// per submit and once per engine step.
#[derive(Debug, Clone, Default)]
pub(crate) struct AdmissionState {
    pub waiting_requests: PerClass<usize>,
    pub waiting_tokens: PerClass<usize>,
    /// Prefill tokens per second (moving average); 0 until measured.
    pub prefill_rate: f64,
    pub rejected: PerClass<u64>,
}

const RATE_EMA_ALPHA: f64 = 0.2;
/// Steps with fewer prefill tokens do not update the rate (too noisy).
const MIN_RATE_SAMPLE_TOKENS: usize = 16;

impl AdmissionState {
    /// Admits a request of `class` with `prompt_len` tokens or refuses it; on
    /// success the request counts as waiting until `release`d.
    pub fn try_admit(
        &mut self,
        cfg: &AdmissionConfig,
        class: SloClass,
        prompt_len: usize,
        ttft_slo_ms: Option<f64>,
    ) -> Result<(), EngineError> {
        let limits = cfg.limits(class);
        let n = *self.waiting_requests.get(class);
        let tokens = *self.waiting_tokens.get(class);
        let mut refuse = n + 1 > limits.max_waiting_requests
            || tokens + prompt_len > limits.max_waiting_prompt_tokens;
        if let (SloClass::Interactive, Some(slo)) = (class, ttft_slo_ms) {
            if cfg.ttft_reject_factor > 0.0 && self.prefill_rate > 0.0 {
                let ahead = *self.waiting_tokens.get(SloClass::Interactive);
                let predicted_ms = (ahead + prompt_len) as f64 / self.prefill_rate * 1e3;
                refuse |= predicted_ms > slo * cfg.ttft_reject_factor;
            }
        }
        if refuse {
            *self.rejected.get_mut(class) += 1;
            return Err(EngineError::Overloaded {
                class,
                retry_after_s: self.retry_after_s(class),
            });
        }
        *self.waiting_requests.get_mut(class) += 1;
        *self.waiting_tokens.get_mut(class) += prompt_len;
        Ok(())
    }

    /// Seconds until the class's waiting prompt tokens are prefilled (1 to 60).
    fn retry_after_s(&self, class: SloClass) -> u64 {
        if self.prefill_rate <= 0.0 {
            return 1;
        }
        let secs = *self.waiting_tokens.get(class) as f64 / self.prefill_rate;
        (secs.ceil() as u64).clamp(1, 60)
    }

    /// `count` requests with `tokens` prompt tokens left the waiting queue.
    pub fn release(&mut self, class: SloClass, count: usize, tokens: usize) {
        let n = self.waiting_requests.get_mut(class);
        *n = n.saturating_sub(count);
        let t = self.waiting_tokens.get_mut(class);
        *t = t.saturating_sub(tokens);
    }

    /// Feeds one step's prefill tokens and duration into the rate estimate.
    pub fn observe_prefill(&mut self, tokens: usize, secs: f64) {
        if tokens < MIN_RATE_SAMPLE_TOKENS || secs <= 0.0 {
            return;
        }
        let sample = tokens as f64 / secs;
        self.prefill_rate = if self.prefill_rate == 0.0 {
            sample
        } else {
            RATE_EMA_ALPHA * sample + (1.0 - RATE_EMA_ALPHA) * self.prefill_rate
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClassLimits, EngineConfig};

    #[test]
    fn validation_errors_are_specific() {
        let l = RequestLimits::new(100, 4, 16, 50);
        assert_eq!(l.max_prompt_len, 64);
        let ok = Request::greedy(vec![1; 10], 5);
        assert!(l.validate(&ok).is_ok());
        assert_eq!(
            l.validate(&Request::greedy(vec![1; 65], 1)),
            Err(EngineError::PromptTooLong { len: 65, max: 64 })
        );
        for bad in [
            Request::greedy(vec![], 5),
            Request::greedy(vec![1; 10], 0),
            Request::greedy(vec![1; 60], 41),
            Request::greedy(vec![50], 1),
            Request::greedy(vec![1], 1).with_ttft_slo_ms(0.0),
        ] {
            assert!(matches!(
                l.validate(&bad),
                Err(EngineError::InvalidRequest(_))
            ));
        }
    }

    #[test]
    fn bounded_queue_and_ttft_refusal() {
        let mut cfg = EngineConfig::default().admission;
        cfg.batch = ClassLimits {
            max_waiting_requests: 2,
            max_waiting_prompt_tokens: 100,
        };
        let mut a = AdmissionState::default();
        a.try_admit(&cfg, SloClass::Batch, 10, None).unwrap();
        a.try_admit(&cfg, SloClass::Batch, 10, None).unwrap();
        assert!(matches!(
            a.try_admit(&cfg, SloClass::Batch, 10, None),
            Err(EngineError::Overloaded {
                class: SloClass::Batch,
                ..
            })
        ));
        a.release(SloClass::Batch, 1, 10);
        assert!(a.try_admit(&cfg, SloClass::Batch, 91, None).is_err()); // 10 + 91 > 100 tokens
        a.try_admit(&cfg, SloClass::Batch, 90, None).unwrap();
        assert_eq!(a.rejected.batch, 2);

        // 1000 tok/s; 900 interactive tokens waiting: +200 => 1.1 s predicted.
        a.observe_prefill(1000, 1.0);
        a.try_admit(&cfg, SloClass::Interactive, 900, None).unwrap();
        assert!(a
            .try_admit(&cfg, SloClass::Interactive, 200, Some(500.0))
            .is_err()); // 1100 > 1000
        a.try_admit(&cfg, SloClass::Interactive, 200, Some(600.0))
            .unwrap(); // 1100 <= 1200
        match a.try_admit(&cfg, SloClass::Interactive, 10, Some(1.0)) {
            Err(EngineError::Overloaded { retry_after_s, .. }) => assert_eq!(retry_after_s, 2),
            other => panic!("{other:?}"),
        }
    }
}
