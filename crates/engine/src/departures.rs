//! `Departures`: how fast a waiting queue drains (requests and prompt tokens per
//! second while it has waiters, over a decaying window), for admission control.

/// The departure rate forgets with this time constant (seconds of engine time).
const DEPARTURE_WINDOW_S: f64 = 10.0;
/// Backlogged engine time needed before the departure rate is trusted.
const MIN_DEPARTURE_SAMPLE_S: f64 = 0.5;
/// A drain rate below this counts as this (a starved queue: very long waits).
const MIN_DEPARTURE_RATE: f64 = 1e-3;
/// Backlogged engine time with (next to) no departure before the queue counts
/// as starved. Less proves nothing: one slow step (a long prefill on a loaded
/// machine) can pass before the first waiter could have started at all.
const STARVED_AFTER_S: f64 = 5.0;
/// Departures (decayed weight) that make a drain rate, short of starvation.
const MIN_DEPARTURES: f64 = 0.5;

/// Requests (and their prompt tokens) leaving a class's waiting queue, started
/// or cancelled, per second of engine time during which the queue had waiters:
/// a decaying window, so a queue that stops draining soon predicts long waits.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Departures {
    requests: f64,
    tokens: f64,
    secs: f64,
}

impl Departures {
    pub fn observe(&mut self, requests: usize, tokens: usize, secs: f64) {
        let keep = (-secs / DEPARTURE_WINDOW_S).exp();
        self.requests = self.requests * keep + requests as f64;
        self.tokens = self.tokens * keep + tokens as f64;
        self.secs = self.secs * keep + secs;
    }

    /// (requests, prompt tokens) per second; `None` until enough backlogged
    /// time was seen, and until a request departed or the queue starved.
    pub fn rates(&self) -> Option<(f64, f64)> {
        let trusted = self.secs >= MIN_DEPARTURE_SAMPLE_S
            && (self.requests >= MIN_DEPARTURES || self.secs >= STARVED_AFTER_S);
        trusted.then(|| {
            (
                (self.requests / self.secs).max(MIN_DEPARTURE_RATE),
                (self.tokens / self.secs).max(MIN_DEPARTURE_RATE),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_need_enough_time_and_forget_a_queue_that_stopped() {
        let mut d = Departures::default();
        d.observe(1, 100, 0.3);
        assert_eq!(d.rates(), None, "0.3 s is too little to trust");
        d.observe(1, 100, 0.3);
        // Both steps decay alike: the rate is one request per 0.3 s.
        let (r, t) = d.rates().unwrap();
        assert!(
            (r - 1.0 / 0.3).abs() < 1e-9 && (t - 100.0 / 0.3).abs() < 1e-6,
            "{r} {t}"
        );
        for _ in 0..200 {
            d.observe(0, 0, 0.5);
        }
        let (r, _) = d.rates().unwrap();
        assert!(r < 0.01, "a queue that stopped draining: {r}");
        for _ in 0..10_000 {
            d.observe(0, 0, 0.5);
        }
        assert_eq!(d.rates().unwrap().0, MIN_DEPARTURE_RATE, "never 0");
    }

    #[test]
    fn a_slow_step_without_departures_is_no_evidence_but_a_starved_queue_is() {
        let mut d = Departures::default();
        // One 0.8 s step ended with a waiter that could not have started yet.
        d.observe(0, 0, 0.8);
        assert_eq!(d.rates(), None);
        d.observe(0, 0, 2.0);
        assert_eq!(
            d.rates(),
            None,
            "2.8 s without a departure: not yet starved"
        );
        for _ in 0..5 {
            d.observe(0, 0, 1.0);
        }
        let (r, _) = d.rates().unwrap();
        assert_eq!(r, MIN_DEPARTURE_RATE, "starved: {r}");
    }
}
