//! Grammar fast-forward against the mock runner: a constraint that forces runs of
//! tokens gives the same output (greedy and seeded) in fewer steps; batch-class
//! rows get forced drafts under both step policies; forced drafts stop at
//! `max_tokens`, the context length and the grammar's end; forced tokens the
//! model need not take (another tokenization allowed) are verified like any draft;
//! forced tokens and n-gram drafts together change no token. The KV pool's
//! invariants hold after every step and every block comes back.

use std::sync::Arc;

use super::*;
use crate::config::StepBudgetPolicy;
use crate::event::FinishReason;
use crate::sampler::constraint::{ConstraintFactory, TokenConstraint};
use crate::sampler::SamplingParams;
use crate::stats::{ForcedCounters, PerClass, SpecCounters};
use crate::step_cost::StepShape;

/// A grammar over the count of committed tokens: of every 8 positions, 1..=5 allow
/// one token each (`loose`: other tokens too, as a grammar allows another
/// tokenization of its forced text), the rest any token; finished after
/// `finish_after` tokens.
#[derive(Debug, Clone, Copy)]
struct Runs {
    loose: bool,
    finish_after: usize,
}

struct RunsMatcher {
    g: Runs,
    n: usize,
}

/// The token position `n` is forced to, if any.
fn forced_at(n: usize) -> Option<u32> {
    (1..=5)
        .contains(&(n % 8))
        .then_some(((n % 8) * 37 + 11) as u32)
}

impl TokenConstraint for RunsMatcher {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        match forced_at(self.n) {
            Some(t) => {
                allowed.fill(0);
                allowed[t as usize / 32] |= 1 << (t % 32);
                if self.g.loose {
                    // The upper half of the vocabulary too: the mock model
                    // prefers one of those about half the time.
                    allowed[VOCAB / 64..].fill(u32::MAX);
                }
            }
            None => allowed.fill(u32::MAX),
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.n += 1;
        let _ = token;
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.n >= self.g.finish_after
    }
    /// The run ahead, past the grammar's end too (the engine must stop there).
    fn forced_tokens(&mut self) -> Vec<u32> {
        (self.n..).map_while(forced_at).collect()
    }
}

impl ConstraintFactory for Runs {
    fn matcher(&self) -> Box<dyn TokenConstraint> {
        Box::new(RunsMatcher { g: *self, n: 0 })
    }
}

const STRICT: Runs = Runs {
    loose: false,
    finish_after: usize::MAX,
};

fn ff_cfg(max_forced: usize, max_draft: usize) -> EngineConfig {
    EngineConfig {
        grammar_max_forced: max_forced,
        spec_max_draft: max_draft,
        max_num_batched_tokens: 512,
        max_prefill_chunk: 64,
        ..cfg(400)
    }
}

fn constrained(p: Vec<u32>, max_tokens: usize, class: SloClass, g: Runs) -> Request {
    let mut r = greedy(p, max_tokens, class);
    r.constraint = Some(Arc::new(g));
    r
}

fn seeded(mut r: Request, seed: u64) -> Request {
    r.sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    r
}

/// 10 ms a step, 2 ms a decode row or verified position (dear rows: n-gram drafts
/// pay only alone, forced tokens always do), 1 ms a prefill token.
fn rows_cost(s: &StepShape) -> f64 {
    0.010 + 0.002 * s.decode_rows as f64 + 0.001 * s.prefill_tokens as f64
}

/// What a run gave: each request's tokens and finish reason, the steps, and the
/// forced / n-gram counters.
struct Ran {
    outs: Vec<(Vec<u32>, FinishReason)>,
    steps: u64,
    forced: PerClass<ForcedCounters>,
    spec: PerClass<SpecCounters>,
}

/// Runs `reqs` (submitted together) on a fresh core over a mock whose text
/// repeats with `period` (0: never), checking the pool after every step.
fn run(c: EngineConfig, period: usize, reqs: Vec<Request>) -> Ran {
    run_costed(c, period, rows_cost, reqs)
}

fn run_costed(
    c: EngineConfig,
    period: usize,
    cost: fn(&StepShape) -> f64,
    reqs: Vec<Request>,
) -> Ran {
    let n = c.num_kv_blocks.unwrap();
    let mut mock = MockRunner::new(n, 4, VOCAB, 4096);
    if period > 0 {
        mock = mock.with_period(period, 0);
    }
    let mut core = EngineCore::new(Box::new(mock), c).unwrap();
    core.set_synthetic_cost(cost);
    let mut clients: Vec<Client> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| submit(&mut core, i as u64, r))
        .collect();
    let mut guard = 0;
    while core.has_work() {
        core.step();
        core.sched().pool().check_invariants().unwrap();
        clients.iter_mut().for_each(Client::poll);
        guard += 1;
        assert!(guard < 10_000, "engine not idle");
    }
    let st = core.snapshot();
    assert_all_blocks_return(&mut core);
    let outs = clients
        .iter_mut()
        .map(|c| {
            assert!(c.done());
            let f = c.finish.as_ref().unwrap();
            assert_eq!(f.completion_tokens, c.tokens.len());
            (c.tokens.clone(), f.reason.clone())
        })
        .collect();
    Ran {
        outs,
        steps: st.counters.steps,
        forced: st.counters.forced,
        spec: st.counters.spec,
    }
}

