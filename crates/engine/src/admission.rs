//! Admission control at `submit`: request validation against the model and KV pool,
//! bounded waiting queues per SLO class, and refusal of interactive requests whose
//! predicted TTFT would break their SLO. Refusals are immediate (`QueueFull` or `TtftUnreachable`, a 429
//! with a retry hint), never a hang.

use std::time::Instant;

use crate::config::{AdmissionConfig, EngineConfig};
use crate::departures::Departures;
use crate::error::EngineError;
use crate::request::{Admitted, Request, SloClass, SloTargets};
use crate::scheduler::{QueueExits, Released};
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
/// class, and the engine's measured rates. Lives behind a mutex taken once per
/// submit and once per engine step.
#[derive(Debug, Clone, Default)]
pub(crate) struct AdmissionState {
    pub waiting_requests: PerClass<usize>,
    pub waiting_tokens: PerClass<usize>,
    /// Prefill tokens per second (moving average); 0 until measured.
    pub prefill_rate: f64,
    /// How fast each class's waiting queue drains while it has waiters.
    departures: PerClass<Departures>,
    /// How long the requests that started lately had waited (moving average of
    /// each step's longest wait, seconds): the queue as it is felt.
    felt_wait_s: PerClass<f64>,
    /// Wall time from one step's end to the next (moving average, seconds; it
    /// includes what the engine does between steps); 0 until measured.
    step_s: f64,
    /// When the last step ended; `None` after the engine went idle.
    last_step_end: Option<Instant>,
    pub rejected: PerClass<u64>,
}

