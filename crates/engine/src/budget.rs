//! `StepBudget`: what one engine step may still take while it is planned: tokens
//! (`max_num_batched_tokens`) and, while interactive work bounds it, time (a
//! limit on the step's predicted seconds). It tracks the planned step's shape.

use crate::step_cost::{StepCostModel, StepShape};

/// The budget of the step being planned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepBudget {
    max: usize,
    shape: StepShape,
    /// Seconds the step may take (`None`: bounded in tokens only).
    limit: Option<f64>,
}

impl StepBudget {
    pub fn new(max_tokens: usize) -> Self {
        StepBudget {
            max: max_tokens,
            shape: StepShape::default(),
            limit: None,
        }
    }
    #[inline]
    pub fn remaining(&self) -> usize {
        self.max - self.shape.tokens()
    }
    #[inline]
    pub fn used(&self) -> usize {
        self.shape.tokens()
    }
    /// The planned step so far.
    #[inline]
    pub fn shape(&self) -> &StepShape {
        &self.shape
    }
    #[inline]
    pub fn limit(&self) -> Option<f64> {
        self.limit
    }
    /// Spends `part` (the caller checked `remaining`).
    #[inline]
    pub fn take(&mut self, part: StepShape) {
        assert!(part.tokens() <= self.remaining(), "step budget overdrawn");
        self.shape += part;
    }
    /// Lowers the step's token limit to `max` (never below what is already used).
    #[inline]
    pub fn cap(&mut self, max: usize) {
        self.max = self.max.min(max.max(self.used()));
    }
    /// Bounds the step's predicted time from now on.
    #[inline]
    pub fn set_limit(&mut self, secs: Option<f64>) {
        self.limit = secs;
    }
    /// Returns `part` (a planned sequence was preempted).
    #[inline]
    pub fn give_back(&mut self, part: StepShape) {
        self.shape -= part;
    }
    /// Whether adding `part` keeps the step within its time limit.
    #[inline]
    pub fn fits(&self, cost: &StepCostModel, part: StepShape) -> bool {
        self.limit
            .is_none_or(|l| cost.predict(&(self.shape + part)) <= l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(n: usize) -> StepShape {
        StepShape::of_seq(n, 0, false)
    }

    #[test]
    fn take_and_give_back() {
        let mut b = StepBudget::new(10);
        b.take(prefill(7));
        assert_eq!(b.remaining(), 3);
        b.give_back(prefill(2));
        assert_eq!((b.used(), b.remaining()), (5, 5));
    }

    #[test]
    fn cap_lowers_but_never_below_used() {
        let mut b = StepBudget::new(100);
        b.take(prefill(30));
        b.cap(50);
        assert_eq!(b.remaining(), 20);
        b.cap(10);
        assert_eq!(b.remaining(), 0);
        b.cap(80);
        assert_eq!(b.remaining(), 0, "a cap never raises the limit");
    }

    #[test]
    fn time_limit_bounds_fits() {
        let cost = StepCostModel::with_prior([0.01, 0.001, 0.002, 0.0, 0.0, 0.0]);
        let mut b = StepBudget::new(100);
        let row = StepShape::of_seq(1, 5, true);
        b.take(row);
        assert!(b.fits(&cost, prefill(90)), "no limit: tokens only");
        b.set_limit(Some(0.0165));
        assert!(b.fits(&cost, row + row)); // 0.01 + 3 * 0.002 = 0.016
        assert!(!b.fits(&cost, row + row + row));
    }

    #[test]
    #[should_panic(expected = "overdrawn")]
    fn cannot_overdraw() {
        StepBudget::new(1).take(prefill(2));
    }
}