#[test]
fn forced_runs_give_the_same_output_in_fewer_steps() {
    for sampled in [false, true] {
        let reqs = || {
            (0..3u64)
                .map(|i| {
                    let r =
                        constrained(prompt(i, 9 + i as usize), 48, SloClass::Interactive, STRICT);
                    if sampled {
                        seeded(r, 5 + i)
                    } else {
                        r
                    }
                })
                .collect::<Vec<_>>()
        };
        let off = run(ff_cfg(0, 0), 0, reqs());
        let on = run(ff_cfg(16, 0), 0, reqs());
        assert_eq!(on.outs, off.outs, "sampled {sampled}");
        for (tokens, _) in &on.outs {
            assert_eq!(tokens.len(), 48);
            for (n, &t) in tokens.iter().enumerate() {
                assert!(forced_at(n).is_none_or(|f| f == t), "the grammar held");
            }
        }
        let f = on.forced[SloClass::Interactive];
        assert_eq!(off.forced[SloClass::Interactive], ForcedCounters::default());
        assert!(f.accepted_tokens > 0, "{f:?}");
        assert_eq!(f.accepted_tokens, f.drafted_tokens, "one choice: all taken");
        // 5 of every 8 tokens are forced: runs of 5 go in one step each.
        assert!(
            on.steps * 10 < off.steps * 6,
            "sampled {sampled}: {} -> {} steps",
            off.steps,
            on.steps
        );
    }
}

#[test]
fn batch_class_rows_get_forced_drafts() {
    for policy in [StepBudgetPolicy::Time, StepBudgetPolicy::Tokens] {
        let c = |max_forced| EngineConfig {
            step_budget: policy,
            ..ff_cfg(max_forced, 8)
        };
        let reqs = || {
            vec![
                constrained(prompt(1, 11), 40, SloClass::Batch, STRICT),
                constrained(prompt(2, 7), 40, SloClass::Interactive, STRICT),
                constrained(prompt(3, 5), 30, SloClass::Batch, STRICT),
            ]
        };
        let off = run(c(0), 0, reqs());
        let on = run(c(16), 0, reqs());
        assert_eq!(on.outs, off.outs, "{policy:?}");
        let batch = on.forced[SloClass::Batch];
        assert!(batch.accepted_tokens >= 2 * 10, "{policy:?}: {batch:?}");
        assert_eq!(on.spec[SloClass::Batch], SpecCounters::default());
        assert!(on.steps < off.steps, "{policy:?}");
    }
}

#[test]
fn forced_drafts_stop_at_max_tokens_the_context_and_the_grammar_end() {
    let short = EngineConfig {
        max_model_len: Some(24),
        ..ff_cfg(16, 0)
    };
    // Forced runs cover tokens 1..=5, 9..=13, 17..=21 of each output: the first
    // request's 11 tokens cut the second run, the second's context (12 + 12) the
    // third, the grammar's end (19 tokens) the third of the batch request.
    let ends = Runs {
        loose: false,
        finish_after: 19,
    };
    let reqs = || {
        vec![
            constrained(prompt(1, 5), 11, SloClass::Interactive, STRICT),
            constrained(prompt(2, 12), 12, SloClass::Interactive, STRICT),
            constrained(prompt(3, 3), 21, SloClass::Batch, ends),
        ]
    };
    let off = run(
        EngineConfig {
            grammar_max_forced: 0,
            ..short.clone()
        },
        0,
        reqs(),
    );
    let on = run(short, 0, reqs());
    assert_eq!(on.outs, off.outs);
    let lens: Vec<_> = on.outs.iter().map(|(t, r)| (t.len(), r.clone())).collect();
    assert_eq!(
        lens,
        [
            (11, FinishReason::Length),
            (12, FinishReason::Length),
            (19, FinishReason::Stop)
        ],
        "max_tokens, the context, the grammar's end"
    );
    let f = on.forced[SloClass::Interactive];
    assert!(
        f.accepted_tokens > 0 && f.accepted_tokens == f.drafted_tokens,
        "{f:?}"
    );
    let b = on.forced[SloClass::Batch];
    assert!(
        b.drafted_tokens > b.accepted_tokens,
        "cut by the grammar's end: {b:?}"
    );
}

#[test]
fn forced_tokens_the_model_need_not_take_are_verified() {
    let loose = Runs {
        loose: true,
        finish_after: usize::MAX,
    };
    let reqs = || {
        (0..4u64)
            .map(|i| {
                let r = constrained(prompt(10 + i, 8), 40, SloClass::Interactive, loose);
                if i % 2 == 1 {
                    seeded(r, i)
                } else {
                    r
                }
            })
            .collect::<Vec<_>>()
    };
    let off = run(ff_cfg(0, 0), 0, reqs());
    let on = run(ff_cfg(16, 0), 0, reqs());
    assert_eq!(on.outs, off.outs);
    let f = on.forced[SloClass::Interactive];
    assert!(
        f.accepted_tokens > 0 && f.accepted_tokens < f.drafted_tokens,
        "some taken, some not: {f:?}"
    );
}

#[test]
fn forced_tokens_then_an_ngram_draft_change_no_token() {
    let reqs = || {
        (0..3u64)
            .map(|i| constrained(prompt(20 + i, 10), 64, SloClass::Interactive, STRICT))
            .collect::<Vec<_>>()
    };
    // 30 ms a step, 0.5 ms a row: n-gram drafts pay.
    let cheap = |s: &StepShape| 0.030 + 0.0005 * s.decode_rows as f64;
    // The mock copies the token 8 back, the grammar's runs repeat every 8: the
    // text becomes periodic and n-gram drafts right.
    let plain = run_costed(ff_cfg(0, 0), 8, cheap, reqs());
    let both = run_costed(ff_cfg(16, 8), 8, cheap, reqs());
    assert_eq!(both.outs, plain.outs);
    let (f, s) = (
        both.forced[SloClass::Interactive],
        both.spec[SloClass::Interactive],
    );
    assert!(f.accepted_tokens > 0 && s.verify_rows > 0, "{f:?} {s:?}");
    assert_eq!(s.emitted_tokens, s.accepted_tokens + s.verify_rows);
    assert!(both.steps < plain.steps);
}
