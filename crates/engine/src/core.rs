//! `EngineCore`: one engine step, synchronously: schedule -> `runner.execute` ->
//! postprocess (the scheduler samples, appends, caches, checks stops, emits events
//! and frees finished sequences). The threaded [`crate::Engine`] drives it; tests
//! drive it directly.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::admission::RequestLimits;
use crate::config::EngineConfig;
use crate::disk_tier::DiskTier;
use crate::error::EngineError;
use crate::event::{Event, FinishReason};
use crate::prefix_cache::CacheChange;
use crate::request::{Admitted, Request};
use crate::runner::{Batch, Logits, ModelRunner, RunnerInfo};
use crate::sampler::Sampler;
use crate::scheduler::{Released, Scheduler};
use crate::sequence::Sequence;
use crate::stats::EngineStats;

pub(crate) use crate::scheduler::StepOutcome;

/// What one call to [`EngineCore::step`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepReport {
    pub outcome: StepOutcome,
    /// Requests that left the waiting queue (for admission control).
    pub released: Released,
}

pub(crate) struct EngineCore {
    sched: Scheduler,
    runner: Box<dyn ModelRunner>,
    batch: Batch,
    logits: Logits,
    /// The runner's info with the engine's effective KV block count and length.
    pub info: RunnerInfo,
    pub limits: RequestLimits,
    clock_offset: Duration,
    /// Tests: a synthetic step cost (seconds for a step's shape) that replaces the
    /// measured time and moves the engine's clock.
    #[cfg(test)]
    synthetic_cost: Option<fn(&crate::step_cost::StepShape) -> f64>,
}

impl EngineCore {
    pub fn new(runner: Box<dyn ModelRunner>, cfg: EngineConfig) -> Result<Self, EngineError> {
        Self::build(runner, cfg, None)
    }

    /// `new`, with the disk tier of a core it replaces (`None`: opened from the
    /// configuration).
    fn build(
        runner: Box<dyn ModelRunner>,
        cfg: EngineConfig,
        carried_disk: Option<Option<DiskTier>>,
    ) -> Result<Self, EngineError> {
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
        let mut limits = RequestLimits::new(
            info.max_model_len,
            info.num_kv_blocks,
            info.block_size,
            info.vocab_size,
        );
        if info.encoder {
            let longest = (info.max_model_len)
                .min(info.num_kv_blocks * info.block_size)
                .min(cfg.max_num_batched_tokens);
            limits = limits.encoder(longest);
        }
        let disk = match carried_disk {
            Some(d) => d,
            None => open_disk(&cfg, &*runner)?,
        };
        Ok(EngineCore {
            sched: Scheduler::new(cfg, &info).with_disk(disk),
            runner,
            batch: Batch::default(),
            logits: Logits::default(),
            info,
            limits,
            clock_offset: Duration::ZERO,
            #[cfg(test)]
            synthetic_cost: None,
        })
    }

