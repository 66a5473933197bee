//! `EngineCore`: one engine step, synchronously: schedule -> `runner.execute` ->
//! postprocess (sample each logits row with its sequence's sampler, append, cache
//! the newly full blocks, check stop conditions, emit events, free finished
//! sequences). The threaded [`crate::Engine`] drives it; tests drive it directly.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::admission::RequestLimits;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::event::{Event, FinishReason};
use crate::request::{Request, SloClass};
use crate::runner::{Batch, Logits, ModelRunner, RunnerInfo};
use crate::sampler::Sampler;
use crate::scheduler::Scheduler;
use crate::sequence::Sequence;

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StepOutcome {
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    /// Time spent in `runner.execute`.
    pub exec: Duration,
}

pub(crate) struct EngineCore {
    pub sched: Scheduler,
    runner: Box<dyn ModelRunner>,
    batch: Batch,
    logits: Logits,
    /// The runner's info with the engine's effective KV block count and length.
    pub info: RunnerInfo,
    pub limits: RequestLimits,
    clock_offset: Duration,
}

impl EngineCore {
    pub fn new(runner: Box<dyn ModelRunner>, cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let mut info = runner.info().clone();
        if info.block_size == 0 || info.vocab_size == 0 {
            return Err(EngineError::InvalidConfig(
                "runner reports block_size or vocab_size 0".into(),
            ));
        }
        if info.block_size != cfg.block_size {
            tracing::warn!(
                config = cfg.block_size,
                runner = info.block_size,
                "block_size differs from the runner's; using the runner's"
            );
        }
        let mut cfg = cfg;
        cfg.block_size = info.block_size;
        info.num_kv_blocks = info
            .num_kv_blocks
            .min(cfg.num_kv_blocks_for(info.kv_bytes_per_token));
        if info.num_kv_blocks == 0 {
            return Err(EngineError::InvalidConfig(
                "no KV blocks fit the memory budget".into(),
            ));
        }
        if let Some(m) = cfg.max_model_len {
            info.max_model_len = info.max_model_len.min(m);
        }
        if info.max_model_len < 2 {
            return Err(EngineError::InvalidConfig(
                "max_model_len must be at least 2".into(),
            ));
        }
        let limits = RequestLimits::new(
            info.max_model_len,
            info.num_kv_blocks,
            info.block_size,
            info.vocab_size,
        );
        Ok(EngineCore {
            sched: Scheduler::new(cfg, info.num_kv_blocks, info.block_size),
            runner,
            batch: Batch::default(),
            logits: Logits::default(),
            info,
            limits,
            clock_offset: Duration::ZERO,
        })
    }

    pub fn cfg(&self) -> &EngineConfig {
        &self.sched.cfg
    }

    /// The engine's clock.
    pub fn now(&self) -> Instant {
        Instant::now() + self.clock_offset
    }

    /// Moves the engine's clock forward (tests of time-based policy).
    #[cfg(test)]
    pub fn advance_clock(&mut self, d: Duration) {
        self.clock_offset += d;
    }

    /// The class a request runs as.
    pub fn resolve_class(cfg: &EngineConfig, req: &Request) -> SloClass {
        match (cfg.slo_classes, req.slo_class) {
            (true, Some(c)) => c,
            _ => cfg.default_slo_class,
        }
    }

    /// Builds the sequence of a validated request.
    pub fn make_sequence(
        &self,
        id: u64,
        req: Request,
        tx: UnboundedSender<Event>,
        arrival: Instant,
    ) -> Sequence {
        let cfg = self.cfg();
        let class = Self::resolve_class(cfg, &req);
        let max_len = (req.prompt.len() + req.stop.max_tokens).min(self.info.max_model_len);
        let sampler = Sampler::new(req.sampling, self.info.vocab_size);
        let blocks = self.sched.pool.new_table();
        Sequence::new(
            id, class, req.prompt, sampler, req.stop, max_len, tx, arrival, blocks,
        )
    }

