//! Prompt scoring (`Request::prompt_logprobs`) on the mock runner: every prompt
//! token after the first is scored once, in order, before the first generated
//! token; chunked prefill, the prefix cache, companions in the step and a
//! preemption leave the scores unchanged; `max_tokens` 0 samples nothing;
//! ordinary requests get no extra rows.

use super::*;
use crate::event::PromptLogprob;
use crate::request::PROMPT_SCORING_CHUNK;

/// Runs `reqs` together on a fresh core; each client's prompt scores and tokens.
fn run(cfg: EngineConfig, reqs: Vec<Request>) -> (Vec<(Vec<PromptLogprob>, Client)>, BatchLog) {
    let (mut core, log) = new_core(cfg);
    let mut clients: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| submit(&mut core, i as u64, r))
        .collect();
    let mut scores = vec![Vec::new(); clients.len()];
    let mut steps = 0;
    while core.has_work() {
        core.step();
        steps += 1;
        assert!(steps < 10_000);
        for (c, s) in clients.iter_mut().zip(&mut scores) {
            drain(c, s);
        }
    }
    assert_all_blocks_return(&mut core);
    (scores.into_iter().zip(clients).collect(), log)
}

/// Moves `c`'s events into `scores` / its tokens, checking scores come first.
fn drain(c: &mut Client, scores: &mut Vec<PromptLogprob>) {
    while let Ok(ev) = c.rx.try_recv() {
        match ev {
            Event::PromptLogprobs(s) => {
                assert!(c.tokens.is_empty() && c.finish.is_none(), "scores late");
                scores.extend(s);
            }
            Event::Token { id, .. } => c.tokens.push(id),
            Event::Pooled(_) => panic!("a scoring request pooled"),
            Event::Finished(f) => c.finish = Some(f),
        }
    }
}

fn scoring(p: Vec<u32>, max_tokens: usize, k: usize) -> Request {
    Request::greedy(p, max_tokens).with_prompt_logprobs(k)
}

#[test]
fn scores_every_prompt_token_once_chunked_or_not() {
    let p = prompt(1, 150);
    let mut whole = cfg(64);
    whole.max_prefill_chunk = 4096;
    let (a, log) = run(whole, vec![scoring(p.clone(), 3, 2)]);
    let (scores, client) = &a[0];
    assert_eq!(scores.len(), 149);
    for (j, s) in scores.iter().enumerate() {
        assert_eq!(s.id, p[j + 1]);
        assert_eq!(s.top_logprobs.len(), 2);
        assert!(s.logprob <= 0.0 && s.rank >= 1);
        assert!(s.top_logprobs[0].1 >= s.logprob);
        assert_eq!(s.rank == 1, s.top_logprobs[0].0 == s.id);
    }
    assert_eq!(client.tokens, MockRunner::reference(&p, 3, VOCAB));
    // Prefill chunks of a scoring request are capped (its logits rows bounded).
    let steps = log.lock().unwrap().clone();
    assert!(steps.iter().all(|b| b.num_tokens() <= PROMPT_SCORING_CHUNK));
    let mut chunked = cfg(64);
    chunked.max_prefill_chunk = 16;
    let (b, _) = run(chunked, vec![scoring(p.clone(), 3, 2)]);
    assert_eq!(b[0].0, *scores, "chunking changed the scores");
}

#[test]
fn max_tokens_zero_scores_only() {
    let p = prompt(2, 40);
    let (a, _) = run(cfg(64), vec![scoring(p, 0, 0)]);
    let (scores, c) = &a[0];
    assert_eq!(scores.len(), 39);
    assert!(scores.iter().all(|s| s.top_logprobs.is_empty()));
    assert!(c.tokens.is_empty());
    let f = c.finish.as_ref().unwrap();
    assert_eq!(f.reason, crate::event::FinishReason::Length);
    assert_eq!(f.completion_tokens, 0);
    // Without scoring, max_tokens 0 is still refused.
    let (core, _) = new_core(cfg(64));
    assert!(core
        .limits
        .validate(&Request::greedy(prompt(2, 5), 0))
        .is_err());
}

#[test]
fn companions_and_the_prefix_cache_do_not_change_scores() {
    let p = prompt(3, 100);
    let (alone, _) = run(cfg(64), vec![scoring(p.clone(), 2, 3)]);
    // The same prompt twice plus ordinary companions: the second scoring request
    // finds the first's blocks cached but computes every position again.
    let mut reqs = vec![
        greedy(prompt(4, 70), 8, SloClass::Interactive),
        scoring(p.clone(), 2, 3),
        greedy(p.clone(), 4, SloClass::Interactive),
        scoring(p.clone(), 2, 3),
    ];
    reqs.push(greedy(prompt(5, 33), 5, SloClass::Batch));
    let (together, log) = run(cfg(64), reqs);
    assert_eq!(together[1].0, alone[0].0);
    assert_eq!(together[3].0, alone[0].0);
    assert_eq!(
        together[3].1.finish.as_ref().unwrap().cached_prompt_tokens,
        0
    );
    assert!(together[0].0.is_empty() && together[2].0.is_empty());
    // Ordinary sequences never ask for more than one row (decode or last chunk).
    for b in log.lock().unwrap().iter() {
        for s in &b.seqs {
            assert!(s.num_logits <= 1 || s.num_logits == s.num_tokens);
        }
    }
}

#[test]
fn preemption_does_not_repeat_scores() {
    // A pool too small for both: the later sequence is preempted and recomputed.
    let p = prompt(6, 60);
    let reqs = vec![
        greedy(prompt(7, 60), 40, SloClass::Interactive),
        scoring(p.clone(), 40, 1),
    ];
    let (a, _) = run(cfg(9), reqs);
    let (scores, c) = &a[1];
    assert_eq!(scores.len(), 59);
    assert_eq!(c.tokens, MockRunner::reference(&p, 40, VOCAB));
    let (alone, _) = run(cfg(64), vec![scoring(p, 40, 1)]);
    assert_eq!(*scores, alone[0].0);
}