    pub fn cfg(&self) -> &EngineConfig {
        self.sched.cfg()
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

    /// Makes every step cost `f(shape)` seconds on the engine's clock (tests of
    /// time-based policy with a mock cost).
    #[cfg(test)]
    pub fn set_synthetic_cost(&mut self, f: fn(&crate::step_cost::StepShape) -> f64) {
        self.synthetic_cost = Some(f);
    }

    /// Tests with a synthetic cost: the step's seconds, moving the engine's clock
    /// by them (before the step's tokens are stamped). `None`: measure the step.
    fn synthetic_step_secs(&mut self) -> Option<f64> {
        #[cfg(test)]
        if let Some(f) = self.synthetic_cost {
            let secs = f(self.sched.planned_shape());
            self.clock_offset += Duration::from_secs_f64(secs);
            return Some(secs);
        }
        None
    }

    /// The scheduler's step-time model (admission forecasts a prompt's prefill
    /// with it).
    pub fn cost_model(&self) -> &crate::step_cost::StepCostModel {
        self.sched.cost_model()
    }

    /// The scheduler, for the engine's scenario tests.
    #[cfg(test)]
    pub fn sched(&self) -> &Scheduler {
        &self.sched
    }
    #[cfg(test)]
    pub fn sched_mut(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// Builds the sequence of a request as `submit` decided it.
    pub fn make_sequence(
        &self,
        id: u64,
        req: Request,
        admitted: Admitted,
        tx: UnboundedSender<Event>,
        arrival: Instant,
    ) -> Sequence {
        let mut stop = req.stop;
        stop.max_tokens = Some(admitted.max_tokens);
        let max_len = (req.prompt.len() + admitted.max_tokens).min(self.info.max_model_len);
        let sampler = Sampler::new(req.sampling, self.info.vocab_size)
            .with_prompt(&req.prompt)
            .with_constraint(req.constraint.map(|c| c.matcher()));
        let (salt, deadline, flow) = (req.cache_salt, req.deadline, req.fairness);
        let (scoring, pooling) = (req.prompt_logprobs, req.pooling);
        Sequence::new(
            id,
            admitted.class,
            admitted.targets,
            req.prompt,
            sampler,
            stop,
            max_len,
            tx,
            arrival,
            self.sched.new_block_table(),
        )
        .with_cache_salt(salt)
        .with_deadline(deadline)
        .with_refuse_ttft_ms(admitted.refuse_ttft_ms)
        .with_flow(flow)
        .with_prompt_scoring(scoring)
        .with_pooling(pooling)
    }

    pub fn add(&mut self, seq: Sequence) {
        self.sched.add(seq);
    }

    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    /// Runs one step (nothing if no sequence can run).
    pub fn step(&mut self) -> StepReport {
        let now = self.now();
        self.sched.schedule(now, &mut self.batch);
        if let Some(disk) = self.sched.disk_mut() {
            // Blocks read back from disk at admission, before any step reads them.
            let runner = &mut self.runner;
            if let Err(e) = disk.apply_loads(|b, data| runner.write_kv_block(b, data)) {
                panic!("writing a KV block read back from disk failed: {e}");
            }
        }
        let mut report = StepReport::default();
        if !self.batch.is_empty() {
            let t0 = Instant::now();
            let res = self.runner.execute(&self.batch, &mut self.logits);
            let synthetic = self.synthetic_step_secs();
            let t = self.now();
            let res = res.map_err(|e| e.0).and_then(|()| {
                let want = self.batch.num_logit_rows();
                let hidden = self.batch.num_hidden_rows();
                if hidden != self.logits.num_hidden_rows() {
                    Err(format!(
                        "runner returned {} hidden rows (expected {hidden})",
                        self.logits.num_hidden_rows()
                    ))
                } else if self.logits.vocab_size != self.info.vocab_size
                    || self.logits.num_rows() != want
                {
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
                Ok(()) => {
                    report.outcome = self.sched.postprocess(&self.batch, &self.logits, t);
                    // Sampling is part of what a step costs a stream.
                    report.outcome.secs = synthetic.unwrap_or_else(|| t0.elapsed().as_secs_f64());
                    self.sched
                        .observe_step_time(&self.batch, report.outcome.secs);
                }
                Err(msg) => {
                    tracing::error!(error = %msg, "model runner failed; failing the batch");
                    self.sched.fail_step(&msg);
                }
            }
            self.sched.reap_finished(t);
        }
        report.released = self.sched.take_released();
        report
    }

    /// The scheduler's view of the engine's gauges and counters.
    /// Moves the prefix cache's changes since the last call into `out`, and the
    /// token ids of the blocks they store into `tokens` (none when the cache is off).
    /// Blocks newly stored are also handed to the disk tier, if any; its own
    /// changes (blocks written, found at start, deleted) follow the cache's.
    pub fn take_cache_changes(&mut self, out: &mut Vec<CacheChange>, tokens: &mut Vec<u32>) {
        self.sched.take_cache_changes(out, tokens);
        self.sched.spill_stored(out, tokens, &*self.runner);
        if let Some(d) = self.sched.disk() {
            // After the RAM tier's (their tokens are indexed by position).
            d.take_changes(out, tokens);
        }
    }

    /// What other threads see of the disk tier (none without one, or when its
    /// prefetch thread cannot start).
    pub fn disk_view(&self) -> Option<crate::disk_tier::DiskView> {
        let d = self.sched.disk()?;
        d.view()
            .map_err(|e| tracing::warn!(error = %e, "disk tier: no prefetch"))
            .ok()
    }

    pub fn snapshot(&self) -> EngineStats {
        self.sched.snapshot()
    }

    /// Finishes request `id` now with `reason` (its `Finished` is sent at once);
    /// nothing if it already finished.
    pub fn cancel(&mut self, id: u64, reason: FinishReason) {
        let now = self.now();
        self.sched.cancel(id, reason, now);
    }

    /// Requests that left the waiting queue outside a step (cancels).
    pub fn take_released(&mut self) -> crate::scheduler::Released {
        self.sched.take_released()
    }

    /// Ids of the requests it holds (for logs).
    pub fn request_ids(&self) -> Vec<u64> {
        self.sched.request_ids()
    }

    /// A fresh core on this one's runner (after `ModelRunner::reset`) and
    /// configuration: every KV block free, an empty prefix cache, no requests; the
    /// counters and the step-time model carry over.
    pub fn restart(self) -> Result<EngineCore, String> {
        let EngineCore {
            mut sched,
            mut runner,
            ..
        } = self;
        runner
            .reset()
            .map_err(|e| format!("runner reset failed: {e}"))?;
        let cfg = sched.cfg().clone();
        // The disk tier goes on (its files are sound); reads for the old KV do not.
        let mut disk = sched.take_disk();
        if let Some(d) = disk.as_mut() {
            d.clear_loads();
            // After the new cache's `Cleared`, its blocks are announced again.
            d.relist();
        }
        let mut core = EngineCore::build(runner, cfg, Some(disk)).map_err(|e| e.to_string())?;
        core.sched.carry_over(&sched);
        Ok(core)
    }

    /// Finishes every request with `reason` (engine failure or forced stop).
    pub fn fail_all(&mut self, reason: FinishReason) {
        let now = self.now();
        self.sched.fail_all(reason, now);
    }
}

/// The disk tier `cfg` asks for (`prefix_cache_dir`, with the prefix cache on).
fn open_disk(
    cfg: &EngineConfig,
    runner: &dyn ModelRunner,
) -> Result<Option<DiskTier>, EngineError> {
    let Some(dir) = cfg
        .prefix_cache_dir
        .as_deref()
        .filter(|_| cfg.enable_prefix_cache)
    else {
        return Ok(None);
    };
    let (Some(identity), bytes) = (runner.kv_identity(), runner.kv_block_bytes()) else {
        return Err(EngineError::InvalidConfig(
            "prefix_cache_dir: this model runner cannot copy its KV blocks".into(),
        ));
    };
    let bs = runner.info().block_size;
    // The block size the engine runs with is part of what a block means.
    let identity = crate::prefix_cache::chain_hash(identity, &[bs as u32]);
    DiskTier::open(dir, cfg.prefix_cache_disk_size, identity, bs, bytes)
        .map(Some)
        .map_err(EngineError::InvalidConfig)
}