const RATE_EMA_ALPHA: f64 = 0.2;
/// Steps with fewer prefill tokens do not update the rate (too noisy).
const MIN_RATE_SAMPLE_TOKENS: usize = 16;
/// Weight of a step's longest start wait in the felt wait.
const FELT_EMA_ALPHA: f64 = 0.5;

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
        let wait_s = self.predicted_wait_s(class);
        // Come back when the class's queue has drained (1 to 60 s).
        let retry_after_s = (wait_s.ceil() as u64).clamp(1, 60);
        if n + 1 > limits.max_waiting_requests
            || tokens + prompt_len > limits.max_waiting_prompt_tokens
        {
            return Err(self.refuse(
                class,
                EngineError::QueueFull {
                    class,
                    retry_after_s,
                },
            ));
        }
        if cfg.max_queue_wait_s > 0.0 && wait_s > cfg.max_queue_wait_s {
            return Err(self.refuse(
                class,
                EngineError::QueueWaitTooLong {
                    class,
                    predicted_s: wait_s,
                    retry_after_s,
                },
            ));
        }
        if let (SloClass::Interactive, Some(slo)) = (class, ttft_slo_ms) {
            if cfg.ttft_reject_factor > 0.0 {
                let own_prefill_s = if self.prefill_rate > 0.0 {
                    prompt_len as f64 / self.prefill_rate
                } else {
                    0.0
                };
                let predicted_ms = (wait_s + own_prefill_s + self.step_s) * 1e3;
                if predicted_ms > slo * cfg.ttft_reject_factor {
                    return Err(self.refuse(
                        class,
                        EngineError::TtftUnreachable {
                            predicted_ms,
                            target_ms: slo,
                            retry_after_s,
                        },
                    ));
                }
            }
        }
        *self.waiting_requests.get_mut(class) += 1;
        *self.waiting_tokens.get_mut(class) += prompt_len;
        Ok(())
    }

    fn refuse(&mut self, class: SloClass, e: EngineError) -> EngineError {
        self.rejected[class] += 1;
        e
    }

    /// Seconds until a new request of `class` would start, the largest of: the
    /// prompt tokens waiting ahead of it at the prefill rate (interactive work
    /// runs first); the requests and prompt tokens waiting ahead of it at its
    /// class's measured departure rates (which reflect what interactive work and
    /// the step budget leave);
    /// and, while requests wait ahead of it, how long those that started lately
    /// had waited.
    pub fn predicted_wait_s(&self, class: SloClass) -> f64 {
        let ahead_tokens = match class {
            SloClass::Interactive => self.waiting_tokens.interactive,
            SloClass::Batch => self.waiting_tokens.interactive + self.waiting_tokens.batch,
        };
        let by_tokens = if self.prefill_rate > 0.0 {
            ahead_tokens as f64 / self.prefill_rate
        } else {
            0.0
        };
        // With `n` ahead the queue is backlogged: this request starts at the
        // (n + 1)-th departure from now, once the prompt tokens ahead of it in
        // its class have gone at the rate they went lately.
        let ahead = self.waiting_requests[class];
        let by_departures = match (ahead, self.departures[class].rates()) {
            (0, _) | (_, None) => 0.0,
            (n, Some((requests, tokens))) => {
                ((n + 1) as f64 / requests).max(self.waiting_tokens[class] as f64 / tokens)
            }
        };
        let felt = if ahead > 0 {
            self.felt_wait_s[class]
        } else {
            0.0
        };
        by_tokens.max(by_departures).max(felt)
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

    /// An engine step of `step_secs` ended at `now`, after which `left`
    /// (requests, prompt tokens) had left each class's waiting queue: feeds the
    /// departure rates of the classes that had waiters and the step time (wall
    /// time since the previous step's end), then releases them.
    pub fn observe_step(&mut self, left: &Released, step_secs: f64, now: Instant) {
        let secs = match self.last_step_end.replace(now) {
            Some(prev) => now.saturating_duration_since(prev).as_secs_f64(),
            None => step_secs,
        };
        for (class, exits) in left.iter() {
            let &QueueExits {
                requests,
                prompt_tokens,
                longest_start_wait_s,
            } = exits;
            if self.waiting_requests[class] > 0 {
                self.departures[class].observe(requests, prompt_tokens, secs);
            }
            if longest_start_wait_s > 0.0 {
                let felt = &mut self.felt_wait_s[class];
                *felt = FELT_EMA_ALPHA * longest_start_wait_s + (1.0 - FELT_EMA_ALPHA) * *felt;
            }
            if requests > 0 {
                self.release(class, requests, prompt_tokens);
            }
        }
        if secs > 0.0 {
            self.step_s = if self.step_s == 0.0 {
                secs
            } else {
                RATE_EMA_ALPHA * secs + (1.0 - RATE_EMA_ALPHA) * self.step_s
            };
        }
    }

    /// The engine has no work and waits for commands: the next step's interval
    /// starts afresh (idle time is not drain time).
    pub fn mark_idle(&mut self) {
        self.last_step_end = None;
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
        cfg.ttft_reject_factor = 1.0;
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
        a.try_admit(&cfg, SloClass::Interactive, 200, Some(1100.0))
            .unwrap(); // 1100 <= 1100
        match a.try_admit(&cfg, SloClass::Interactive, 10, Some(1.0)) {
            Err(EngineError::TtftUnreachable { retry_after_s, .. }) => assert_eq!(retry_after_s, 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn queue_waits_come_from_the_measured_drain_rate() {
        let cfg = AdmissionConfig {
            max_queue_wait_s: 3.0,
            ttft_reject_factor: 1.0,
            ..EngineConfig::default().admission
        };
        let mut a = AdmissionState::default();
        // Unmeasured: only the queue bounds apply.
        for _ in 0..8 {
            a.try_admit(&cfg, SloClass::Batch, 1, None).unwrap();
            a.try_admit(&cfg, SloClass::Interactive, 1, Some(2000.0))
                .unwrap();
        }
        // Both queues drain at 2 requests per second of backlogged engine time.
        let step = PerClass {
            interactive: exits(1, 0.0),
            batch: exits(1, 0.0),
        };
        let open = AdmissionConfig {
            max_queue_wait_s: 0.0,
            ..cfg.clone()
        };
        let t0 = Instant::now();
        let at = |s: f64| t0 + std::time::Duration::from_secs_f64(s);
        for i in 0..4 {
            a.observe_step(&step, 0.5, at(0.5 * (i + 1) as f64));
            a.try_admit(&open, SloClass::Batch, 1, None).unwrap();
            a.try_admit(&open, SloClass::Interactive, 1, Some(60_000.0))
                .unwrap();
        }
        assert_eq!(a.waiting_requests.batch, 8);
        assert!((a.predicted_wait_s(SloClass::Batch) - 4.5).abs() < 1e-9);
        // 8 ahead at 2/s: it starts at the 9th departure, in 4.5 s > 3 s for batch;
        // 4.5 s + a 0.5 s step > 2 s for interactive.
        match a.try_admit(&cfg, SloClass::Batch, 1, None) {
            Err(EngineError::QueueWaitTooLong {
                class: SloClass::Batch,
                predicted_s,
                retry_after_s: 5,
            }) => assert!((predicted_s - 4.5).abs() < 1e-9),
            other => panic!("{other:?}"),
        }
        match a.try_admit(&open, SloClass::Interactive, 1, Some(2000.0)) {
            Err(EngineError::TtftUnreachable { predicted_ms, .. }) => {
                assert!((predicted_ms - 5000.0).abs() < 1e-6, "{predicted_ms}")
            }
            other => panic!("{other:?}"),
        }
        // Drained to 4 waiting: 2.5 s to start, 3 s to the first token.
        a.release(SloClass::Interactive, 4, 4);
        assert!(a
            .try_admit(&cfg, SloClass::Interactive, 1, Some(2900.0))
            .is_err());
        a.try_admit(&cfg, SloClass::Interactive, 1, Some(3100.0))
            .unwrap();
        // A queue that stops draining predicts ever longer waits.
        let none = PerClass::default();
        for i in 0..100 {
            a.observe_step(&none, 0.1, at(2.5 + 0.5 * i as f64));
        }
        assert!(a.predicted_wait_s(SloClass::Batch) > 1000.0);
        assert!(a.try_admit(&cfg, SloClass::Batch, 1, None).is_err());
        // An empty queue is always admitted, whatever the rate.
        a.release(SloClass::Batch, 8, 8);
        a.try_admit(&cfg, SloClass::Batch, 1, None).unwrap();
        assert_eq!(a.rejected.batch, 2);
        // Idle time between steps is not drain time.
        a.mark_idle();
        a.observe_step(&step, 0.5, at(1000.0));
        assert!(a.predicted_wait_s(SloClass::Batch) < 1.0);
    }

    fn exits(requests: usize, longest_start_wait_s: f64) -> QueueExits {
        QueueExits {
            requests,
            prompt_tokens: requests,
            longest_start_wait_s,
        }
    }

    #[test]
    fn long_prompts_ahead_drain_at_the_measured_token_rate() {
        let cfg = EngineConfig::default().admission;
        let mut a = AdmissionState::default();
        let t0 = Instant::now();
        a.try_admit(&cfg, SloClass::Batch, 100, None).unwrap();
        // One request of 100 prompt tokens leaves every 0.5 s: 2/s, 200 tokens/s.
        let left = PerClass {
            interactive: exits(0, 0.0),
            batch: QueueExits {
                requests: 1,
                prompt_tokens: 100,
                longest_start_wait_s: 0.0,
            },
        };
        for i in 0..4 {
            a.observe_step(&left, 0.5, t0 + std::time::Duration::from_millis(500 * i));
            a.try_admit(&cfg, SloClass::Batch, 100, None).unwrap();
        }
        a.try_admit(&cfg, SloClass::Batch, 900, None).unwrap();
        // 2 ahead: the 3rd departure in 1.5 s, but 1000 tokens take 5 s.
        assert!((a.predicted_wait_s(SloClass::Batch) - 5.0).abs() < 1e-9);
    }

    #[test]
    fn the_waits_requests_felt_lately_count_while_others_wait() {
        let cfg = EngineConfig::default().admission;
        let mut a = AdmissionState::default();
        let t0 = Instant::now();
        for _ in 0..2 {
            a.try_admit(&cfg, SloClass::Interactive, 1, None).unwrap();
        }
        // One started after waiting 3 s: felt 1.5 s (a moving average from 0).
        let left = PerClass {
            interactive: exits(1, 3.0),
            batch: exits(0, 0.0),
        };
        a.observe_step(&left, 0.01, t0);
        assert_eq!(a.waiting_requests.interactive, 1);
        assert!((a.predicted_wait_s(SloClass::Interactive) - 1.5).abs() < 1e-9);
        assert!(a
            .try_admit(&cfg, SloClass::Interactive, 1, Some(1000.0))
            .is_err());
        assert_eq!(a.predicted_wait_s(SloClass::Batch), 0.0, "per class");
        // With nobody waiting, a new request starts at once.
        a.release(SloClass::Interactive, 1, 1);
        assert_eq!(a.predicted_wait_s(SloClass::Interactive), 0.0);
        a.try_admit(&cfg, SloClass::Interactive, 1, Some(1000.0))
            .unwrap();
    }
}
