//! Fair order within a class (`scheduler/fair.rs`): a flow's burst does not hold
//! back another flow's request, no ids is first come first served, classes keep
//! their own order, requeued sequences keep the front, per-flow state empties.

use super::*;
use crate::event::FinishReason;

/// One request at a time, so start order is the order requests leave the queue.
fn one_at_a_time() -> (EngineCore, BatchLog) {
    let mut c = cfg(200);
    c.max_num_seqs = 1;
    new_core(c)
}

fn req(id: u64, class: SloClass, flow: Option<&str>) -> Request {
    let r = greedy(prompt(id, 10), 2, class);
    match flow {
        Some(f) => r.with_fairness(f),
        None => r,
    }
}

/// Steps until idle, returning the clients' ids in the order they started
/// (their first token).
fn start_order(core: &mut EngineCore, clients: &mut [Client]) -> Vec<u64> {
    let mut order = Vec::new();
    record_starts(clients, &mut order);
    let mut steps = 0;
    while core.has_work() {
        core.step();
        record_starts(clients, &mut order);
        steps += 1;
        assert!(steps < 10_000, "not idle");
    }
    order
}

fn record_starts(clients: &mut [Client], order: &mut Vec<u64>) {
    for c in clients {
        let seen = !c.tokens.is_empty();
        c.poll();
        if !seen && !c.tokens.is_empty() {
            order.push(c.id);
        }
    }
}

fn no_flows_left(core: &EngineCore) {
    for class in SloClass::ALL {
        assert_eq!(core.sched().num_fair_flows(class), 0, "{class}");
    }
}

#[test]
fn a_flooding_flow_does_not_hold_back_another_flows_request() {
    let (mut core, _) = one_at_a_time();
    let mut clients: Vec<_> = (0..20)
        .map(|i| submit(&mut core, i, req(i, SloClass::Interactive, Some("a"))))
        .collect();
    // a's first request starts; then b's single request arrives.
    core.step();
    let mut started = Vec::new();
    record_starts(&mut clients, &mut started);
    assert_eq!(started, vec![0]);
    clients.push(submit(
        &mut core,
        100,
        req(100, SloClass::Interactive, Some("b")),
    ));
    assert_eq!(core.sched().num_fair_flows(SloClass::Interactive), 2);
    started.extend(start_order(&mut core, &mut clients));
    // b's tag ties a's next one (both V + 1): b starts second after arriving,
    // not behind a's 19 waiting requests.
    assert_eq!(&started[..3], &[0, 1, 100], "{started:?}");
    // a's own requests keep their order.
    let a: Vec<u64> = started.iter().copied().filter(|&id| id != 100).collect();
    assert_eq!(a, (0..20).collect::<Vec<_>>());
    assert!(clients.iter_mut().all(|c| c.done()));
    no_flows_left(&core);
    assert_all_blocks_return(&mut core);
}

#[test]
fn a_burst_queued_before_anything_started_lets_a_late_flow_in_second() {
    let (mut core, _) = one_at_a_time();
    let mut clients: Vec<_> = (0..20)
        .map(|i| submit(&mut core, i, req(i, SloClass::Batch, Some("a"))))
        .collect();
    clients.push(submit(&mut core, 100, req(100, SloClass::Batch, Some("b"))));
    clients.push(submit(&mut core, 101, req(101, SloClass::Batch, Some("b"))));
    let order = start_order(&mut core, &mut clients);
    // Tags: a 1..20, b 1 and 2: a and b alternate, ties by arrival, then a alone.
    assert_eq!(&order[..5], &[0, 100, 1, 101, 2]);
    assert_eq!(&order[5..], &(3..20).collect::<Vec<_>>()[..]);
    no_flows_left(&core);
}

#[test]
fn without_fairness_ids_the_order_is_first_come_first_served() {
    for flow in [None, Some("one-tenant")] {
        let (mut core, _) = one_at_a_time();
        let mut clients: Vec<_> = (0..12)
            .map(|i| submit(&mut core, i, req(i, SloClass::Interactive, flow)))
            .collect();
        // Arrivals while others run and wait join the back.
        let mut order = Vec::new();
        for _ in 0..5 {
            core.step();
            record_starts(&mut clients, &mut order);
        }
        for i in 12..20 {
            clients.push(submit(&mut core, i, req(i, SloClass::Interactive, flow)));
        }
        order.extend(start_order(&mut core, &mut clients));
        assert_eq!(order, (0..20).collect::<Vec<_>>(), "{flow:?}");
        no_flows_left(&core);
    }
}

