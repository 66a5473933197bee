//! SLO targets (`--slo ttft_p95=500ms,tpot_p50=66ms`): parsing and the per-request goodness test.
//!
//! A target names a metric (`ttft`, `tpot`, `itl`, `e2el`/`e2e`), optionally a
//! percentile (`_p95`, `_p50`, `_p99.9`), and a threshold (`500ms`, `0.5s`,
//! `800us`; a bare number is milliseconds, as in `vllm bench serve
//! --goodput`).
//!
//! * Per request (goodput, SLO attainment): a request is good when, for every
//!   metric with a target, its own value is within that metric's threshold. A
//!   request with a single output token has no TPOT and passes the TPOT test
//!   (vLLM counts its TPOT as 0). ITL targets are aggregate-only: they do not
//!   enter per-request goodness. When one metric has several targets (say
//!   `ttft_p50=200ms,ttft_p99=1s`), a bare `ttft=` target wins, otherwise the
//!   loosest threshold is the per-request one.
//! * Aggregate: a target with a percentile is met when that percentile of the
//!   metric over all successful requests is within the threshold.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The latency metric a target applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SloMetric {
    Ttft,
    Tpot,
    Itl,
    E2el,
}

impl SloMetric {
    pub fn name(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Tpot => "tpot",
            SloMetric::Itl => "itl",
            SloMetric::E2el => "e2el",
        }
    }
}

/// One target: `metric[_pP]=threshold`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloTarget {
    pub metric: SloMetric,
    /// The percentile the aggregate check uses; `None` for a per-request-only target.
    pub percentile: Option<f64>,
    pub threshold_ms: f64,
}

impl fmt::Display for SloTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.metric.name())?;
        if let Some(p) = self.percentile {
            write!(f, "_p{p}")?;
        }
        write!(f, "={}ms", self.threshold_ms)
    }
}

/// All targets given with `--slo`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SloSpec {
    pub targets: Vec<SloTarget>,
}

impl SloSpec {
    /// The per-request threshold (ms) for `metric`, if any target names it.
    /// ITL has none: it is aggregate-only.
    pub fn per_request_threshold_ms(&self, metric: SloMetric) -> Option<f64> {
        if metric == SloMetric::Itl {
            return None;
        }
        let of_metric = self.targets.iter().filter(|t| t.metric == metric);
        if let Some(bare) = of_metric.clone().find(|t| t.percentile.is_none()) {
            return Some(bare.threshold_ms);
        }
        of_metric.map(|t| t.threshold_ms).reduce(f64::max)
    }

    /// Whether a request with these values (ms; `None` = not defined for this
    /// request, which passes) meets every per-request threshold.
    pub fn request_is_good(
        &self,
        ttft_ms: Option<f64>,
        tpot_ms: Option<f64>,
        e2el_ms: Option<f64>,
    ) -> bool {
        let within =
            |metric, value: Option<f64>| match (self.per_request_threshold_ms(metric), value) {
                (Some(limit), Some(v)) => v <= limit,
                _ => true,
            };
        within(SloMetric::Ttft, ttft_ms)
            && within(SloMetric::Tpot, tpot_ms)
            && within(SloMetric::E2el, e2el_ms)
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

fn parse_threshold_ms(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e3)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad SLO threshold {s:?} (want e.g. 500ms, 0.5s)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("SLO threshold {s:?} must be positive"));
    }
    Ok(v * scale)
}

impl FromStr for SloTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| format!("bad SLO target {s:?} (want e.g. ttft_p95=500ms)"))?;
        let key = key.trim().to_ascii_lowercase();
        let (metric, pct) = match key.split_once("_p") {
            Some((m, p)) => (m.to_string(), Some(p.to_string())),
            None => (key.clone(), None),
        };
        let metric = match metric.as_str() {
            "ttft" => SloMetric::Ttft,
            "tpot" => SloMetric::Tpot,
            "itl" => SloMetric::Itl,
            "e2el" | "e2e" => SloMetric::E2el,
            other => {
                return Err(format!(
                    "unknown SLO metric {other:?} (ttft, tpot, itl, e2el)"
                ))
            }
        };
        let percentile = match pct {
            None => None,
            Some(p) => {
                let p: f64 = p
                    .parse()
                    .map_err(|_| format!("bad percentile in {key:?}"))?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(format!("percentile in {key:?} must be within 0..=100"));
                }
                Some(p)
            }
        };
        if metric == SloMetric::Itl && percentile.is_none() {
            return Err(
                "ITL targets need a percentile (e.g. itl_p99=100ms): ITL is aggregate-only".into(),
            );
        }
        Ok(SloTarget {
            metric,
            percentile,
            threshold_ms: parse_threshold_ms(value)?,
        })
    }
}

impl FromStr for SloSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let targets = s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(SloTarget::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SloSpec { targets })
    }
}

impl fmt::Display for SloSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.targets.iter().map(|t| t.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

impl TryFrom<String> for SloSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<SloSpec> for String {
    fn from(s: SloSpec) -> String {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets_and_units() {
        let s: SloSpec = "ttft_p95=500ms,tpot_p50=66ms,e2e=2s,itl_p99.9=800us,ttft=700"
            .parse()
            .unwrap();
        assert_eq!(s.targets.len(), 5);
        assert_eq!(
            s.targets[0],
            SloTarget {
                metric: SloMetric::Ttft,
                percentile: Some(95.0),
                threshold_ms: 500.0
            }
        );
        assert_eq!(s.targets[1].threshold_ms, 66.0);
        assert_eq!(s.targets[2].metric, SloMetric::E2el);
        assert_eq!(s.targets[2].threshold_ms, 2000.0);
        assert_eq!(s.targets[3].percentile, Some(99.9));
        assert!((s.targets[3].threshold_ms - 0.8).abs() < 1e-12);
        // A bare target wins for per-request goodness.
        assert_eq!(s.per_request_threshold_ms(SloMetric::Ttft), Some(700.0));
        assert_eq!(s.per_request_threshold_ms(SloMetric::Itl), None);
        let again: SloSpec = s.to_string().parse().unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn rejects_bad_targets() {
        for bad in [
            "ttft",
            "foo=1ms",
            "ttft_p101=1ms",
            "ttft=-1ms",
            "itl=5ms",
            "tpot=abc",
        ] {
            assert!(bad.parse::<SloSpec>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn loosest_percentile_threshold_is_per_request() {
        let s: SloSpec = "ttft_p50=200ms,ttft_p99=1s".parse().unwrap();
        assert_eq!(s.per_request_threshold_ms(SloMetric::Ttft), Some(1000.0));
        assert!(s.request_is_good(Some(999.0), None, None));
        assert!(!s.request_is_good(Some(1001.0), None, None));
        // Undefined TPOT (one output token) passes.
        let t: SloSpec = "tpot=10ms".parse().unwrap();
        assert!(t.request_is_good(Some(5000.0), None, Some(9000.0)));
        assert!(!t.request_is_good(None, Some(10.5), None));
    }
}
