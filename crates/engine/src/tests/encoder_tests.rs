//! An encoder runner (`RunnerInfo::encoder`, the mock as one): only pooled
//! requests are admitted, each prompt at most the step's token budget (and the
//! context), and every prompt runs whole in one step, never chunked, in both
//! classes and under the time budget, beside others within the token budget.

use super::*;
use crate::error::EngineError;
use crate::mock::MockRunner;
use crate::pooling::Pooling;

fn encoder_core(cfg: EngineConfig) -> (EngineCore, BatchLog) {
    let n = cfg.num_kv_blocks.unwrap_or(256);
    let (runner, log) = MockRunner::new(n, 16, VOCAB, 4096).as_encoder().with_log();
    (EngineCore::new(Box::new(runner), cfg).unwrap(), log)
}

fn encoder_cfg() -> EngineConfig {
    EngineConfig {
        max_prefill_chunk: 16,
        max_num_batched_tokens: 512,
        ..cfg(1024)
    }
}

#[test]
fn only_pooled_requests_of_at_most_the_step_budget_are_admitted() {
    let (core, _) = encoder_core(encoder_cfg());
    let c = core.cfg();
    let mean = |len| Request::pooled(prompt(1, len), Pooling::Mean);
    assert_eq!(
        core.limits.decide(c, &Request::greedy(prompt(1, 8), 4)),
        Err(EngineError::PooledOnly)
    );
    assert!(core.limits.decide(c, &mean(512)).is_ok());
    assert_eq!(
        core.limits.decide(c, &mean(513)),
        Err(EngineError::PromptTooLong { len: 513, max: 512 })
    );
}

#[test]
fn every_prompt_runs_whole_in_one_step() {
    let lens = [100, 300, 40, 500, 512, 7, 260, 260];
    let (mut core, log) = encoder_core(encoder_cfg());
    let mut clients: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let class = match i % 2 {
                0 => SloClass::Batch,
                _ => SloClass::Interactive,
            };
            let req = Request::pooled(prompt(i as u64, len), Pooling::Mean).with_class(class);
            submit(&mut core, i as u64, req)
        })
        .collect();
    run_to_idle(&mut core, 1_000);
    clients.iter_mut().for_each(Client::poll);
    assert_all_blocks_return(&mut core);
    for c in &clients {
        assert!(c.pooled.is_some(), "request {}: no output", c.id);
    }
    let log = log.lock().unwrap();
    let mut seen = Vec::new();
    for b in log.iter() {
        assert!(b.num_tokens() <= 512, "a step over the token budget");
        for s in &b.seqs {
            assert_eq!(s.num_cached, 0, "a prompt resumed after a chunk");
            assert!(s.hidden, "an encoder row that is not pooled");
            seen.push(s.num_tokens);
        }
    }
    seen.sort_unstable();
    let mut want = lens.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want, "each prompt once, whole");
}
