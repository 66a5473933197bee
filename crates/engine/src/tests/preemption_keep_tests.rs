//! Preemption that keeps work: a sequence preempted for a slot keeps its KV while
//! it waits and resumes without recomputing (against the same run with
//! `preemption_keeps_kv` off); when memory is needed its blocks are released
//! before a running sequence is preempted, and it resumes from the prefix cache.

use super::*;
use crate::event::FinishReason;
use crate::mock::MockRunner;
use crate::stats::Counters;

/// Three batch sequences fill the slots; an interactive arrival preempts the
/// newest. Returns the counters after all finished with the reference outputs.
fn slot_preemption(keep: bool) -> Counters {
    let mut c = cfg(100);
    c.preemption_keeps_kv = keep;
    let (mut core, mut batch, mut inter) = super::preemption_tests::full_slots_then_interactive(c);
    let waiting = core.sched().waiting(SloClass::Batch);
    assert_eq!(waiting.len(), 1);
    let paused = &waiting[0];
    assert_eq!(paused.id(), 2, "the newest batch sequence yielded");
    if keep {
        // 30 prompt + 10 generated tokens, the newest without KV: 39 kept.
        assert_eq!((paused.num_computed(), paused.blocks().len()), (39, 3));
        assert!(paused.is_paused());
    } else {
        assert!(paused.blocks().is_empty() && !paused.is_paused());
    }
    run_to_idle(&mut core, 500);
    inter.poll();
    assert_eq!(
        inter.tokens,
        MockRunner::reference(&prompt(9, 20), 5, VOCAB)
    );
    for (i, cl) in batch.iter_mut().enumerate() {
        cl.poll();
        let want = MockRunner::reference(&prompt(i as u64, 30), 40, VOCAB);
        assert_eq!(cl.tokens, want, "request {i}");
        let f = cl.finish.as_ref().unwrap();
        assert_eq!(
            (&f.reason, f.timings.preemptions),
            (&FinishReason::Length, (i == 2) as u32)
        );
    }
    let counters = *core.sched().counters();
    assert_all_blocks_return(&mut core);
    counters
}

#[test]
fn a_slot_preemption_keeps_the_kv_and_recomputes_nothing() {
    let kept = slot_preemption(true);
    assert_eq!(kept.preemptions, 1);
    assert_eq!(
        (kept.preemptions_kept, kept.preemptions_spilled),
        (1, 0),
        "{kept:?}"
    );
    assert_eq!(
        (kept.recomputed_tokens, kept.recomputed_prompt_tokens),
        (0, 0)
    );
    // Every prompt token ran once.
    assert_eq!(kept.prefill_tokens, 3 * 30 + 20);

    // Off: the KV is freed at once; its full blocks are found in the prefix
    // cache (spilled), its last partial block (39 = 2 * 16 + 7) recomputed.
    let freed = slot_preemption(false);
    assert_eq!(
        (freed.preemptions_kept, freed.preemptions_spilled),
        (0, 1),
        "{freed:?}"
    );
    assert_eq!(freed.recomputed_tokens, 7);
    assert_eq!(
        freed.recomputed_prompt_tokens, 0,
        "its prompt's blocks are full"
    );
    assert!(freed.prefill_tokens > kept.prefill_tokens);
}

#[test]
fn memory_pressure_releases_paused_kv_before_preempting_running_work() {
    // 13 blocks of 16. Two batch sequences hold 3 blocks each; an interactive
    // arrival takes the newest's slot (paused, KV kept) and needs 8 blocks of
    // the 7 free: the paused sequence's blocks are released (its 2 full ones
    // stay cached, idle), not the running one's.
    let mut c = cfg(13);
    c.max_num_seqs = 2;
    let (mut core, _) = new_core(c);
    let pa = prompt(1, 30);
    let pb = prompt(2, 30);
    let mut a = submit(&mut core, 1, greedy(pa.clone(), 20, SloClass::Batch));
    let mut b = submit(&mut core, 2, greedy(pb.clone(), 20, SloClass::Batch));
    for _ in 0..12 {
        core.step();
    }
    assert_eq!(core.sched().pool().num_used(), 6);
    let pi = prompt(3, 113);
    let mut i = submit(&mut core, 3, greedy(pi.clone(), 4, SloClass::Interactive));
    core.step();
    let c = *core.sched().counters();
    assert_eq!((c.preemptions, c.paused_released), (1, 1), "{c:?}");
    let waiting = core.sched().waiting(SloClass::Batch);
    assert!(waiting[0].blocks().is_empty(), "released");
    run_to_idle(&mut core, 500);
    for (cl, p, max) in [(&mut a, &pa, 20), (&mut b, &pb, 20), (&mut i, &pi, 4)] {
        cl.poll();
        assert_eq!(cl.tokens, MockRunner::reference(p, max, VOCAB), "{}", cl.id);
    }
    assert_eq!(a.finish.as_ref().unwrap().timings.preemptions, 0);
    let c = *core.sched().counters();
    assert_eq!(c.preemptions, 1, "no running sequence was preempted");
    assert_eq!(
        (
            c.preemptions_kept,
            c.preemptions_spilled,
            c.preemptions_recomputed
        ),
        (0, 1, 0),
        "{c:?}"
    );
    assert!(c.recomputed_tokens < 16, "its partial block only: {c:?}");
    assert_all_blocks_return(&mut core);
}
