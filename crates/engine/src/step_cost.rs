//! `StepCostModel`: what one engine step costs, learned online from the steps that
//! ran, so the scheduler can predict the time of a candidate step.
//!
//! A step's time is modelled as linear in its shape ([`StepShape`]): a fixed part,
//! plus seconds per prefill token, per decode row and per thousand (query token,
//! context token) pairs of attention, plus a jump when the step has more tokens
//! than the runner's small-batch path takes (`RunnerInfo::small_batch_max_tokens`;
//! none when 0), plus, for a mixture of experts (`RunnerInfo::experts`), seconds per
//! expert the step's tokens touch in a layer: each token is routed to `used` of
//! `count` experts, so a step of `t` tokens touches `count * (1 - (1 - used/count)^t)`
//! of them on average (routing taken as uniform) and reads each one's weights once —
//! one decode row reads `used` experts, 32 rows nearly all of them, which a cost
//! linear in rows would badly under-predict. The coefficients start from a conservative prior (no calibration
//! run needed) and follow a recursive least-squares fit of the relative error with
//! exponential forgetting (the newest ~`1/(1-FORGET)` steps count most), pulled
//! weakly toward the prior so that shapes never seen yet are still predicted
//! sensibly. Coefficients are kept non-negative. Fixed-size arrays only: observing
//! and predicting allocate nothing.

use serde::Serialize;

/// Number of terms of the model.
pub const TERMS: usize = 6;
/// Names of the terms, in coefficient order (for metrics and logs).
pub const TERM_NAMES: [&str; TERMS] = [
    "fixed",
    "prefill_token",
    "decode_row",
    "context_ktoken",
    "large_batch",
    "expert_touched",
];

/// A mixture of experts' routing, as the step-time model needs it: each token goes to
/// `used` of `count` experts in every MoE layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRouting {
    pub count: usize,
    pub used: usize,
}

impl ExpertRouting {
    /// Experts a step of `tokens` tokens touches in a layer, on average, if each
    /// token picks `used` of `count` uniformly: `count * (1 - (1 - used/count)^tokens)`.
    pub fn touched(&self, tokens: usize) -> f64 {
        if self.count == 0 || tokens == 0 {
            return 0.0;
        }
        let miss = 1.0 - (self.used.min(self.count) as f64 / self.count as f64);
        let tokens = i32::try_from(tokens).unwrap_or(i32::MAX);
        self.count as f64 * (1.0 - miss.powi(tokens))
    }
}

/// Weight of the previous evidence after each new step (forgetting factor).
const FORGET: f64 = 0.99;
/// Strength of the pull toward the prior: a term's typical contribution moved
/// by `REF_SECS` costs as much as this many steps predicted 100% wrong. Weak, so
/// the data rules wherever it says anything; it keeps unseen shapes sensible.
const PRIOR_WEIGHT: f64 = 0.02;
/// Steps are weighted by `(REF_SECS / secs)^2` (a least-squares fit of the
/// relative error).
const REF_SECS: f64 = 0.05;

/// What a step consists of, as the cost model sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Tokens of prefill chunks.
    pub prefill_tokens: usize,
    /// Decode rows (one token each).
    pub decode_rows: usize,
    /// Attention work: the sum over the step's new tokens of their context
    /// lengths (tokens attended to).
    pub context_tokens: usize,
}

