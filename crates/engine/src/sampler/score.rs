//! Scoring a given token against a logits row (prompt logprobs): its log-softmax
//! of the raw row, its rank, and the row's best alternatives, without sampling.

use super::kernels::{max_of, sanitize, top_n_into, LogSoftmax};
use super::MAX_TOP_LOGPROBS;
use crate::event::PromptLogprob;

/// The score of `token` under `row`, with its `k` best alternatives (capped at
/// `MAX_TOP_LOGPROBS`); `top` is scratch for them. Reads the row three times
/// (max, normaliser, rank) plus once for the alternatives when `k > 0`.
pub fn score_token(row: &[f32], token: u32, k: usize, top: &mut Vec<(u32, f32)>) -> PromptLogprob {
    let norm = LogSoftmax::new(row, sanitize(max_of(row)));
    let x = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&v| sanitize(v));
    let above = row.iter().filter(|&&v| sanitize(v) > x).count();
    let k = k.min(MAX_TOP_LOGPROBS).min(row.len());
    top_n_into(top, row, k, 1.0);
    PromptLogprob {
        id: token,
        logprob: norm.logprob(x),
        rank: above as u32 + 1,
        top_logprobs: top.iter().map(|&(id, v)| (id, norm.logprob(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_a_token_with_rank_and_alternatives() {
        let row = [1.0f32, 3.0, 2.0, f32::NAN];
        let mut top = Vec::new();
        let s = score_token(&row, 2, 2, &mut top);
        let lse = (1f64.exp() + 3f64.exp() + 2f64.exp()).ln();
        assert!((s.logprob as f64 - (2.0 - lse)).abs() < 1e-5, "{s:?}");
        assert_eq!(s.rank, 2);
        assert_eq!(s.top_logprobs.len(), 2);
        assert_eq!((s.top_logprobs[0].0, s.top_logprobs[1].0), (1, 2));
        assert!((s.top_logprobs[1].1 - s.logprob).abs() < 1e-7);
        let best = score_token(&row, 1, 0, &mut top);
        assert_eq!((best.rank, best.top_logprobs.len()), (1, 0));
    }
}