    pub fn add(&mut self, seq: Sequence) {
        self.sched.add(seq);
    }

    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    /// Runs one step (nothing if no sequence can run).
    pub fn step(&mut self) -> StepOutcome {
        let now = self.now();
        self.sched.schedule(now, &mut self.batch);
        let mut out = StepOutcome::default();
        if self.batch.is_empty() {
            return out;
        }
        self.sched.counters.steps += 1;
        let t0 = Instant::now();
        let res = self.runner.execute(&self.batch, &mut self.logits);
        out.exec = t0.elapsed();
        let t = self.now();
        let res = res.map_err(|e| e.0).and_then(|()| {
            let want = self.batch.num_logit_rows();
            if self.logits.vocab_size != self.info.vocab_size || self.logits.num_rows() != want {
                Err(format!(
                    "runner returned {} logits rows of {} (expected {want} of {})",
                    self.logits.num_rows(),
                    self.logits.vocab_size,
                    self.info.vocab_size
                ))
            } else {
                Ok(())
            }
        });
        match res {
            Ok(()) => self.postprocess(t, &mut out),
            Err(msg) => {
                tracing::error!(error = %msg, "model runner failed; failing the batch");
                for &i in &self.sched.step_seqs {
                    let s = &mut self.sched.running[i];
                    s.reset_kv();
                    s.finish = Some(FinishReason::Error(msg.clone()));
                }
            }
        }
        self.sched.reap_finished(t);
        out
    }

    fn postprocess(&mut self, t: Instant, out: &mut StepOutcome) {
        let sched = &mut self.sched;
        let block_size = sched.pool.block_size();
        let mut row = 0;
        for (k, &i) in sched.step_seqs.iter().enumerate() {
            let entry = self.batch.seqs[k];
            let s = &mut sched.running[i];
            if s.is_decoding() {
                out.decode_tokens += 1;
            } else {
                out.prefill_tokens += entry.num_tokens;
            }
            s.num_computed += entry.num_tokens;
            s.scheduled = 0;
            if let Some(cache) = &mut sched.cache {
                let full = s.num_computed / block_size;
                if full > s.num_cache_inserted {
                    cache.insert(&s.tokens[..s.num_computed], &mut s.blocks);
                    s.num_cache_inserted = full;
                }
            }
            if !entry.want_logits {
                continue;
            }
            let sampled = s.sampler.sample(self.logits.row(row));
            row += 1;
            let id = sampled.id;
            s.tokens.push(id);
            s.timings.on_token(t);
            sched.counters.generation_tokens += 1;
            let ev = Event::Token {
                id,
                logprob: s.want_logprobs.then_some(sampled.logprob),
                top_logprobs: sampled.top_logprobs,
                time: t,
            };
            if s.tx.send(ev).is_err() {
                s.finish = Some(FinishReason::Cancelled);
            } else if s.stop.is_stop_token(id) {
                s.finish = Some(FinishReason::Stop);
            } else if s.num_generated() >= s.stop.max_tokens || s.tokens.len() >= s.max_len {
                s.finish = Some(FinishReason::Length);
            }
        }
        sched.counters.prefill_tokens += out.prefill_tokens as u64;
    }

    /// Finishes request `id` now with `reason` (its `Finished` is sent at once);
    /// nothing if it already finished.
    pub fn cancel(&mut self, id: u64, reason: FinishReason) {
        let now = self.now();
        self.sched.cancel(id, reason, now);
    }

    /// Finishes every request with `reason` (engine failure or forced stop).
    pub fn fail_all(&mut self, reason: FinishReason) {
        let now = self.now();
        for s in &mut self.sched.running {
            s.finish = Some(reason.clone());
        }
        self.sched.reap_finished(now);
        for q in &mut self.sched.waiting {
            for mut s in q.drain(..) {
                s.send_finished(reason.clone(), now);
            }
        }
    }
}
