//! N-gram speculation (prompt lookup, no draft model): drafting a sequence's next
//! tokens from its own prompt and output, and the per-sequence acceptance estimate
//! the scheduler weighs a draft's expected gain by.
//!
//! Drafting: the longest suffix of the sequence (`ngram_max` tokens down to
//! `ngram_min`) that occurred earlier; the tokens that followed its latest earlier
//! occurrence are the draft. Verification is the scheduler's (one forward over the
//! newest token and its draft, a logits row per position): each position is sampled
//! as if there were no draft, and the draft is accepted up to the first position
//! whose sample differs. For a deterministic draft this is the standard rejection
//! rule (accept draft token `d` with probability `p(d)`, else sample from `p`
//! without `d`, renormalised: `P(y) = p(y)` either way), so outputs keep their
//! distribution; and since each emitted token is sampled once, in order, by the
//! sequence's own sampler (its RNG, penalties and grammar), a seeded request's
//! output is the same with speculation as without.

/// How drafts are found (the engine's `spec_*` knobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramParams {
    /// Longest suffix matched.
    pub ngram_max: usize,
    /// Shortest suffix matched.
    pub ngram_min: usize,
    /// Most draft tokens proposed.
    pub max_draft: usize,
}

/// How far back a draft is searched for (tokens): bounds a step's drafting work
/// on long contexts.
pub const SEARCH_WINDOW: usize = 8192;

/// Fills `out` (cleared first) with at most `p.max_draft` tokens proposed to follow
/// `tokens`: what followed the latest earlier occurrence of its longest matching
/// suffix. Empty when no suffix of at least `ngram_min` tokens recurs.
pub fn draft(tokens: &[u32], p: &NgramParams, out: &mut Vec<u32>) {
    out.clear();
    let len = tokens.len();
    if p.max_draft == 0 || p.ngram_min == 0 || len < p.ngram_min + 1 {
        return;
    }
    let lo = len.saturating_sub(SEARCH_WINDOW);
    let n_max = p.ngram_max.max(p.ngram_min).min(len - 1);
    for n in (p.ngram_min..=n_max).rev() {
        let suffix = &tokens[len - n..];
        // Latest start `s < len - n` with tokens[s..s + n] == suffix.
        let found = (lo..len - n).rev().find(|&s| &tokens[s..s + n] == suffix);
        if let Some(s) = found {
            let from = s + n;
            let to = (from + p.max_draft).min(len);
            out.extend_from_slice(&tokens[from..to]);
            return;
        }
    }
}

/// A sequence's estimated chance that a draft token is accepted (given the ones
/// before it were): a moving average over its verified drafts, drifting back
/// toward the prior while it does not draft, so a sequence whose drafts stopped
/// paying tries again later.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    rate: f64,
}

/// Where an estimate starts, and drifts back to.
const PRIOR: f64 = 0.5;
/// Weight of one verification in the moving average.
const LEARN: f64 = 0.3;
/// Drift toward the prior per step without a draft.
const DRIFT: f64 = 0.02;

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance { rate: PRIOR }
    }
}

impl Acceptance {
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// A verification accepted `accepted` of `drafted` tokens. The first rejection
    /// ends a draft, so the draft counts as `accepted + 1` trials (all of them when
    /// every token was accepted).
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let trials = (accepted + 1).min(drafted) as f64;
        let sample = accepted as f64 / trials;
        self.rate += (sample - self.rate) * LEARN;
    }

    /// A step without a draft (none found, or not worth it).
    pub fn relax(&mut self) {
        self.rate += (PRIOR - self.rate) * DRIFT;
    }

    /// Tokens a step emits with a draft of `k`: the newest token's sample plus
    /// each accepted draft token, `1 + a + a^2 + ... + a^k`.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let a = self.rate.clamp(0.0, 0.999);
        (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: NgramParams = NgramParams {
        ngram_max: 3,
        ngram_min: 1,
        max_draft: 4,
    };

    fn d(tokens: &[u32], p: &NgramParams) -> Vec<u32> {
        let mut out = vec![99];
        draft(tokens, p, &mut out);
        out
    }

    #[test]
    fn the_longest_recurring_suffix_proposes_what_followed_it() {
        // Suffix [2, 3] recurs at 1..3 (followed by 4 5 6 7) and [3] at 6 too:
        // the longer match wins.
        assert_eq!(d(&[1, 2, 3, 4, 5, 6, 7, 9, 3, 8, 2, 3], &P), [4, 5, 6, 7]);
        // The latest occurrence of the suffix wins.
        assert_eq!(d(&[7, 1, 5, 7, 1, 6, 0, 7, 1], &P), [6, 0, 7, 1]);
        // The draft stops at the end of the sequence.
        assert_eq!(d(&[4, 5, 4], &P), [5, 4]);
    }

    #[test]
    fn no_recurring_suffix_or_knobs_off_proposes_nothing() {
        assert!(d(&[1, 2, 3, 4], &P).is_empty());
        assert!(d(&[], &P).is_empty());
        assert!(d(&[5], &P).is_empty());
        let min2 = NgramParams { ngram_min: 2, ..P };
        assert!(
            d(&[1, 2, 9, 3, 2], &min2).is_empty(),
            "[2] recurs, [3 2] not"
        );
        let off = NgramParams { max_draft: 0, ..P };
        assert!(d(&[4, 5, 4], &off).is_empty());
    }

    #[test]
    fn the_search_is_bounded_by_its_window() {
        let mut t: Vec<u32> = (0..SEARCH_WINDOW as u32 + 10).map(|i| 1000 + i).collect();
        t[1] = 7;
        t.push(7);
        assert!(
            d(&t, &P).is_empty(),
            "the only earlier 7 is out of the window"
        );
        t[SEARCH_WINDOW] = 7;
        assert_eq!(d(&t, &P).len(), 4);
    }

    #[test]
    fn acceptance_learns_and_drifts_back() {
        let mut a = Acceptance::default();
        assert!((a.expected_tokens(0) - 1.0).abs() < 1e-12);
        assert!((a.expected_tokens(2) - 1.75).abs() < 1e-12, "1 + .5 + .25");
        for _ in 0..20 {
            a.observe(4, 4);
        }
        assert!(a.rate() > 0.99, "{}", a.rate());
        for _ in 0..20 {
            a.observe(4, 0);
        }
        assert!(a.rate() < 0.01, "{}", a.rate());
        let low = a.rate();
        a.relax();
        assert!(a.rate() > low && a.rate() < PRIOR);
        a.observe(0, 0);
        assert!(a.rate() > low, "an empty draft teaches nothing");
        // A rejection after two accepted tokens: 2 of 3 trials.
        let mut b = Acceptance { rate: 0.0 };
        b.observe(4, 2);
        assert!((b.rate() - LEARN * 2.0 / 3.0).abs() < 1e-12);
    }
}
