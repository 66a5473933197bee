use super::*;
use crate::block_pool::BlockPool;
use crate::sampler::SamplingParams;

fn seq(pool: &BlockPool) -> (Sequence, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let s = Sequence::new(
        1,
        SloClass::Interactive,
        SloTargets::default(),
        vec![1, 2, 3],
        Sampler::new(SamplingParams::default(), 16),
        StopConditions::max_tokens(8),
        16,
        tx,
        Instant::now(),
        pool.new_table(),
    );
    (s, rx)
}

#[test]
fn the_lifecycle_moves_by_its_transitions() {
    let pool = BlockPool::new(8, 4);
    let (mut s, _rx) = seq(&pool);
    assert_eq!((s.phase(), s.has_started()), (Phase::Waiting, false));
    assert!(s.admit(0), "first admission");
    assert_eq!(s.phase(), Phase::Prefilling { done: 0, of: 3 });
    s.num_computed = 3;
    s.tokens.push(9);
    assert_eq!(s.phase(), Phase::Decoding);
    assert!(s.is_active());
    s.preempt();
    assert_eq!(
        (s.phase(), s.num_computed, s.timings.preemptions),
        (Phase::Preempted, 0, 1)
    );
    assert!(!s.is_active() && s.is_preempted());
    s.requeue();
    assert_eq!((s.state(), s.has_started()), (&SeqState::Requeued, true));
    assert!(!s.admit(0), "a readmission");
    assert_eq!(s.phase(), Phase::Prefilling { done: 0, of: 4 });
    s.finish(FinishReason::Stop);
    s.finish(FinishReason::Cancelled);
    assert_eq!(
        s.finish_reason(),
        Some(&FinishReason::Stop),
        "the first reason wins"
    );
    assert!(!s.is_active());
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "admitted from Running")]
fn a_transition_from_the_wrong_state_is_caught() {
    let pool = BlockPool::new(8, 4);
    let (mut s, _rx) = seq(&pool);
    s.admit(0);
    s.admit(0);
}
