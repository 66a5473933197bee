//! The router's `/metrics` in Prometheus text format: per replica in flight,
//! outstanding work, health, requests, errors and ejections; per fleet the TTFT
//! histogram as seen by the router, retries and spilled requests.

use std::fmt::Write;

use crate::picker::Picker;

/// The exposition text.
pub fn render(picker: &Picker, spilled: u64) -> String {
    let mut out = String::with_capacity(4096);
    type Field = fn(&crate::backend::BackendStats) -> f64;
    let per_backend: [(&str, &str, &str, Field); 6] = [
        (
            "backend_in_flight",
            "gauge",
            "Requests in flight on the replica.",
            |s| s.in_flight as f64,
        ),
        (
            "backend_outstanding_tokens",
            "gauge",
            "Prompt + max tokens of the requests in flight.",
            |s| s.work as f64,
        ),
        (
            "backend_healthy",
            "gauge",
            "1 while the replica takes requests, 0 while ejected.",
            |s| f64::from(u8::from(s.healthy)),
        ),
        (
            "backend_requests_total",
            "counter",
            "Requests sent to the replica (retries included).",
            |s| s.requests as f64,
        ),
        (
            "backend_errors_total",
            "counter",
            "Connection errors and 5xx answers from the replica.",
            |s| s.errors as f64,
        ),
        (
            "backend_ejections_total",
            "counter",
            "Times the replica was ejected.",
            |s| s.ejections as f64,
        ),
    ];
    for (name, kind, help, f) in per_backend {
        let _ = writeln!(out, "# HELP sloserve_router:{name} {help}");
        let _ = writeln!(out, "# TYPE sloserve_router:{name} {kind}");
        for b in picker.all_backends() {
            let _ = writeln!(
                out,
                "sloserve_router:{name}{{fleet=\"{}\",backend=\"{}\"}} {}",
                b.fleet,
                b.url,
                f(&b.stats())
            );
        }
    }
    let name = "sloserve_router:time_to_first_token_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from the router receiving a request to the first byte of its answer."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for f in &picker.fleets {
        f.ttft()
            .write(&mut out, name, &format!("fleet=\"{}\"", f.name));
    }
    let name = "sloserve_router:retries_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests retried on another replica after a failure before the first byte."
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    for f in &picker.fleets {
        let _ = writeln!(out, "{name}{{fleet=\"{}\"}} {}", f.name, f.retries());
    }
    let name = "sloserve_router:spilled_total";
    let _ = writeln!(
        out,
        "# HELP {name} Batch requests sent to an idle interactive replica."
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {spilled}");
    out
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
