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
    s.preempt(false, 4);
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

#[test]
fn a_paused_sequence_keeps_its_computed_blocks_and_resumes_on_them() {
    let pool = BlockPool::new(8, 4);
    let (mut s, _rx) = seq(&pool);
    s.admit(0);
    s.tokens.extend([4, 5, 6, 7]);
    s.push_new_blocks(3).unwrap();
    s.num_computed = 6;
    s.plan_tokens(1);
    s.preempt(true, 4);
    assert!(s.is_paused() && s.is_preempted());
    assert_eq!(
        (s.blocks.len(), s.num_computed, s.scheduled, pool.num_used()),
        (2, 6, 0, 2),
        "the blocks of its 6 computed tokens kept, the planned one's released"
    );
    s.requeue();
    assert!(s.is_paused());
    assert!(!s.admit(6));
    assert_eq!(s.resumed(6, 4), Resumed::Kept);
    // Preempted for memory: released; resumed with one full block found again.
    s.preempt(false, 4);
    assert!(!s.is_paused() && s.blocks.is_empty() && pool.num_used() == 0);
    s.requeue();
    s.admit(4);
    assert_eq!(
        s.resumed(4, 4),
        Resumed::Spilled {
            recomputed: 2,
            prompt: 0
        }
    );
    // Released with two full blocks, none found: recomputed, its prompt too.
    s.num_computed = 8;
    s.preempt(false, 4);
    s.requeue();
    s.admit(0);
    assert_eq!(
        s.resumed(0, 4),
        Resumed::Recomputed {
            recomputed: 8,
            prompt: 3
        }
    );
}