impl StepShape {
    /// The shape of one sequence's part of a step: `n` new tokens after `cached`
    /// tokens of context; `decode` when it is a single-token decode row.
    pub fn of_seq(n: usize, cached: usize, decode: bool) -> StepShape {
        // Token i (0-based) attends to cached + i + 1 positions.
        let context = n * cached + n * (n + 1) / 2;
        if decode {
            StepShape {
                prefill_tokens: 0,
                decode_rows: n,
                context_tokens: context,
            }
        } else {
            StepShape {
                prefill_tokens: n,
                decode_rows: 0,
                context_tokens: context,
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_rows == 0
    }

    /// Tokens the step runs.
    pub fn tokens(&self) -> usize {
        self.prefill_tokens + self.decode_rows
    }

    /// The model's features; `small`: the runner's small-batch token limit;
    /// `experts`: a mixture of experts' routing.
    fn features(&self, small: usize, experts: Option<ExpertRouting>) -> [f64; TERMS] {
        [
            1.0,
            self.prefill_tokens as f64,
            self.decode_rows as f64,
            self.context_tokens as f64 / 1000.0,
            f64::from(u8::from(small > 0 && self.tokens() > small)),
            experts.map_or(0.0, |e| e.touched(self.tokens())),
        ]
    }
}

impl std::ops::Add for StepShape {
    type Output = StepShape;
    fn add(self, o: StepShape) -> StepShape {
        StepShape {
            prefill_tokens: self.prefill_tokens + o.prefill_tokens,
            decode_rows: self.decode_rows + o.decode_rows,
            context_tokens: self.context_tokens + o.context_tokens,
        }
    }
}

impl std::ops::AddAssign for StepShape {
    fn add_assign(&mut self, o: StepShape) {
        *self = *self + o;
    }
}

impl std::ops::SubAssign for StepShape {
    fn sub_assign(&mut self, o: StepShape) {
        self.prefill_tokens -= o.prefill_tokens;
        self.decode_rows -= o.decode_rows;
        self.context_tokens -= o.context_tokens;
    }
}

/// The model's current coefficients (seconds per unit of each term) and fit quality.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepCostFigures {
    /// Seconds per unit of each term, in [`TERM_NAMES`] order.
    pub coefficients: [f64; TERMS],
    /// Steps observed.
    pub steps_observed: u64,
    /// Mean absolute relative error of the prediction made before each step was
    /// observed (moving average, 0 to 1+; 0 until observed).
    pub mean_abs_rel_error: f64,
}

/// The online step-time model.
#[derive(Debug, Clone)]
pub struct StepCostModel {
    /// The runner's small-batch token limit (0: none).
    small: usize,
    /// A mixture of experts' routing (`None`: a dense model, the term is 0).
    experts: Option<ExpertRouting>,
    prior: [f64; TERMS],
    /// Feature scales (so the regularisation is even across terms).
    scale: [f64; TERMS],
    /// Decayed sums: `sum w z z^T` and `sum w z y` over scaled features
    /// `z = x / scale`.
    xtx: [[f64; TERMS]; TERMS],
    xty: [f64; TERMS],
    coef: [f64; TERMS],
    steps: u64,
    err: f64,
}

impl Default for StepCostModel {
    fn default() -> Self {
        // A conservative prior (slower than any machine sloserve ran on): it
        // over-predicts until the first steps are measured.
        Self::with_prior([0.02, 0.005, 0.008, 0.0005, 0.01, 0.002])
    }
}

impl StepCostModel {
    /// A model starting from `prior` (seconds per unit of each term).
    pub fn with_prior(prior: [f64; TERMS]) -> Self {
        // Typical magnitudes of the terms in one step.
        let scale = [1.0, 64.0, 16.0, 16.0, 1.0, 8.0];
        StepCostModel {
            small: 0,
            experts: None,
            prior,
            scale,
            xtx: [[0.0; TERMS]; TERMS],
            xty: [0.0; TERMS],
            coef: prior,
            steps: 0,
            err: 0.0,
        }
    }

    /// The same model for a runner whose batches of at most `tokens` tokens take
    /// a cheaper path (`RunnerInfo::small_batch_max_tokens`).
    pub fn with_small_batch(mut self, tokens: usize) -> Self {
        self.small = tokens;
        self
    }

    /// The same model for a mixture of experts routed as `experts` (`None`: dense).
    pub fn with_experts(mut self, experts: Option<ExpertRouting>) -> Self {
        self.experts = experts;
        self
    }

    /// The runner's small-batch token limit (0: none).
    pub fn small_batch_tokens(&self) -> usize {
        self.small
    }

    /// Predicted seconds of a step of this shape (0 for an empty step).
    pub fn predict(&self, shape: &StepShape) -> f64 {
        if shape.is_empty() {
            return 0.0;
        }
        let x = shape.features(self.small, self.experts);
        (0..TERMS).map(|j| self.coef[j] * x[j]).sum()
    }

    /// Predicted seconds to prefill `n` tokens after `cached` ones in chunks of
    /// `chunk` tokens, one step each: the attention term grows with every chunk,
    /// so a long prompt costs more than its tokens at a short prompt's rate.
    pub fn predict_prefill_s(&self, mut cached: usize, mut n: usize, chunk: usize) -> f64 {
        let chunk = chunk.max(1);
        let mut s = 0.0;
        while n > 0 {
            let k = n.min(chunk);
            s += self.predict(&StepShape::of_seq(k, cached, false));
            cached += k;
            n -= k;
        }
        s
    }

