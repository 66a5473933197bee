//! Fair order within a class's waiting queue: start-time fair queuing over flows
//! (the gateway's fairness id, `Request::fairness`), one unit of cost per request.
//!
//! An arriving request of flow `f` gets the tag `max(V, last(f)) + 1`, where `V`
//! (the class's virtual time) is the tag of the latest request that left the
//! queue for the running set and `last(f)` the latest tag `f` was given; the
//! queue is kept ordered by tag, ties by arrival. A flow that queues N requests
//! at once takes tags `V+1 .. V+N`, and another flow's request arriving after
//! them gets `V+1`: it starts within the next two starts, not after all N. With
//! one flow (no request carries an id) every tag is its predecessor's plus one:
//! exactly first come first served. Requeued (preempted) sequences keep their
//! place at the front: their tags are at most `V`.
//!
//! State is kept only for flows with a never-started request waiting (pruned as
//! the last one leaves), so it is bounded by the waiting queue: a flow whose
//! requests all started had `last(f) <= V`, and forgetting it changes no tag.

use std::collections::{HashMap, VecDeque};

use crate::sequence::Sequence;

/// One class's fair-queuing state.
#[derive(Debug, Default)]
pub(super) struct FairQueue {
    /// The tag of the latest request that left the queue for the running set.
    vtime: u64,
    /// Flows with a never-started request waiting.
    flows: HashMap<Box<str>, Flow>,
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    /// The latest tag given to one of its requests.
    last_tag: u64,
    /// Its never-started requests in the queue.
    waiting: usize,
}

impl FairQueue {
    /// Tags a new arrival of `flow` and counts it as waiting.
    pub fn arrive(&mut self, flow: &str) -> u64 {
        if let Some(f) = self.flows.get_mut(flow) {
            f.last_tag = f.last_tag.max(self.vtime) + 1;
            f.waiting += 1;
            return f.last_tag;
        }
        let tag = self.vtime + 1;
        let f = Flow {
            last_tag: tag,
            waiting: 1,
        };
        self.flows.insert(flow.into(), f);
        tag
    }

    /// Never-started sequence `s` left the queue: to start (the virtual time moves
    /// to its tag) or to end (shed, cancelled, timed out, failed).
    pub fn leave(&mut self, s: &Sequence, started: bool) {
        if started {
            self.vtime = self.vtime.max(s.fair_tag());
        }
        let flow = s.flow();
        if let Some(f) = self.flows.get_mut(flow) {
            f.waiting -= 1;
            if f.waiting == 0 {
                self.flows.remove(flow);
            }
        }
    }

    /// Flows with a never-started request waiting.
    #[cfg(test)]
    pub fn num_flows(&self) -> usize {
        self.flows.len()
    }
}

/// Where a new sequence tagged `tag` goes in its queue: after every sequence whose
/// tag is not above it (the requeued ones in front, then arrivals by tag, ties by
/// arrival).
pub(super) fn position(q: &VecDeque<Sequence>, tag: u64) -> usize {
    q.partition_point(|s| s.fair_tag() <= tag)
}
