//! Pooled requests (`Request::pooling`) on the mock runner: one output, sent
//! before `Finished`, nothing sampled; the same output whole or chunked, beside
//! companions, after a preemption and with the prompt's blocks already cached
//! (a pooled request reads no cached prefix); only the rows its pooling needs.

use super::*;
use crate::event::FinishReason;
use crate::mock::MOCK_HIDDEN;
use crate::pooling::Pooling;
use crate::runner::Batch;

/// Runs `reqs` together on a fresh core to the end; each client.
fn run(cfg: EngineConfig, reqs: Vec<Request>) -> (Vec<Client>, BatchLog) {
    let (mut core, log) = new_core(cfg);
    let mut clients: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| submit(&mut core, i as u64, r))
        .collect();
    run_to_idle(&mut core, 10_000);
    clients.iter_mut().for_each(Client::poll);
    assert_all_blocks_return(&mut core);
    (clients, log)
}

fn chunked(chunk: usize) -> EngineConfig {
    EngineConfig {
        max_prefill_chunk: chunk,
        ..cfg(64)
    }
}

fn pooled_alone(p: &[u32], pooling: Pooling, chunk: usize) -> Vec<f32> {
    let (c, _) = run(chunked(chunk), vec![Request::pooled(p.to_vec(), pooling)]);
    c[0].pooled.clone().expect("a pooled output")
}

#[test]
fn each_pooling_is_one_output_the_same_whole_or_chunked() {
    let p = prompt(11, 150);
    for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        let whole = pooled_alone(&p, pooling.clone(), 4096);
        assert_eq!(whole.len(), MOCK_HIDDEN, "{pooling:?}");
        assert_eq!(pooled_alone(&p, pooling.clone(), 16), whole, "{pooling:?}");
    }
    // Different poolings of the same prompt differ.
    let [m, c, l] = [Pooling::Mean, Pooling::Cls, Pooling::Last].map(|x| pooled_alone(&p, x, 32));
    assert!(m != c && c != l && m != l);
    // CLS is position 0's state: a prompt sharing only its first token agrees.
    let mut q = p.clone();
    q[5] = (q[5] + 1) % VOCAB as u32;
    assert_eq!(pooled_alone(&q, Pooling::Cls, 16), c);
    assert_ne!(pooled_alone(&q, Pooling::Last, 16), l);
    let (cl, _) = run(cfg(64), vec![Request::pooled(p.clone(), Pooling::Last)]);
    let f = cl[0].finish.as_ref().unwrap();
    assert_eq!(
        (f.reason.clone(), f.completion_tokens),
        (FinishReason::Length, 0)
    );
    assert!(cl[0].tokens.is_empty());
}

#[test]
fn last_pooling_asks_one_row_and_token_logits_read_the_last_logits() {
    let p = prompt(12, 70);
    let (_, log) = run(chunked(16), vec![Request::pooled(p.clone(), Pooling::Last)]);
    let rows: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(Batch::num_hidden_rows)
        .collect();
    assert_eq!(rows.iter().sum::<usize>(), 1);
    assert_eq!(rows.last(), Some(&1));
    // The mock's last row scores the greedy next token 10 and the one after 5.
    let next = MockRunner::reference(&p, 1, VOCAB)[0];
    let after = (next + 1) % VOCAB as u32;
    let other = (next + 7) % VOCAB as u32;
    let ids = vec![after, next, other];
    assert_eq!(
        pooled_alone(&p, Pooling::TokenLogits(ids), 16),
        [5.0, 10.0, 0.0]
    );
}

#[test]
fn companions_the_prefix_cache_and_preemption_do_not_change_outputs() {
    let p = prompt(13, 100);
    let alone = pooled_alone(&p, Pooling::Mean, 512);
    let last = pooled_alone(&p, Pooling::Last, 512);
    // The prompt is generated first (its blocks cached), then pooled twice with
    // companions of both classes.
    let reqs = [
        greedy(p.clone(), 4, SloClass::Interactive),
        greedy(prompt(14, 70), 8, SloClass::Interactive),
        Request::pooled(p.clone(), Pooling::Mean),
        greedy(prompt(15, 33), 5, SloClass::Batch),
        Request::pooled(p.clone(), Pooling::Last).with_class(SloClass::Interactive),
    ];
    let (mut core, _) = new_core(cfg(64));
    let mut first = submit(&mut core, 0, reqs[0].clone());
    run_to_idle(&mut core, 1000);
    assert!(first.done());
    let mut cs: Vec<_> = reqs[1..]
        .iter()
        .enumerate()
        .map(|(i, r)| submit(&mut core, 1 + i as u64, r.clone()))
        .collect();
    run_to_idle(&mut core, 10_000);
    cs.iter_mut().for_each(Client::poll);
    assert_eq!(cs[1].pooled.as_deref(), Some(&alone[..]));
    assert_eq!(cs[3].pooled.as_deref(), Some(&last[..]));
    assert_eq!(cs[1].finish.as_ref().unwrap().cached_prompt_tokens, 0);
    assert!(cs[0].pooled.is_none() && cs[0].tokens.len() == 8);
    // A pool too small for both: the pooled sequence is preempted and recomputed.
    let reqs = vec![
        greedy(prompt(16, 60), 60, SloClass::Interactive),
        Request::pooled(prompt(17, 90), Pooling::Mean),
    ];
    let (c, _) = run(
        EngineConfig {
            max_prefill_chunk: 16,
            ..cfg(9)
        },
        reqs,
    );
    let want = pooled_alone(&prompt(17, 90), Pooling::Mean, 512);
    assert_eq!(c[1].pooled.as_deref(), Some(&want[..]));
    let preempted: u32 = c
        .iter()
        .map(|c| c.finish.as_ref().unwrap().timings.preemptions)
        .sum();
    assert!(preempted >= 1, "nothing was preempted");
}
