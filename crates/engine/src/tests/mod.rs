//! Scenario tests of the scheduler, engine core and engine thread against the
//! `MockRunner`, and seeded randomized invariant tests of the block pool and prefix
//! cache.

mod batch_admission_tests;
mod batch_alone_steps_tests;
mod cancel_tests;
mod disk_tier_tests;
mod encoder_tests;
mod engine_tests;
mod fairness_tests;
mod fast_forward_tests;
mod flow_admission_tests;
mod invariants;
mod long_prompt_tests;
mod policy_tests;
mod pooled_tests;
mod preemption_keep_tests;
mod preemption_tests;
mod prompt_scoring_tests;
mod slo_steps_tests;
mod speculation_tests;
mod supervise_tests;

use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::config::EngineConfig;
use crate::core::EngineCore;
use crate::event::{Event, FinishInfo};
use crate::mock::{BatchLog, MockRunner};
use crate::request::{Request, SloClass};

pub(crate) const VOCAB: usize = 1000;

/// A small deterministic RNG (splitmix64) for seeded tests.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A prompt of `len` pseudo-random tokens.
pub(crate) fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut r = Rng::new(seed ^ 0xfeed);
    (0..len).map(|_| r.below(VOCAB) as u32).collect()
}

/// A config with the given pool, for step-driven tests (no linger after
/// interactive work: the mock's steps take microseconds of real time).
pub(crate) fn cfg(num_blocks: usize) -> EngineConfig {
    EngineConfig {
        num_kv_blocks: Some(num_blocks),
        kv_watermark: 0.0,
        interactive_linger_ms: 0,
        ..EngineConfig::default()
    }
}

/// An engine core over a recording mock runner with `cfg.num_kv_blocks` blocks of 16.
pub(crate) fn new_core(cfg: EngineConfig) -> (EngineCore, BatchLog) {
    let n = cfg.num_kv_blocks.unwrap_or(256);
    let (runner, log) = MockRunner::new(n, 16, VOCAB, 4096).with_log();
    (EngineCore::new(Box::new(runner), cfg).unwrap(), log)
}

/// A request's receiving end plus its id, for step-driven tests.
pub(crate) struct Client {
    pub id: u64,
    pub rx: UnboundedReceiver<Event>,
    pub tokens: Vec<u32>,
    pub finish: Option<FinishInfo>,
    /// A pooled request's output.
    pub pooled: Option<Vec<f32>>,
}

impl Client {
    /// Moves every available event into `tokens` / `finish`.
    pub fn poll(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            match ev {
                Event::Token { id, .. } => {
                    assert!(self.finish.is_none(), "token after Finished");
                    self.tokens.push(id);
                }
                Event::PromptLogprobs(_) => {}
                Event::Pooled(v) => {
                    assert!(
                        self.finish.is_none() && self.pooled.is_none(),
                        "pooled twice"
                    );
                    self.pooled = Some(v);
                }
                Event::Finished(f) => {
                    assert!(self.finish.is_none(), "two Finished events");
                    self.finish = Some(f);
                }
            }
        }
    }
    pub fn done(&mut self) -> bool {
        self.poll();
        self.finish.is_some()
    }
}

/// Validates and queues `req` on `core` as request `id`, arriving now.
pub(crate) fn submit(core: &mut EngineCore, id: u64, req: Request) -> Client {
    let (tx, rx) = unbounded_channel();
    let arrival: Instant = core.now();
    let admitted = core.limits.decide(core.cfg(), &req).unwrap();
    let seq = core.make_sequence(id, req, admitted, tx, arrival);
    core.add(seq);
    Client {
        id,
        rx,
        tokens: Vec::new(),
        finish: None,
        pooled: None,
    }
}

pub(crate) fn greedy(prompt: Vec<u32>, max_tokens: usize, class: SloClass) -> Request {
    Request::greedy(prompt, max_tokens).with_class(class)
}

/// Steps until nothing is left (panics after `max_steps`).
pub(crate) fn run_to_idle(core: &mut EngineCore, max_steps: usize) -> usize {
    let mut steps = 0;
    while core.has_work() {
        core.step();
        steps += 1;
        assert!(
            steps <= max_steps,
            "engine not idle after {max_steps} steps"
        );
    }
    steps
}

/// After all requests finished: nothing is held, and flushing the cache frees all.
pub(crate) fn assert_all_blocks_return(core: &mut EngineCore) {
    let sched = core.sched_mut();
    assert!(!sched.has_work());
    assert_eq!(
        sched.pool().num_used(),
        0,
        "blocks still held after all requests finished"
    );
    sched.pool().check_invariants().unwrap();
    if let Some(cache) = sched.cache_mut() {
        cache.check_invariants().unwrap();
        cache.flush();
        assert_eq!(cache.size(), 0);
    }
    assert_eq!(sched.pool().num_free(), sched.pool().num_blocks());
}