#[test]
fn classes_keep_their_own_fair_order() {
    let mut c = cfg(200);
    c.max_num_seqs = 1;
    c.enable_preemption = false;
    let (mut core, _) = new_core(c);
    let mut clients = Vec::new();
    // Flow a floods the batch queue; its interactive request is not behind that.
    for i in 0..10 {
        clients.push(submit(&mut core, i, req(i, SloClass::Batch, Some("a"))));
    }
    for i in 10..15 {
        clients.push(submit(
            &mut core,
            i,
            req(i, SloClass::Interactive, Some("a")),
        ));
    }
    clients.push(submit(
        &mut core,
        20,
        req(20, SloClass::Interactive, Some("b")),
    ));
    let tags = |core: &EngineCore, class| -> Vec<(u64, u64)> {
        let q = core.sched().waiting(class);
        q.iter().map(|s| (s.id(), s.fair_tag())).collect()
    };
    assert_eq!(
        tags(&core, SloClass::Batch),
        (0..10).map(|i| (i, i + 1)).collect::<Vec<_>>()
    );
    assert_eq!(
        tags(&core, SloClass::Interactive),
        vec![(10, 1), (20, 1), (11, 2), (12, 3), (13, 4), (14, 5)]
    );
    let order = start_order(&mut core, &mut clients);
    let expected: Vec<u64> = [10, 20, 11, 12, 13, 14].into_iter().chain(0..10).collect();
    assert_eq!(order, expected);
    no_flows_left(&core);
}

#[test]
fn a_preempted_sequence_keeps_the_front_of_its_queue() {
    let mut c = cfg(200);
    c.max_num_seqs = 1;
    let (mut core, _) = new_core(c);
    let mut a = submit(&mut core, 1, greedy(prompt(1, 10), 30, SloClass::Batch));
    core.step();
    a.poll();
    assert_eq!(a.tokens.len(), 1, "a started");
    let mut b: Vec<_> = (2..5)
        .map(|i| submit(&mut core, i, req(i, SloClass::Batch, Some("b"))))
        .collect();
    let mut i = submit(&mut core, 9, req(9, SloClass::Interactive, Some("c")));
    core.step();
    i.poll();
    assert_eq!(i.tokens.len(), 1, "the interactive request started");
    let batch: Vec<u64> = core
        .sched()
        .waiting(SloClass::Batch)
        .iter()
        .map(|s| s.id())
        .collect();
    assert_eq!(batch, vec![1, 2, 3, 4], "the preempted sequence leads");
    // A new flow arriving now queues behind it too.
    b.push(submit(&mut core, 5, req(5, SloClass::Batch, Some("d"))));
    assert_eq!(
        core.sched().waiting(SloClass::Batch).front().unwrap().id(),
        1
    );
    run_to_idle(&mut core, 1_000);
    assert!(a.done() && i.done() && b.iter_mut().all(|c| c.done()));
    assert_eq!(a.finish.as_ref().unwrap().timings.preemptions, 1);
    no_flows_left(&core);
    assert_all_blocks_return(&mut core);
}

#[test]
fn per_flow_state_empties_when_waiting_requests_end_without_starting() {
    let (mut core, _) = one_at_a_time();
    let mut clients: Vec<_> = (0..6)
        .map(|i| {
            let flow = format!("f{}", i % 3);
            submit(&mut core, i, req(i, SloClass::Interactive, Some(&flow)))
        })
        .collect();
    core.step();
    assert_eq!(core.sched().num_fair_flows(SloClass::Interactive), 3);
    // Cancelled while waiting: f1's two requests (ids 1 and 4) leave unstarted.
    core.cancel(1, FinishReason::Aborted);
    core.cancel(4, FinishReason::Aborted);
    assert_eq!(core.sched().num_fair_flows(SloClass::Interactive), 2);
    // A dropped stream is reaped at the next step.
    let dropped = clients.remove(5);
    drop(dropped);
    core.step();
    core.fail_all(FinishReason::Aborted);
    assert!(clients.iter_mut().all(|c| c.done()));
    no_flows_left(&core);
    assert_all_blocks_return(&mut core);
}