    /// Takes in a step that ran: its shape and measured seconds.
    pub fn observe(&mut self, shape: &StepShape, secs: f64) {
        if shape.is_empty() || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let predicted = self.predict(shape);
        let rel = ((predicted - secs) / secs).abs().min(10.0);
        self.err = if self.steps == 0 {
            rel
        } else {
            0.95 * self.err + 0.05 * rel
        };
        self.steps += 1;
        let x = shape.features(self.small, self.experts);
        let z: [f64; TERMS] = std::array::from_fn(|j| x[j] / self.scale[j]);
        // Relative error is what matters (bounds are ratios of step times): weight
        // each step by 1/secs^2, normalised to a step of REF_SECS.
        let w = (REF_SECS / secs).powi(2);
        for i in 0..TERMS {
            for j in 0..TERMS {
                self.xtx[i][j] = FORGET * self.xtx[i][j] + w * z[i] * z[j];
            }
            self.xty[i] = FORGET * self.xty[i] + w * z[i] * secs;
        }
        self.refit();
    }

    /// Solves the regularised normal equations for the coefficients, keeping them
    /// non-negative (a negative term is pinned to 0 and the rest refitted).
    fn refit(&mut self) {
        let mut free = [true; TERMS];
        for _ in 0..TERMS {
            let Some(theta) = self.solve(&free) else {
                return;
            };
            let mut all_ok = true;
            for j in 0..TERMS {
                if free[j] && theta[j] < 0.0 {
                    free[j] = false;
                    all_ok = false;
                }
            }
            if all_ok {
                for j in 0..TERMS {
                    // Back from scaled to raw features.
                    self.coef[j] = if free[j] {
                        theta[j] / self.scale[j]
                    } else {
                        0.0
                    };
                }
                return;
            }
        }
    }

    /// Least squares in the scaled features over the `free` terms, with a ridge
    /// pull toward the prior; `None` if singular.
    fn solve(&self, free: &[bool; TERMS]) -> Option<[f64; TERMS]> {
        let mut a = [[0.0; TERMS]; TERMS];
        let mut b = [0.0; TERMS];
        for i in 0..TERMS {
            if !free[i] {
                a[i][i] = 1.0;
                continue;
            }
            // Prior in scaled units: theta = coef * scale.
            let prior_theta = self.prior[i] * self.scale[i];
            a[i][i] += PRIOR_WEIGHT;
            b[i] = self.xty[i] + PRIOR_WEIGHT * prior_theta;
            for j in 0..TERMS {
                if free[j] {
                    a[i][j] += self.xtx[i][j];
                }
            }
        }
        solve_linear(a, b)
    }

