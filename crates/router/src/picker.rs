//! Choosing a replica: the fleet for a request's class (with spill-over of batch
//! requests to idle interactive replicas), then within it prefix affinity by
//! consistent hashing with bounded load over least outstanding work.

use std::sync::Arc;

use sloserve_slo::SloClass;

use crate::backend::{Backend, Fleet};
use crate::config::{Policy, RouterConfig};

/// What the picker needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct Demand {
    pub class: SloClass,
    /// Hash of the prompt's first aligned chunk, if it has one.
    pub key: Option<u64>,
    /// Estimated prompt + max tokens.
    pub work: u64,
}

/// The fleets and how to choose among them.
pub struct Picker {
    pub fleets: Vec<Fleet>,
    policy: Policy,
    load_factor: f64,
    spill_over: bool,
    spill_max_inflight: usize,
}

impl Picker {
    pub fn new(cfg: &RouterConfig) -> Self {
        Picker {
            fleets: cfg.fleets.iter().map(Fleet::new).collect(),
            policy: cfg.policy,
            load_factor: cfg.load_factor,
            spill_over: cfg.spill_over,
            spill_max_inflight: cfg.spill_max_inflight,
        }
    }

    /// The fleet named like the class, else the first fleet.
    pub fn fleet_for(&self, class: SloClass) -> &Fleet {
        self.fleet_named(class.as_str()).unwrap_or(&self.fleets[0])
    }

    pub fn fleet_named(&self, name: &str) -> Option<&Fleet> {
        self.fleets.iter().find(|f| f.name == name)
    }

    /// Every replica of every fleet.
    pub fn all_backends(&self) -> impl Iterator<Item = &Arc<Backend>> {
        self.fleets.iter().flat_map(|f| f.backends.iter())
    }

    /// A replica for `d`, never `exclude`; `None` when none is healthy. Returns the
    /// fleet it belongs to (an interactive one for a spilled batch request).
    pub fn pick(
        &self,
        d: &Demand,
        exclude: Option<&Arc<Backend>>,
    ) -> Option<(&Fleet, Arc<Backend>)> {
        let fleet = self.fleet_for(d.class);
        if d.class == SloClass::Batch && self.spill_over {
            if let Some(b) = self.spill_target(fleet, exclude) {
                let home = self.fleet_named(&b.fleet).unwrap_or(fleet);
                return Some((home, b));
            }
        }
        self.pick_in(fleet, d, exclude).map(|b| (fleet, b))
    }

    /// An idle interactive replica for a batch request, when every replica of the
    /// batch fleet is already busy.
    fn spill_target(&self, batch: &Fleet, exclude: Option<&Arc<Backend>>) -> Option<Arc<Backend>> {
        let interactive = self.fleet_named(SloClass::Interactive.as_str())?;
        if std::ptr::eq(interactive, batch) {
            return None;
        }
        let batch_idle = candidates(batch, exclude).any(|b| b.in_flight() == 0);
        if batch_idle {
            return None;
        }
        candidates(interactive, exclude)
            .filter(|b| b.in_flight_interactive() == 0 && b.in_flight() < self.spill_max_inflight)
            .min_by_key(|b| b.in_flight())
            .cloned()
    }

    /// A replica of `fleet` by the policy.
    pub fn pick_in(
        &self,
        fleet: &Fleet,
        d: &Demand,
        exclude: Option<&Arc<Backend>>,
    ) -> Option<Arc<Backend>> {
        let n = candidates(fleet, exclude).count();
        if n == 0 {
            return None;
        }
        let chosen = match (self.policy, d.key) {
            (Policy::RoundRobin, _) => candidates(fleet, exclude).nth(fleet.next_turn() % n),
            (Policy::Affinity, Some(key)) => {
                // Bounded load: the first replica clockwise from the key whose
                // outstanding work is within `load_factor` x the mean (counting this
                // request), so a hot prefix spreads instead of queueing.
                let total: u64 = candidates(fleet, exclude).map(|b| b.work()).sum();
                let bound = self.load_factor * (total + d.work) as f64 / n as f64;
                fleet
                    .ring_walk(key)
                    .map(|i| &fleet.backends[i])
                    .filter(|b| usable(b, exclude))
                    .find(|b| b.work() as f64 <= bound)
                    .or_else(|| least_work(fleet, exclude))
            }
            _ => least_work(fleet, exclude),
        };
        chosen.cloned()
    }
}

