//! Load generation: closed loop (`--concurrency N`) and open loop (`--request-rate R`, Poisson or gamma arrivals).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::record::RequestRecord;
use crate::sweep::fmt_rate;
use crate::workload::RequestSpec;

/// How requests are issued at one load point.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum LoadSpec {
    /// Keep `concurrency` requests in flight: each worker sends its next request when the last one ends.
    Closed { concurrency: usize },
    /// Send at `rate` requests/s regardless of completions (`inf` = all at
    /// once); inter-arrival times are gamma(shape = burstiness, mean = 1/rate),
    /// i.e. Poisson when burstiness = 1. `max_concurrency` caps requests in flight.
    Open {
        #[serde(with = "crate::sweep::rate_serde")]
        rate: f64,
        burstiness: f64,
        max_concurrency: Option<usize>,
    },
}

impl LoadSpec {
    /// `concurrency=4`, `rate=2.5`, `rate=inf`.
    pub fn label(&self) -> String {
        match self {
            LoadSpec::Closed { concurrency } => format!("concurrency={concurrency}"),
            LoadSpec::Open { rate, .. } => format!("rate={}", fmt_rate(*rate)),
        }
    }
}

/// Open-loop arrival offsets (seconds after the start), reproducible from a seed.
pub struct Arrivals {
    rng: StdRng,
    gamma: Option<Gamma<f64>>,
    t: f64,
}

impl Arrivals {
    pub fn new(rate: f64, burstiness: f64, seed: u64) -> Self {
        let gamma = rate
            .is_finite()
            .then(|| Gamma::new(burstiness, 1.0 / (rate * burstiness)).expect("gamma parameters"));
        Arrivals {
            rng: StdRng::seed_from_u64(seed),
            gamma,
            t: 0.0,
        }
    }
}

impl Iterator for Arrivals {
    type Item = f64;
    /// The first request goes at 0; each later one a gamma-distributed interval after the previous.
    fn next(&mut self) -> Option<f64> {
        let now = self.t;
        if let Some(g) = &self.gamma {
            self.t += g.sample(&mut self.rng);
        }
        Some(now)
    }
}

/// One measured run.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub load: LoadSpec,
    /// Stop after this many requests (None: only the duration bounds the run).
    pub num_requests: Option<usize>,
    /// Send no new request after this long.
    pub duration: Option<Duration>,
    /// Seed of open-loop arrivals.
    pub seed: u64,
}

/// Called as each request finishes (progress reporting).
pub type OnDone = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// Run `plan` over `work` (cycled when shorter than the run). Returns the
/// records sorted by id and the run's duration (start → last completion).
pub async fn drive(
    client: &Client,
    work: Arc<Vec<RequestSpec>>,
    plan: &RunPlan,
    on_done: OnDone,
) -> (Vec<RequestRecord>, f64) {
    assert!(!work.is_empty(), "empty workload");
    let t0 = Instant::now();
    let deadline = plan.duration.map(|d| t0 + d);
    let limit = plan.num_requests;
    let mut set: JoinSet<Vec<RequestRecord>> = JoinSet::new();
    match plan.load {
        LoadSpec::Closed { concurrency } => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..concurrency.max(1) {
                let (client, work, next, on_done) =
                    (client.clone(), work.clone(), next.clone(), on_done.clone());
                set.spawn(async move {
                    let mut out = Vec::new();
                    loop {
                        let issued = Instant::now();
                        if deadline.is_some_and(|d| issued >= d) {
                            break;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if limit.is_some_and(|n| i >= n) {
                            break;
                        }
                        let rec = client.send(i, &work[i % work.len()], t0, issued).await;
                        on_done(&rec);
                        out.push(rec);
                    }
                    out
                });
            }
        }
        LoadSpec::Open {
            rate,
            burstiness,
            max_concurrency,
        } => {
            let sem = max_concurrency.map(|m| Arc::new(Semaphore::new(m.max(1))));
            let arrivals = Arrivals::new(rate, burstiness, plan.seed);
            for (i, at) in arrivals.enumerate() {
                if limit.is_some_and(|n| i >= n) {
                    break;
                }
                let at = t0 + Duration::from_secs_f64(at);
                if deadline.is_some_and(|d| at >= d) {
                    break;
                }
                tokio::time::sleep_until(at.into()).await;
                let permit = match &sem {
                    Some(s) => Some(s.clone().acquire_owned().await.expect("semaphore")),
                    None => None,
                };
                // Waiting for a slot may have run past the deadline.
                let issued = Instant::now();
                if deadline.is_some_and(|d| issued >= d) {
                    break;
                }
                let (client, work, on_done) = (client.clone(), work.clone(), on_done.clone());
                set.spawn(async move {
                    let rec = client.send(i, &work[i % work.len()], t0, issued).await;
                    drop(permit);
                    on_done(&rec);
                    vec![rec]
                });
            }
        }
    }
    let mut records = Vec::new();
    while let Some(r) = set.join_next().await {
        records.extend(r.expect("request task panicked"));
    }
    let duration = t0.elapsed().as_secs_f64();
    records.sort_by_key(|r| r.id);
    (records, duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_requested_mean_rate() {
        for burstiness in [0.5, 1.0, 4.0] {
            let t: Vec<f64> = Arrivals::new(10.0, burstiness, 7).take(20_001).collect();
            assert_eq!(t[0], 0.0);
            assert!(t.windows(2).all(|w| w[1] >= w[0]));
            let mean_gap = t[20_000] / 20_000.0;
            assert!(
                (mean_gap - 0.1).abs() < 0.005,
                "burstiness {burstiness}: mean gap {mean_gap}"
            );
        }
        assert!(Arrivals::new(f64::INFINITY, 1.0, 0)
            .take(5)
            .all(|t| t == 0.0));
    }

    #[test]
    fn open_load_serializes_infinite_rate() {
        let l = LoadSpec::Open {
            rate: f64::INFINITY,
            burstiness: 1.0,
            max_concurrency: None,
        };
        let j = serde_json::to_string(&l).unwrap();
        assert!(j.contains("\"inf\""), "{j}");
        assert_eq!(serde_json::from_str::<LoadSpec>(&j).unwrap(), l);
    }
}
