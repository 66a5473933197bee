//! `StepBudget`: the token budget of one engine step (`max_num_batched_tokens`).

/// Tokens still available in the step being planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepBudget {
    max: usize,
    used: usize,
}

impl StepBudget {
    pub fn new(max_tokens: usize) -> Self {
        StepBudget {
            max: max_tokens,
            used: 0,
        }
    }
    #[inline]
    pub fn remaining(&self) -> usize {
        self.max - self.used
    }
    #[inline]
    pub fn used(&self) -> usize {
        self.used
    }
    /// Spends `n` tokens (the caller checked `remaining`).
    #[inline]
    pub fn take(&mut self, n: usize) {
        assert!(n <= self.remaining(), "step budget overdrawn");
        self.used += n;
    }
    /// Lowers the step's limit to `max` (never below what is already used).
    #[inline]
    pub fn cap(&mut self, max: usize) {
        self.max = self.max.min(max.max(self.used));
    }
    /// Returns `n` tokens (a planned sequence was preempted).
    #[inline]
    pub fn give_back(&mut self, n: usize) {
        debug_assert!(n <= self.used);
        self.used -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_give_back() {
        let mut b = StepBudget::new(10);
        b.take(7);
        assert_eq!(b.remaining(), 3);
        b.give_back(2);
        assert_eq!((b.used(), b.remaining()), (5, 5));
    }

    #[test]
    fn cap_lowers_but_never_below_used() {
        let mut b = StepBudget::new(100);
        b.take(30);
        b.cap(50);
        assert_eq!(b.remaining(), 20);
        b.cap(10);
        assert_eq!(b.remaining(), 0);
        b.cap(80);
        assert_eq!(b.remaining(), 0, "a cap never raises the limit");
    }

    #[test]
    #[should_panic(expected = "overdrawn")]
    fn cannot_overdraw() {
        StepBudget::new(1).take(2);
    }
}