fn usable(b: &Arc<Backend>, exclude: Option<&Arc<Backend>>) -> bool {
    b.is_healthy() && !exclude.is_some_and(|x| Arc::ptr_eq(x, b))
}

fn candidates<'a>(
    fleet: &'a Fleet,
    exclude: Option<&'a Arc<Backend>>,
) -> impl Iterator<Item = &'a Arc<Backend>> + 'a {
    fleet.backends.iter().filter(move |b| usable(b, exclude))
}

fn least_work<'a>(fleet: &'a Fleet, exclude: Option<&'a Arc<Backend>>) -> Option<&'a Arc<Backend>> {
    candidates(fleet, exclude).min_by_key(|b| (b.work(), b.in_flight()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picker(policy: Policy, spill: bool) -> Picker {
        let urls = |p: &str| {
            (0..2)
                .map(|i| format!("http://{p}{i}:1"))
                .collect::<Vec<_>>()
        };
        let mut cfg =
            RouterConfig::with_fleets(&[("interactive", &urls("i")), ("batch", &urls("b"))])
                .unwrap();
        cfg.policy = policy;
        cfg.spill_over = spill;
        Picker::new(&cfg)
    }

    fn demand(class: SloClass, key: Option<u64>) -> Demand {
        Demand {
            class,
            key,
            work: 100,
        }
    }

    #[test]
    fn affinity_keeps_a_prefix_on_one_replica_until_it_is_overloaded() {
        let p = picker(Policy::Affinity, false);
        let d = demand(SloClass::Interactive, Some(42));
        let (f, first) = p.pick(&d, None).unwrap();
        assert_eq!(f.name, "interactive");
        // Sequential requests of one prefix: always the same replica.
        for _ in 0..5 {
            assert!(Arc::ptr_eq(&p.pick(&d, None).unwrap().1, &first));
        }
        // Concurrent ones: the owner takes work up to 1.25x the mean, then the other.
        let mut leases = vec![first.lease(100, SloClass::Interactive)];
        let second = p.pick(&d, None).unwrap().1;
        assert!(Arc::ptr_eq(&second, &first), "100 <= 1.25 * 200 / 2");
        leases.push(second.lease(100, SloClass::Interactive));
        let third = p.pick(&d, None).unwrap().1;
        assert!(!Arc::ptr_eq(&third, &first), "200 > 1.25 * 300 / 2");
        // Excluding the owner (a retry) or ejecting it moves the request.
        drop(leases);
        assert!(!Arc::ptr_eq(&p.pick(&d, Some(&first)).unwrap().1, &first));
        first.report_check(false, "test");
        assert!(!Arc::ptr_eq(&p.pick(&d, None).unwrap().1, &first));
        p.fleets[0].backends[1].report_check(false, "test");
        assert!(p.pick(&d, None).is_none(), "no healthy replica");
    }

    #[test]
    fn classes_go_to_their_fleets_and_batch_spills_only_onto_idle_interactive_replicas() {
        let p = picker(Policy::LeastWork, true);
        let b = demand(SloClass::Batch, None);
        let (f, b0) = p.pick(&b, None).unwrap();
        assert_eq!(f.name, "batch", "an idle batch replica comes first");
        let _l0 = b0.lease(100, SloClass::Batch);
        let (_, b1) = p.pick(&b, None).unwrap();
        let _l1 = b1.lease(100, SloClass::Batch);
        let i0 = &p.fleets[0].backends[0];
        let _busy = i0.lease(100, SloClass::Interactive);
        let (f, spilled) = p.pick(&b, None).unwrap();
        assert_eq!(f.name, "interactive");
        assert!(Arc::ptr_eq(&spilled, &p.fleets[0].backends[1]));
        let _l2 = spilled.lease(100, SloClass::Batch);
        let _l3 = p.fleets[0].backends[1].lease(100, SloClass::Interactive);
        assert_eq!(
            p.pick(&b, None).unwrap().0.name,
            "batch",
            "no idle interactive replica"
        );
        let rr = picker(Policy::RoundRobin, false);
        let d = demand(SloClass::Interactive, Some(7));
        let a = rr.pick(&d, None).unwrap().1;
        let c = rr.pick(&d, None).unwrap().1;
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
