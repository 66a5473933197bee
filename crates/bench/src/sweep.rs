//! Sweeps (`--sweep concurrency=1,2,4` / `--sweep rate=1,2,inf`) and rates that may be infinite.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `inf` or the number as written.
pub fn fmt_rate(r: f64) -> String {
    if r.is_infinite() {
        "inf".into()
    } else {
        format!("{r}")
    }
}

/// Serialize an f64 rate that may be infinite as `"inf"` (JSON has no infinity).
pub mod rate_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(r: &f64, s: S) -> Result<S::Ok, S::Error> {
        if r.is_finite() {
            s.serialize_f64(*r)
        } else {
            s.serialize_str("inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum R {
            N(f64),
            S(String),
        }
        match R::deserialize(d)? {
            R::N(n) => Ok(n),
            R::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// [`rate_serde`] for an optional rate.
pub mod opt_rate_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(r: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match r {
            Some(r) => super::rate_serde::serialize(r, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        struct W(#[serde(with = "super::rate_serde")] f64);
        Ok(Option::<W>::deserialize(d)?.map(|w| w.0))
    }
}

/// The swept variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepVar {
    Concurrency,
    Rate,
}

impl SweepVar {
    pub fn name(self) -> &'static str {
        match self {
            SweepVar::Concurrency => "concurrency",
            SweepVar::Rate => "rate",
        }
    }
}

/// `--sweep concurrency=1,2,4,8` or `--sweep rate=1,2,inf`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sweep {
    pub var: SweepVar,
    pub values: Vec<f64>,
}

impl FromStr for Sweep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (var, vals) = s
            .split_once('=')
            .ok_or_else(|| format!("bad sweep {s:?} (concurrency=1,2,4 or rate=1,2,inf)"))?;
        let var = match var.trim() {
            "concurrency" | "c" => SweepVar::Concurrency,
            "rate" | "request-rate" | "request_rate" => SweepVar::Rate,
            other => return Err(format!("can only sweep concurrency or rate, not {other:?}")),
        };
        let values = vals
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("bad sweep value {v:?}"))
            })
            .collect::<Result<Vec<f64>, _>>()?;
        let valid = |v: &f64| match var {
            SweepVar::Concurrency => v.is_finite() && *v >= 1.0 && v.fract() == 0.0,
            SweepVar::Rate => *v > 0.0,
        };
        if values.is_empty() || !values.iter().all(valid) {
            return Err(format!("bad sweep values in {s:?}: concurrency needs integers ≥ 1, rate positive numbers or inf"));
        }
        Ok(Sweep { var, values })
    }
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals: Vec<String> = self.values.iter().map(|v| fmt_rate(*v)).collect();
        write!(f, "{}={}", self.var.name(), vals.join(","))
    }
}

impl TryFrom<String> for Sweep {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Sweep> for String {
    fn from(v: Sweep) -> String {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_parses() {
        let s: Sweep = "concurrency=1,2,4".parse().unwrap();
        assert_eq!(
            s,
            Sweep {
                var: SweepVar::Concurrency,
                values: vec![1.0, 2.0, 4.0]
            }
        );
        let r: Sweep = "rate=0.5,inf".parse().unwrap();
        assert!(r.values[1].is_infinite());
        assert_eq!(r.to_string(), "rate=0.5,inf");
        assert!("concurrency=0".parse::<Sweep>().is_err());
        assert!("concurrency=1.5".parse::<Sweep>().is_err());
        assert!("batch=1".parse::<Sweep>().is_err());
    }
}
