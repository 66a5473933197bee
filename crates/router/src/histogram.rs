//! The router's latency histogram (TTFT per fleet and replica): fixed buckets,
//! written in Prometheus text.

use std::fmt::Write;

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

    pub fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (b, c) in BUCKETS.iter().zip(self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}
