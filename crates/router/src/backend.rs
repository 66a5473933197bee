//! Replicas and fleets as the router sees them: per replica the outstanding work
//! (in-flight requests and their prompt + max tokens), health (ejection and
//! re-admission) and counters; per fleet the consistent-hash ring, TTFT histogram
//! and retries. State changes only through the methods here.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sloserve_slo::SloClass;

use crate::config::FleetConfig;
use crate::histogram::Histogram;

/// Points on the hash ring per replica.
const VNODES: u64 = 64;

/// One replica.
#[derive(Debug)]
pub struct Backend {
    pub url: String,
    pub fleet: String,
    in_flight: AtomicUsize,
    /// In-flight interactive requests (spill-over only uses replicas with none).
    in_flight_interactive: AtomicUsize,
    work: AtomicU64,
    healthy: AtomicBool,
    consecutive_failures: AtomicU32,
    requests: AtomicU64,
    errors: AtomicU64,
    ejections: AtomicU64,
}

/// A snapshot of one replica for `/metrics`.
pub struct BackendStats {
    pub in_flight: usize,
    pub work: u64,
    pub healthy: bool,
    pub requests: u64,
    pub errors: u64,
    pub ejections: u64,
}

impl Backend {
    fn new(url: &str, fleet: &str) -> Self {
        Backend {
            url: url.to_owned(),
            fleet: fleet.to_owned(),
            in_flight: AtomicUsize::new(0),
            in_flight_interactive: AtomicUsize::new(0),
            work: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn in_flight_interactive(&self) -> usize {
        self.in_flight_interactive.load(Ordering::Acquire)
    }

    /// Outstanding work: the prompt + max tokens of the requests in flight.
    pub fn work(&self) -> u64 {
        self.work.load(Ordering::Acquire)
    }

    /// Counts a request of `work` tokens in flight until the lease is dropped.
    pub fn lease(self: &Arc<Self>, work: u64, class: SloClass) -> Lease {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if class == SloClass::Interactive {
            self.in_flight_interactive.fetch_add(1, Ordering::AcqRel);
        }
        self.work.fetch_add(work, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
        Lease {
            backend: self.clone(),
            work,
            class,
        }
    }

    /// A request failed here (connection error or 5xx): counts it and ejects the
    /// replica after `eject_after` such failures in a row.
    pub fn report_failure(&self, eject_after: u32, why: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let n = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= eject_after {
            self.eject(why);
        }
    }

    /// A request got an answer that is not a server failure.
    pub fn report_success(&self) {
        self.consecutive_failures.store(0, Ordering::Release);
    }

    /// The result of an active check: ejects on failure, re-admits on success.
    pub fn report_check(&self, ok: bool, why: &str) {
        if ok {
            if !self.healthy.swap(true, Ordering::AcqRel) {
                self.consecutive_failures.store(0, Ordering::Release);
                tracing::info!(backend = %self.url, fleet = %self.fleet, "replica re-admitted");
            }
        } else {
            self.eject(why);
        }
    }

    fn eject(&self, why: &str) {
        if self.healthy.swap(false, Ordering::AcqRel) {
            self.ejections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(backend = %self.url, fleet = %self.fleet, why, "replica ejected");
        }
    }

    pub fn stats(&self) -> BackendStats {
        BackendStats {
            in_flight: self.in_flight(),
            work: self.work(),
            healthy: self.is_healthy(),
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            ejections: self.ejections.load(Ordering::Relaxed),
        }
    }
}

/// A request counted in flight on a replica; dropping it ends the count.
#[derive(Debug)]
pub struct Lease {
    backend: Arc<Backend>,
    work: u64,
    class: SloClass,
}

impl Lease {
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let b = &self.backend;
        b.in_flight.fetch_sub(1, Ordering::AcqRel);
        if self.class == SloClass::Interactive {
            b.in_flight_interactive.fetch_sub(1, Ordering::AcqRel);
        }
        b.work.fetch_sub(self.work, Ordering::AcqRel);
    }
}

/// A fleet: its replicas, their ring, and what the router measured for it.
#[derive(Debug)]
pub struct Fleet {
    pub name: String,
    pub backends: Vec<Arc<Backend>>,
    /// (point, backend index), sorted by point.
    ring: Vec<(u64, usize)>,
    next: AtomicUsize,
    retries: AtomicU64,
    ttft: Mutex<Histogram>,
}

impl Fleet {
    pub fn new(cfg: &FleetConfig) -> Self {
        let backends: Vec<_> = cfg
            .urls
            .iter()
            .map(|u| Arc::new(Backend::new(u, &cfg.name)))
            .collect();
        let mut ring: Vec<(u64, usize)> = backends
            .iter()
            .enumerate()
            .flat_map(|(i, b)| (0..VNODES).map(move |v| (hash_str(&format!("{}#{v}", b.url)), i)))
            .collect();
        ring.sort_unstable();
        Fleet {
            name: cfg.name.clone(),
            backends,
            ring,
            next: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::default()),
        }
    }

    /// Backend indices in ring order starting at `key`'s point, each once.
    pub fn ring_walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.ring.partition_point(|&(p, _)| p < key);
        let mut seen = vec![false; self.backends.len()];
        (0..self.ring.len())
            .map(move |i| self.ring[(start + i) % self.ring.len()].1)
            .filter(move |&i| !std::mem::replace(&mut seen[i], true))
    }

    /// The next index of a round-robin turn.
    pub fn next_turn(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    pub fn observe_ttft(&self, secs: f64) {
        self.ttft.lock().unwrap().observe(secs);
    }

    pub fn ttft(&self) -> Histogram {
        self.ttft.lock().unwrap().clone()
    }
}

/// FNV-1a with a splitmix64 finish: stable across runs and builds.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

pub fn hash_str(s: &str) -> u64 {
    hash_bytes(s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_count_work_and_ejection_needs_consecutive_failures() {
        let f = Fleet::new(&FleetConfig {
            name: "interactive".into(),
            urls: vec!["http://a:1".into(), "http://b:2".into()],
        });
        let b = &f.backends[0];
        let l1 = b.lease(100, SloClass::Interactive);
        let l2 = b.lease(50, SloClass::Batch);
        assert_eq!(
            (b.in_flight(), b.in_flight_interactive(), b.work()),
            (2, 1, 150)
        );
        drop(l1);
        assert_eq!(
            (b.in_flight(), b.in_flight_interactive(), b.work()),
            (1, 0, 50)
        );
        drop(l2);
        assert_eq!(b.work(), 0);

        b.report_failure(2, "test");
        assert!(b.is_healthy());
        b.report_success();
        b.report_failure(2, "test");
        assert!(b.is_healthy(), "a success in between resets the count");
        b.report_failure(2, "test");
        assert!(!b.is_healthy());
        b.report_check(false, "still down");
        assert_eq!(b.stats().ejections, 1);
        b.report_check(true, "");
        assert!(b.is_healthy());
        assert_eq!(b.stats().errors, 3);

        let walk: Vec<_> = f.ring_walk(12345).collect();
        assert_eq!(walk.len(), 2);
        assert_ne!(walk[0], walk[1]);
    }
}
