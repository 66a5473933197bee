//! [`resolve`]: the one rule that turns what a request asked for into the class and
//! targets it runs under.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::asked::Asked;
use crate::class::SloClass;

/// The latency targets a request runs under (interactive requests only; batch
/// requests have none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SloTargets {
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time per output token, milliseconds. `None` for an interactive request: the
    /// engine's relative bound (`max_batch_interference`) keeps its pace.
    pub tpot_ms: Option<f64>,
}

/// What a profile (or the router's config) decides for requests that ask nothing.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    /// `false`: every request runs as `default_class`, whatever it asked.
    pub classes: bool,
    pub default_class: SloClass,
    /// Inference objective -> class.
    pub objectives: &'a BTreeMap<String, SloClass>,
    pub default_ttft_ms: Option<f64>,
    pub default_tpot_ms: Option<f64>,
}

/// Body > header (both in `asked.class`) > objective > the policy's default class;
/// an interactive request gets its own targets, else the policy's defaults; a
/// batch request has none. (The key's ceiling was applied by [`Asked::cap`].)
pub fn resolve(asked: &Asked, policy: &Policy) -> (SloClass, SloTargets) {
    let objective = asked
        .objective
        .as_deref()
        .and_then(|o| policy.objectives.get(o.trim()));
    let class = match (policy.classes, asked.class.or(objective.copied())) {
        (true, Some(c)) => c,
        _ => policy.default_class,
    };
    let targets = match class {
        SloClass::Interactive => SloTargets {
            ttft_ms: asked.ttft_ms.or(policy.default_ttft_ms),
            tpot_ms: asked.tpot_ms.or(policy.default_tpot_ms),
        },
        SloClass::Batch => SloTargets::default(),
    };
    (class, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_is_asked_then_objective_then_default() {
        let objectives = BTreeMap::from([("bulk".to_string(), SloClass::Batch)]);
        let policy = Policy {
            classes: true,
            default_class: SloClass::Interactive,
            objectives: &objectives,
            default_ttft_ms: Some(500.0),
            default_tpot_ms: Some(50.0),
        };
        let mut a = Asked {
            objective: Some("bulk".into()),
            ..Asked::default()
        };
        assert_eq!(
            resolve(&a, &policy),
            (SloClass::Batch, SloTargets::default())
        );
        a.class = Some(SloClass::Interactive);
        a.tpot_ms = Some(30.0);
        let t = SloTargets {
            ttft_ms: Some(500.0),
            tpot_ms: Some(30.0),
        };
        assert_eq!(resolve(&a, &policy), (SloClass::Interactive, t));
        let off = Policy {
            classes: false,
            default_class: SloClass::Batch,
            ..policy
        };
        assert_eq!(resolve(&a, &off).0, SloClass::Batch);
        assert_eq!(resolve(&Asked::default(), &policy).0, SloClass::Interactive);
    }
}
