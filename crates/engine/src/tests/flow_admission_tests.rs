//! Admission per flow (issue #55's hostile soak): through the threaded engine, one
//! flow's interactive backlog refuses that flow's next request for its predicted
//! wait, while another flow's request, which starts after only one of the
//! backlog's in fair order, is admitted.

use super::prompt;
use crate::error::EngineError;
use crate::request::Request;

fn interactive(seed: u64, flow: &str) -> Request {
    Request::greedy(prompt(seed, 300), 2).with_fairness(flow)
}

#[test]
fn another_flows_backlog_does_not_refuse_a_flows_request() {
    // ~0.15 s of wait for each 300-token prompt ahead; the one slot is held.
    let (engine, occupant) = super::batch_admission_tests::one_slot_held(|a| {
        a.max_queue_wait_s = 0.4;
    });
    let rate = engine.stats().prefill_tokens_per_s;
    // Flow b queues until its own predicted wait passes 0.4 s.
    let mut backlog = Vec::new();
    let refused_wait = loop {
        match engine.submit(interactive(10 + backlog.len() as u64, "b")) {
            Ok(s) => backlog.push(s),
            Err(EngineError::QueueWaitTooLong { predicted_s, .. }) => break predicted_s,
            Err(e) => panic!("{e}"),
        }
        assert!(backlog.len() < 40, "never refused (prefill rate {rate})");
    };
    assert!(
        backlog.len() >= 2,
        "a backlog of {} (rate {rate})",
        backlog.len()
    );
    // Flow a's request starts after one of b's (their tags tie; b's came first):
    // about 0.15 s, admitted whatever b's backlog.
    let a = engine.submit(interactive(100, "a")).unwrap_or_else(|e| {
        panic!(
            "flow a refused beside b's backlog of {}: {e}",
            backlog.len()
        )
    });
    // Its next one is behind its first and two of b's: refused once that is
    // past 0.4 s, and in any case predicted no longer than b's refused one.
    if let Err(EngineError::QueueWaitTooLong { predicted_s, .. }) =
        engine.submit(interactive(101, "a"))
    {
        assert!(
            predicted_s <= refused_wait + 1e-9,
            "{predicted_s} > {refused_wait}"
        );
    }
    let rejected = engine.stats().rejected.interactive;
    assert!((1..=2).contains(&rejected), "{rejected}");
    drop((a, backlog, occupant));
    engine.shutdown();
}
