//! The router's `/metrics`: its families declared once (below) and rendered with
//! `sloserve_api::prom`'s writer — per replica in flight, outstanding work,
//! health, requests, errors and ejections; per fleet the TTFT histogram as seen
//! by the router, retries; spilled requests.

use sloserve_api::prom::Writer;

use crate::backend::BackendStats;
use crate::histogram::BUCKETS;
use crate::picker::Picker;

sloserve_api::families! { ALL;
    BACKEND_IN_FLIGHT = Gauge "sloserve_router:backend_in_flight" ["fleet", "backend"]
        "Requests in flight on the replica.";
    BACKEND_OUTSTANDING_TOKENS = Gauge "sloserve_router:backend_outstanding_tokens" ["fleet", "backend"]
        "Prompt + max tokens of the requests in flight.";
    BACKEND_HEALTHY = Gauge "sloserve_router:backend_healthy" ["fleet", "backend"]
        "1 while the replica takes requests, 0 while ejected.";
    BACKEND_REQUESTS = Counter "sloserve_router:backend_requests_total" ["fleet", "backend"]
        "Requests sent to the replica (retries included).";
    BACKEND_ERRORS = Counter "sloserve_router:backend_errors_total" ["fleet", "backend"]
        "Connection errors and 5xx answers from the replica.";
    BACKEND_EJECTIONS = Counter "sloserve_router:backend_ejections_total" ["fleet", "backend"]
        "Times the replica was ejected.";
    TTFT = Histogram "sloserve_router:time_to_first_token_seconds" ["fleet"]
        "Time from the router receiving a request to the first byte of its answer.";
    RETRIES = Counter "sloserve_router:retries_total" ["fleet"]
        "Requests retried on another replica after a failure before the first byte.";
    SPILLED = Counter "sloserve_router:spilled_total" []
        "Batch requests sent to an idle interactive replica.";
}

/// The exposition text.
pub fn render(picker: &Picker, spilled: u64) -> String {
    let mut w = Writer::with_capacity(4096);
    type Field = fn(&BackendStats) -> f64;
    let per_backend: [(&sloserve_api::prom::Family, Field); 6] = [
        (&BACKEND_IN_FLIGHT, |s| s.in_flight as f64),
        (&BACKEND_OUTSTANDING_TOKENS, |s| s.work as f64),
        (&BACKEND_HEALTHY, |s| f64::from(u8::from(s.healthy))),
        (&BACKEND_REQUESTS, |s| s.requests as f64),
        (&BACKEND_ERRORS, |s| s.errors as f64),
        (&BACKEND_EJECTIONS, |s| s.ejections as f64),
    ];
    for (family, f) in per_backend {
        w.head(family);
        for b in picker.all_backends() {
            w.sample(family, &[&b.fleet, &b.url], f(&b.stats()));
        }
    }
    w.head(&TTFT);
    for f in &picker.fleets {
        let h = f.ttft();
        w.histogram(&TTFT, &[&f.name], &BUCKETS, h.counts(), h.sum(), h.count());
    }
    w.head(&RETRIES);
    for f in &picker.fleets {
        w.sample(&RETRIES, &[&f.name], f.retries() as f64);
    }
    w.single(&SPILLED, &[], spilled as f64);
    w.into_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use sloserve_slo::SloClass;

    #[test]
    fn renders_every_family_per_backend_and_fleet() {
        let cfg = RouterConfig::with_fleets(&[
            ("interactive", &["http://a:1".into()]),
            ("batch", &["http://b:2".into()]),
        ])
        .unwrap();
        let p = Picker::new(&cfg);
        let _l = p.fleets[0].backends[0].lease(10, SloClass::Interactive);
        p.fleets[1].observe_ttft(0.004);
        p.fleets[1].count_retry();
        let t = render(&p, 3);
        for line in [
            "sloserve_router:backend_in_flight{fleet=\"interactive\",backend=\"http://a:1\"} 1",
            "sloserve_router:backend_outstanding_tokens{fleet=\"interactive\",backend=\"http://a:1\"} 10",
            "sloserve_router:backend_healthy{fleet=\"batch\",backend=\"http://b:2\"} 1",
            "sloserve_router:backend_requests_total{fleet=\"interactive\",backend=\"http://a:1\"} 1",
            "sloserve_router:time_to_first_token_seconds_bucket{fleet=\"batch\",le=\"0.0025\"} 0",
            "sloserve_router:time_to_first_token_seconds_bucket{fleet=\"batch\",le=\"0.005\"} 1",
            "sloserve_router:time_to_first_token_seconds_count{fleet=\"interactive\"} 0",
            "sloserve_router:retries_total{fleet=\"batch\"} 1",
            "sloserve_router:spilled_total 3",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line}\n{t}");
        }
    }
}
