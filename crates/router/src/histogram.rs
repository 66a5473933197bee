//! The router's latency histogram (TTFT per fleet and replica): fixed buckets,
//! read by `metrics.rs`.

/// Seconds; the server's buckets (5 ms to 60 s) plus finer ones for the router's
/// own overhead.
pub const BUCKETS: [f64; 22] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
    5.0, 10.0, 15.0, 20.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Observations per bucket (not cumulative).
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }
}
