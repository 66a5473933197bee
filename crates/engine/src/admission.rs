//! Admission control at `submit`: request validation against the model and KV pool,
//! bounded waiting queues per SLO class, and refusal of interactive requests whose
//! predicted TTFT would break their SLO. Refusals are immediate (`QueueFull` or `TtftUnreachable`, a 429
//! with a retry hint), never a hang.

use crate::config::{AdmissionConfig, EngineConfig};
use crate::error::EngineError;
use crate::request::{Admitted, Request, SloClass, SloTargets};
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

    /// Checks a request's shape (the first violation is the error) and returns
    /// the most tokens it may generate.
    pub fn validate(&self, req: &Request) -> Result<usize, EngineError> {
        let len = req.prompt.len();
        if len == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if len > self.max_prompt_len {
            return Err(EngineError::PromptTooLong {
                len,
                max: self.max_prompt_len,
            });
        }
        let room = self.max_model_len - len;
        let max_tokens = match req.stop.max_tokens {
            Some(0) => return Err(EngineError::ZeroMaxTokens),
            Some(m) if m > room => {
                return Err(EngineError::ContextLengthExceeded {
                    prompt: len,
                    max_tokens: m,
                    max_model_len: self.max_model_len,
                    room,
                })
            }
            Some(m) => m,
            None => room,
        };
        if let Some(&id) = req.prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::TokenOutOfVocab {
                id,
                vocab_size: self.vocab_size,
            });
        }
        for (field, v) in [
            ("ttft_slo_ms", req.ttft_slo_ms),
            ("tpot_slo_ms", req.tpot_slo_ms),
        ] {
            if v.is_some_and(|ms| !ms.is_finite() || ms <= 0.0) {
                return Err(EngineError::InvalidTarget { field });
            }
        }
        Ok(max_tokens)
    }

    /// Everything the engine decides about a request before queueing it: the
    /// checks above, its class and its targets. The one place these are decided.
    pub fn decide(&self, cfg: &EngineConfig, req: &Request) -> Result<Admitted, EngineError> {
        let max_tokens = self.validate(req)?;
        let objective = req.objective.as_ref().and_then(|o| cfg.objectives.get(o));
        let class = match (cfg.slo_classes, req.slo_class.or(objective.copied())) {
            (true, Some(c)) => c,
            _ => cfg.default_slo_class,
        };
        let targets = match class {
            SloClass::Interactive => SloTargets {
                ttft_ms: req.ttft_slo_ms.or(cfg.default_ttft_slo_ms),
                tpot_ms: req.tpot_slo_ms.or(cfg.default_tpot_slo_ms),
            },
            SloClass::Batch => SloTargets::default(),
        };
        Ok(Admitted {
            class,
            targets,
            max_tokens,
        })
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
        if n + 1 > limits.max_waiting_requests
            || tokens + prompt_len > limits.max_waiting_prompt_tokens
        {
            self.rejected[class] += 1;
            return Err(EngineError::QueueFull {
                class,
                retry_after_s: self.retry_after_s(class),
            });
        }
        if let (SloClass::Interactive, Some(slo)) = (class, ttft_slo_ms) {
            if cfg.ttft_reject_factor > 0.0 && self.prefill_rate > 0.0 {
                let ahead = self.waiting_tokens[SloClass::Interactive];
                let predicted_ms = (ahead + prompt_len) as f64 / self.prefill_rate * 1e3;
                if predicted_ms > slo * cfg.ttft_reject_factor {
                    self.rejected[class] += 1;
                    return Err(EngineError::TtftUnreachable {
                        predicted_ms,
                        target_ms: slo,
                        retry_after_s: self.retry_after_s(class),
                    });
                }
            }
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

    /// Forgets every waiting count (the engine restarted with no requests; a
    /// submit still in flight is released later against zero, saturating).
    pub fn clear_waiting(&mut self) {
        self.waiting_requests = PerClass::default();
        self.waiting_tokens = PerClass::default();
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
        assert_eq!(l.validate(&ok), Ok(5));
        let mut fill = ok.clone();
        fill.stop.max_tokens = None;
        assert_eq!(l.validate(&fill), Ok(90), "None: what the context leaves");
        assert_eq!(
            l.validate(&Request::greedy(vec![1; 65], 1)),
            Err(EngineError::PromptTooLong { len: 65, max: 64 })
        );
        for (bad, want) in [
            (Request::greedy(vec![], 5), EngineError::EmptyPrompt),
            (Request::greedy(vec![1; 10], 0), EngineError::ZeroMaxTokens),
            (
                Request::greedy(vec![1; 60], 41),
                EngineError::ContextLengthExceeded {
                    prompt: 60,
                    max_tokens: 41,
                    max_model_len: 100,
                    room: 40,
                },
            ),
            (
                Request::greedy(vec![50], 1),
                EngineError::TokenOutOfVocab {
                    id: 50,
                    vocab_size: 50,
                },
            ),
            (
                Request::greedy(vec![1], 1).with_ttft_slo_ms(0.0),
                EngineError::InvalidTarget {
                    field: "ttft_slo_ms",
                },
            ),
            (
                Request::greedy(vec![1], 1).with_tpot_slo_ms(f64::NAN),
                EngineError::InvalidTarget {
                    field: "tpot_slo_ms",
                },
            ),
        ] {
            assert_eq!(l.validate(&bad), Err(want));
        }
    }

    #[test]
    fn decide_resolves_class_and_targets_once() {
        let l = RequestLimits::new(100, 8, 16, 50);
        let mut cfg = EngineConfig {
            default_ttft_slo_ms: Some(500.0),
            ..EngineConfig::default()
        };
        let r = Request::greedy(vec![1; 4], 3).with_tpot_slo_ms(40.0);
        let a = l.decide(&cfg, &r).unwrap();
        assert_eq!(a.class, SloClass::Interactive);
        assert_eq!(a.targets.ttft_ms, Some(500.0));
        assert_eq!(a.targets.tpot_ms, Some(40.0));
        assert_eq!(a.max_tokens, 3);
        let b = l
            .decide(&cfg, &r.clone().with_class(SloClass::Batch))
            .unwrap();
        assert_eq!(b.class, SloClass::Batch);
        assert_eq!(b.targets, SloTargets::default(), "batch has no targets");
        // The gateway's objective maps to a class; a class named outright wins.
        cfg.objectives.insert("offline".into(), SloClass::Batch);
        let mut o = Request::greedy(vec![1; 4], 3);
        o.objective = Some("offline".into());
        assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Batch);
        o.objective = Some("unknown".into());
        assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Interactive);
        o.objective = Some("offline".into());
        o.slo_class = Some(SloClass::Interactive);
        assert_eq!(l.decide(&cfg, &o).unwrap().class, SloClass::Interactive);
        cfg.slo_classes = false;
        cfg.default_slo_class = SloClass::Batch;
        let c = l
            .decide(&cfg, &r.with_class(SloClass::Interactive))
            .unwrap();
        assert_eq!(c.class, SloClass::Batch, "classes off: the default class");
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
            Err(EngineError::QueueFull {
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
            Err(EngineError::TtftUnreachable { retry_after_s, .. }) => assert_eq!(retry_after_s, 2),
            other => panic!("{other:?}"),
        }
    }
}
