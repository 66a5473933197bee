//! Admission control at `submit`: request validation against the model and KV pool,
//! bounded waiting queues per SLO class, refusal of interactive requests whose
//! predicted wait or TTFT would break their SLO, and of batch requests only past
//! their queue bound or their own deadline (batch work queues, never refused for
//! latency). Refusals are immediate (a 429 with a retry hint), never a hang.

use std::collections::HashMap;
use std::time::Instant;

use crate::config::{AdmissionConfig, EngineConfig};
use crate::departures::Departures;
use crate::error::EngineError;
use crate::request::{Admitted, FlowKey, Request, SloClass};
use crate::scheduler::{QueueExits, Released};
use crate::stats::PerClass;
use crate::step_cost::StepCostModel;

/// What a request must fit in (fixed at engine start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest sequence (prompt + output).
    pub max_model_len: usize,
    /// Longest prompt: `min(max_model_len - 1, num_kv_blocks * block_size)`.
    pub max_prompt_len: usize,
    pub vocab_size: usize,
    /// Only pooled requests run (an encoder: `RunnerInfo::encoder`).
    pub pooled_only: bool,
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
            pooled_only: false,
        }
    }

    /// An encoder's limits: pooled requests only, each prompt whole in one step,
    /// so at most `max_prompt_len` tokens (the context, the KV pool and the step's
    /// token budget, whichever is least: no token is generated after it).
    pub fn encoder(self, max_prompt_len: usize) -> Self {
        RequestLimits {
            max_prompt_len,
            pooled_only: true,
            ..self
        }
    }

    /// Checks a request's shape (the first violation is the error) and returns
    /// the most tokens it may generate.
    pub fn validate(&self, req: &Request) -> Result<usize, EngineError> {
        let len = req.prompt.len();
        if self.pooled_only && req.pooling.is_none() {
            return Err(EngineError::PooledOnly);
        }
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
            // A pooled request generates nothing, whatever it asked.
            _ if req.pooling.is_some() => 0,
            Some(0) if req.prompt_logprobs.is_some() => 0,
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
        req.slo
            .validate()
            .map_err(|e| EngineError::InvalidTarget { field: e.param() })?;
        Ok(max_tokens)
    }

    /// Everything the engine decides about a request before queueing it: the
    /// checks above, its class and its targets. The one place these are decided.
    pub fn decide(&self, cfg: &EngineConfig, req: &Request) -> Result<Admitted, EngineError> {
        let max_tokens = self.validate(req)?;
        let (class, targets) = sloserve_slo::resolve(&req.slo, &cfg.slo_policy());
        // Only a target the request set itself may refuse or shed it: a profile's
        // default target is a goal the scheduler works toward, best effort.
        let refuse_ttft_ms = targets.ttft_ms.filter(|_| req.slo.ttft_ms.is_some());
        Ok(Admitted {
            class,
            targets,
            refuse_ttft_ms,
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
    /// Waiting requests per flow (only flows with some): the queue starts them
    /// in fair order across flows, so a request's wait depends on its own
    /// flow's backlog, not on the class's whole queue.
    flows: PerClass<HashMap<FlowKey, usize>>,
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
    /// The scheduler's step-time model as of the last step, and its prefill chunk
    /// (0: not seen yet): a long prompt's own prefill, chunk by chunk.
    cost: StepCostModel,
    prefill_chunk: usize,
    /// Whether a new request of the class found no free sequence slot after the
    /// last step (interactive: every slot held by interactive work; batch: every
    /// slot held): it waits for a departure even with no request queued ahead.
    slots_full: PerClass<bool>,
    pub rejected: PerClass<u64>,
}

const RATE_EMA_ALPHA: f64 = 0.2;
/// Steps with fewer prefill tokens do not update the rate (too noisy).
const MIN_RATE_SAMPLE_TOKENS: usize = 16;
/// Weight of a step's longest start wait in the felt wait.
const FELT_EMA_ALPHA: f64 = 0.5;
/// Steps the step-time model must have seen before its prefill prediction
/// replaces the measured rate (its prior is deliberately slow).
const MIN_MODEL_STEPS: u64 = 32;
/// ... and predicts steps within this mean relative error (a model that does not
/// fit the machine yet leaves the forecast to the measured rate).
const MAX_MODEL_ERROR: f64 = 0.5;

impl AdmissionState {
    /// Admits a request of `class` with `prompt_len` tokens or refuses it; on
    /// success the request counts as waiting until `release`d. Both classes are
    /// bounded by their queue limits (`QueueFull`). An interactive request is
    /// also refused for its predicted wait (`max_queue_wait_s`) and TTFT
    /// (`ttft_slo_ms` times `ttft_reject_factor`); a batch request never is, it
    /// queues, unless it carries its own `deadline_s` and is predicted to start
    /// after it (`DeadlineUnreachable`).
    #[cfg(test)]
    pub fn try_admit(
        &mut self,
        cfg: &AdmissionConfig,
        class: SloClass,
        prompt_len: usize,
        ttft_slo_ms: Option<f64>,
        deadline_s: Option<f64>,
    ) -> Result<(), EngineError> {
        let flow = FlowKey::of("");
        self.try_admit_choices(cfg, class, flow, prompt_len, 0, 1, ttft_slo_ms, deadline_s)
    }

    /// [`Self::try_admit`] for `count` choices of one request (all admitted or
    /// none: the queue bounds count every choice) whose prompt's first `cached`
    /// tokens the prefix cache holds: its own prefill in the TTFT prediction is
    /// the uncached rest (the queue bounds still count the whole prompt). Its
    /// predicted wait is its place in the fair order of `flow`: what its own
    /// flow has waiting and, of every other flow, as many as its own plus
    /// `count` (the queue bounds are the class's, whatever the flow).
    #[allow(clippy::too_many_arguments)]
    pub fn try_admit_choices(
        &mut self,
        cfg: &AdmissionConfig,
        class: SloClass,
        flow: FlowKey,
        prompt_len: usize,
        cached: usize,
        count: usize,
        ttft_slo_ms: Option<f64>,
        deadline_s: Option<f64>,
    ) -> Result<(), EngineError> {
        let count = count.max(1);
        let limits = cfg.limits(class);
        let n = *self.waiting_requests.get(class);
        let tokens = *self.waiting_tokens.get(class);
        let wait_s = self.wait_s(class, self.ahead_of(class, flow, count));
        // Come back when the class's queue has drained (1 to 60 s).
        let retry_after_s = (wait_s.ceil() as u64).clamp(1, 60);
        if n + count > limits.max_waiting_requests
            || tokens + prompt_len * count > limits.max_waiting_prompt_tokens
        {
            return Err(self.refuse(
                class,
                EngineError::QueueFull {
                    class,
                    retry_after_s,
                },
            ));
        }
        let refusal = match class {
            SloClass::Interactive => {
                let uncached = prompt_len.saturating_sub(cached).max(1);
                self.interactive_refusal(cfg, cached, uncached, ttft_slo_ms, wait_s, retry_after_s)
            }
            SloClass::Batch => {
                deadline_s
                    .filter(|&d| wait_s > d)
                    .map(|d| EngineError::DeadlineUnreachable {
                        class,
                        predicted_s: wait_s,
                        deadline_s: d,
                        retry_after_s,
                    })
            }
        };
        if let Some(e) = refusal {
            return Err(self.refuse(class, e));
        }
        *self.waiting_requests.get_mut(class) += count;
        *self.waiting_tokens.get_mut(class) += prompt_len * count;
        *self.flows[class].entry(flow).or_default() += count;
        Ok(())
    }

    /// Waiting requests of `class` that start before the last of `count` new
    /// ones of `flow` in start-time fair order (`scheduler::fair`): its own
    /// flow's `own` and `count - 1` siblings, and at most `own + count` of each
    /// other flow (their tags up to its own).
    fn ahead_of(&self, class: SloClass, flow: FlowKey, count: usize) -> usize {
        let flows = &self.flows[class];
        let own = flows.get(&flow).copied().unwrap_or(0);
        let depth = own + count;
        let others: usize = flows
            .iter()
            .filter(|&(&k, _)| k != flow)
            .map(|(_, &n)| n.min(depth))
            .sum();
        // Counts released before they were recorded (an engine restart) can
        // leave the per-flow sum above the class's; the class's bounds it.
        (own + count - 1 + others).min(self.waiting_requests[class] + count - 1)
    }

    /// Why an interactive request predicted to wait `wait_s` would be refused
    /// for its latency, if it would: its wait past `max_queue_wait_s`, or its
    /// predicted TTFT (the wait, its own prefill of `prefill_tokens` after `cached`
    /// ones and one step) past its target times `ttft_reject_factor`.
    #[allow(clippy::too_many_arguments)]
    fn interactive_refusal(
        &self,
        cfg: &AdmissionConfig,
        cached: usize,
        prefill_tokens: usize,
        ttft_slo_ms: Option<f64>,
        wait_s: f64,
        retry_after_s: u64,
    ) -> Option<EngineError> {
        if cfg.max_queue_wait_s > 0.0 && wait_s > cfg.max_queue_wait_s {
            return Some(EngineError::QueueWaitTooLong {
                class: SloClass::Interactive,
                predicted_s: wait_s,
                retry_after_s,
            });
        }
        let slo = ttft_slo_ms.filter(|_| cfg.ttft_reject_factor > 0.0)?;
        let own_prefill_s = self.own_prefill_s(cached, prefill_tokens);
        let predicted_ms = (wait_s + own_prefill_s + self.step_s) * 1e3;
        (predicted_ms > slo * cfg.ttft_reject_factor).then_some(EngineError::TtftUnreachable {
            predicted_ms,
            target_ms: slo,
            retry_after_s,
        })
    }

    /// Seconds to prefill `n` uncached prompt tokens after `cached` ones: the
    /// step-time model's chunk-by-chunk prediction once it has seen
    /// `MIN_MODEL_STEPS` steps and predicts them within `MAX_MODEL_ERROR` (it knows attention's growth with the context, which
    /// a rate measured on short prompts misses: an 8k prompt's later chunks cost
    /// more per token), else the measured prefill rate.
    pub fn own_prefill_s(&self, cached: usize, n: usize) -> f64 {
        let model = self.cost.figures();
        if self.prefill_chunk > 0
            && model.steps_observed >= MIN_MODEL_STEPS
            && model.mean_abs_rel_error < MAX_MODEL_ERROR
        {
            self.cost.predict_prefill_s(cached, n, self.prefill_chunk)
        } else if self.prefill_rate > 0.0 {
            n as f64 / self.prefill_rate
        } else {
            0.0
        }
    }

    /// The sequences running per class after a step, of `max_num_seqs` slots.
    pub fn observe_slots(&mut self, running: &PerClass<usize>, max_num_seqs: usize) {
        self.slots_full = PerClass {
            interactive: running.interactive >= max_num_seqs,
            batch: running.interactive + running.batch >= max_num_seqs,
        };
    }

    /// The scheduler's step-time model after a step, and its prefill chunk.
    pub fn observe_cost_model(&mut self, model: &StepCostModel, prefill_chunk: usize) {
        self.cost.clone_from(model);
        self.prefill_chunk = prefill_chunk;
    }

    fn refuse(&mut self, class: SloClass, e: EngineError) -> EngineError {
        self.rejected[class] += 1;
        e
    }

    /// Seconds until a new request of `class` behind the whole waiting queue
    /// would start (a flow's own request may start sooner: [`Self::wait_s`]).
    pub fn predicted_wait_s(&self, class: SloClass) -> f64 {
        self.wait_s(class, self.waiting_requests[class])
    }

    /// Seconds until a new request of `class` with `ahead` of its class's
    /// waiting requests before it would start, the largest of: the prompt
    /// tokens waiting ahead of it at the prefill rate (interactive work runs
    /// first; of its own class, the share `ahead` is of the queue); the requests
    /// and prompt tokens ahead of it at its class's measured departure rates
    /// (which reflect what interactive work and the step budget leave); and,
    /// while requests wait ahead of it or every slot it could take is held, how
    /// long those that started lately had waited, scaled by its place in the
    /// queue (the queue's last waited that).
    fn wait_s(&self, class: SloClass, ahead: usize) -> f64 {
        let queued = self.waiting_requests[class];
        let share = if queued == 0 {
            0.0
        } else {
            (ahead.min(queued) as f64 / queued as f64).min(1.0)
        };
        let own_tokens = self.waiting_tokens[class] as f64 * share;
        let ahead_tokens = match class {
            SloClass::Interactive => own_tokens,
            SloClass::Batch => self.waiting_tokens.interactive as f64 + own_tokens,
        };
        let by_tokens = if self.prefill_rate > 0.0 {
            ahead_tokens / self.prefill_rate
        } else {
            0.0
        };
        // With `n` ahead the queue is backlogged: this request starts at the
        // (n + 1)-th departure from now, once the prompt tokens ahead of it in
        // its class have gone at the rate they went lately.
        let by_departures = match (ahead, self.departures[class].rates()) {
            (0, _) | (_, None) => 0.0,
            (n, Some((requests, tokens))) => ((n + 1) as f64 / requests).max(own_tokens / tokens),
        };
        let felt = if ahead > 0 || self.slots_full[class] {
            self.felt_wait_s[class] * ((ahead + 1) as f64 / (queued + 1) as f64).min(1.0)
        } else {
            0.0
        };
        by_tokens.max(by_departures).max(felt)
    }

    /// `count` requests of `flow` with `tokens` prompt tokens left the waiting
    /// queue (or were never queued).
    pub fn release(&mut self, class: SloClass, flow: FlowKey, count: usize, tokens: usize) {
        self.release_counts(class, count, tokens);
        self.release_flow(class, flow, count);
    }

    fn release_counts(&mut self, class: SloClass, count: usize, tokens: usize) {
        let n = self.waiting_requests.get_mut(class);
        *n = n.saturating_sub(count);
        let t = self.waiting_tokens.get_mut(class);
        *t = t.saturating_sub(tokens);
    }

    fn release_flow(&mut self, class: SloClass, flow: FlowKey, count: usize) {
        let flows = &mut self.flows[class];
        if let Some(n) = flows.get_mut(&flow) {
            *n = n.saturating_sub(count);
            if *n == 0 {
                flows.remove(&flow);
            }
        }
    }

    /// Forgets every waiting count (the engine restarted with no requests; a
    /// submit still in flight is released later against zero, saturating).
    pub fn clear_waiting(&mut self) {
        self.waiting_requests = PerClass::default();
        self.waiting_tokens = PerClass::default();
        self.flows = PerClass::default();
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
                ..
            } = exits;
            if self.waiting_requests[class] > 0 {
                self.departures[class].observe(requests, prompt_tokens, secs);
            }
            if longest_start_wait_s > 0.0 {
                let felt = &mut self.felt_wait_s[class];
                *felt = FELT_EMA_ALPHA * longest_start_wait_s + (1.0 - FELT_EMA_ALPHA) * *felt;
            }
            if requests > 0 {
                self.release_counts(class, requests, prompt_tokens);
                for &flow in &exits.flows {
                    self.release_flow(class, flow, 1);
                }
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
#[path = "admission_tests.rs"]
mod tests;
