//! The workload: a reproducible list of requests (prompt, `max_tokens`, SLO class) built from a dataset.

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::dataset::{load_samples, Message};
use crate::spec::WorkloadSpec;

/// Requests generated when a run is bounded by `--duration` only (they are reused in a cycle).
pub const DURATION_POOL: usize = 1000;

/// `--slo-class interactive=0.7,batch=0.3`: each request's class is drawn with these weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClassMix {
    pub classes: Vec<(String, f64)>,
}

impl ClassMix {
    /// Draw a class name.
    pub fn pick(&self, rng: &mut StdRng) -> String {
        let total: f64 = self.classes.iter().map(|c| c.1).sum();
        let mut x = rng.random_range(0.0..total);
        for (name, w) in &self.classes {
            if x < *w {
                return name.clone();
            }
            x -= w;
        }
        self.classes.last().map(|c| c.0.clone()).unwrap_or_default()
    }
}

impl FromStr for ClassMix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut classes = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, w) = match part.split_once('=') {
                Some((n, w)) => (
                    n.trim(),
                    w.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("bad class weight in {part:?}"))?,
                ),
                None => (part, 1.0),
            };
            if name.is_empty() || !(w.is_finite() && w > 0.0) {
                return Err(format!(
                    "bad SLO class {part:?} (want NAME=WEIGHT with WEIGHT > 0)"
                ));
            }
            classes.push((name.to_string(), w));
        }
        if classes.is_empty() {
            return Err("empty --slo-class".into());
        }
        Ok(ClassMix { classes })
    }
}

impl fmt::Display for ClassMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .classes
            .iter()
            .map(|(n, w)| format!("{n}={w}"))
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl TryFrom<String> for ClassMix {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<ClassMix> for String {
    fn from(v: ClassMix) -> String {
        v.to_string()
    }
}

/// One request to send.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    pub messages: Vec<Message>,
    /// Estimated prompt tokens (words), for when the server reports no usage.
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub class: Option<String>,
}

impl RequestSpec {
    /// The prompt for `/v1/completions`: message contents joined by blank lines.
    pub fn prompt_text(&self) -> String {
        let parts: Vec<&str> = self.messages.iter().map(|m| m.content.as_str()).collect();
        parts.join("\n\n")
    }
}

/// `n` requests of `spec` (dataset, lengths, class mix), the same for the same `--seed`.
/// Classes are drawn from their own random stream, so adding a mix does not change the prompts.
pub fn workload(spec: &WorkloadSpec, n: usize) -> anyhow::Result<Vec<RequestSpec>> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut class_rng = StdRng::seed_from_u64(spec.seed ^ 0x5105_c1a5_5e5e_d000);
    let samples = load_samples(spec, n, &mut rng)?;
    Ok(samples
        .into_iter()
        .map(|s| RequestSpec {
            class: s
                .class
                .or_else(|| spec.slo_class.as_ref().map(|m| m.pick(&mut class_rng))),
            messages: s.messages,
            prompt_tokens: s.prompt_tokens,
            max_tokens: s.output_len.max(1),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_mix_parses_and_draws_by_weight() {
        let m: ClassMix = "interactive=0.7,batch=0.3".parse().unwrap();
        assert_eq!(m.to_string(), "interactive=0.7,batch=0.3");
        let mut rng = StdRng::seed_from_u64(1);
        let n = 10_000;
        let inter = (0..n).filter(|_| m.pick(&mut rng) == "interactive").count();
        let frac = inter as f64 / n as f64;
        assert!((frac - 0.7).abs() < 0.03, "{frac}");
        assert_eq!(
            "solo".parse::<ClassMix>().unwrap().classes,
            vec![("solo".to_string(), 1.0)]
        );
        assert!("a=0".parse::<ClassMix>().is_err());
        assert!("".parse::<ClassMix>().is_err());
    }
}