    /// The current figures (for `/metrics` and logs).
    pub fn figures(&self) -> StepCostFigures {
        StepCostFigures {
            coefficients: self.coef,
            steps_observed: self.steps,
            mean_abs_rel_error: self.err,
        }
    }
}

/// Gaussian elimination with partial pivoting on a small dense system.
fn solve_linear(mut a: [[f64; TERMS]; TERMS], mut b: [f64; TERMS]) -> Option<[f64; TERMS]> {
    for col in 0..TERMS {
        let piv = (col..TERMS).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for row in col + 1..TERMS {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; TERMS];
    for row in (0..TERMS).rev() {
        let s: f64 = (row + 1..TERMS).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::Rng;

    fn shape(p: usize, d: usize, c: usize) -> StepShape {
        StepShape {
            prefill_tokens: p,
            decode_rows: d,
            context_tokens: c,
        }
    }

    #[test]
    fn seq_shapes() {
        assert_eq!(StepShape::of_seq(1, 9, true), shape(0, 1, 10));
        assert_eq!(StepShape::of_seq(3, 0, false), shape(3, 0, 6));
        let mut s = shape(1, 2, 3) + shape(4, 5, 6);
        assert_eq!(s, shape(5, 7, 9));
        s -= shape(4, 5, 6);
        assert_eq!(s, shape(1, 2, 3));
    }

    #[test]
    fn prior_before_any_step() {
        let m = StepCostModel::with_prior([0.01, 0.001, 0.002, 0.0, 0.0, 0.5]);
        assert_eq!(m.predict(&StepShape::default()), 0.0);
        assert!((m.predict(&shape(10, 2, 0)) - (0.01 + 0.01 + 0.004)).abs() < 1e-12);
    }

    /// The fit converges on a synthetic linear cost with noise, from a prior far off.
    #[test]
    fn converges_on_a_synthetic_cost() {
        let truth = [0.012, 0.0042, 0.0055, 0.0003, 0.009, 0.0];
        let cost = |s: &StepShape| {
            truth[0]
                + truth[1] * s.prefill_tokens as f64
                + truth[2] * s.decode_rows as f64
                + truth[3] * s.context_tokens as f64 / 1000.0
                + truth[4] * f64::from(u8::from(s.tokens() > 2))
        };
        let mut m = StepCostModel::default().with_small_batch(2);
        let mut rng = Rng::new(7);
        for _ in 0..400 {
            let p = if rng.chance(0.4) { rng.below(300) } else { 0 };
            let d = rng.below(33);
            let s = shape(p, d.max(usize::from(p == 0)), rng.below(40_000));
            let noise = 1.0 + (rng.below(1000) as f64 / 1000.0 - 0.5) * 0.04; // +-2%
            m.observe(&s, cost(&s) * noise);
        }
        for s in [
            shape(0, 1, 500),
            shape(0, 2, 2000),
            shape(256, 2, 30_000),
            shape(0, 32, 9000),
        ] {
            let (p, t) = (m.predict(&s), cost(&s));
            assert!((p - t).abs() / t < 0.05, "{s:?}: predicted {p}, true {t}");
        }
        let f = m.figures();
        assert_eq!(f.steps_observed, 400);
        assert!(f.mean_abs_rel_error < 0.1, "{f:?}");
    }

    /// Only one shape ever seen: that shape is predicted well, the rest stays sane
    /// (non-negative, increasing in work).
    #[test]
    fn degenerate_data_stays_sane() {
        let mut m = StepCostModel::default();
        for _ in 0..200 {
            m.observe(&shape(0, 2, 400), 0.02);
        }
        assert!((m.predict(&shape(0, 2, 400)) - 0.02).abs() < 0.002);
        assert!(m.figures().coefficients.iter().all(|&c| c >= 0.0));
        assert!(m.predict(&shape(0, 3, 600)) >= m.predict(&shape(0, 2, 400)));
        assert!(m.predict(&shape(100, 2, 5000)) > m.predict(&shape(0, 2, 400)));
    }

    /// A mixture of experts (128 experts, 8 a token, as Qwen3-30B-A3B): a step costs
    /// a little per row and a lot per expert it touches. Fitted on decode steps of
    /// 1-32 rows and prompt chunks, the model predicts shapes it never saw (inside
    /// that range) within 5%, where the same fit without the expert term is off by far more — and
    /// predicts that 32 rows cost far less than 32 single rows.
    #[test]
    fn learns_what_experts_cost() {
        let moe = ExpertRouting {
            count: 128,
            used: 8,
        };
        assert_eq!(moe.touched(0), 0.0);
        assert!((moe.touched(1) - 8.0).abs() < 1e-9);
        assert!(moe.touched(32) > 110.0 && moe.touched(32) < 128.0);
        assert!(moe.touched(512) > 127.99);
        let cost =
            |s: &StepShape| 0.004 + 0.0008 * s.tokens() as f64 + 0.0025 * moe.touched(s.tokens());
        let fit = |experts| {
            let mut m = StepCostModel::default().with_experts(experts);
            let mut rng = Rng::new(11);
            for _ in 0..600 {
                let s = match rng.below(3) {
                    0 => shape(0, 1 + rng.below(4), rng.below(4000)),
                    1 => shape(0, 1 + rng.below(32), rng.below(20_000)),
                    _ => shape(1 + rng.below(256), rng.below(8), rng.below(30_000)),
                };
                let noise = 1.0 + (rng.below(1000) as f64 / 1000.0 - 0.5) * 0.04;
                m.observe(&s, cost(&s) * noise);
            }
            m
        };
        let (with, without) = (fit(Some(moe)), fit(None));

        let unseen = [shape(0, 6, 3000), shape(0, 20, 9000), shape(200, 2, 20_000)];
        let worst = |m: &StepCostModel| {
            unseen
                .iter()
                .map(|s| (m.predict(s) - cost(s)).abs() / cost(s))
                .fold(0.0, f64::max)
        };
        assert!(
            worst(&with) < 0.05,
            "with the expert term: {}",
            worst(&with)
        );
        assert!(
            worst(&without) > 2.0 * worst(&with),
            "without: {}, with: {}",
            worst(&without),
            worst(&with)
        );
        // 32 rows touch ~116 experts to one row's 8: ~13x one row's time, not 32x.
        let (one, batch) = (shape(0, 1, 100), shape(0, 32, 3200));
        let ratio = with.predict(&batch) / with.predict(&one);
        let truth = cost(&batch) / cost(&one);
        assert!(
            truth < 16.0 && (ratio / truth - 1.0).abs() < 0.1,
            "{ratio} vs {truth}"
        );
    }

    /// The model follows a machine that gets slower (forgetting).
    #[test]
    fn follows_a_change() {
        let mut m = StepCostModel::default();
        let s = shape(0, 4, 1000);
        for _ in 0..200 {
            m.observe(&s, 0.03);
        }
        for _ in 0..500 {
            m.observe(&s, 0.06);
        }
        assert!((m.predict(&s) - 0.06).abs() < 0.006, "{}", m.predict(&s));
    }
}
