//! A sequence's prompt scoring (`Request::prompt_logprobs`): which prefill rows
//! it needs logits for, how large its chunks may be, and the scores it sends
//! from each chunk's rows.

use super::Sequence;
use crate::event::{Event, FinishReason};
use crate::request::PROMPT_SCORING_CHUNK;
use crate::runner::Logits;
use crate::sampler::score::score_token;

/// What is left of a prompt's scoring.
#[derive(Debug, Clone)]
pub(crate) struct PromptScoring {
    /// Alternatives per position.
    k: usize,
    /// The next prompt token to score (from 1: the first token has no context);
    /// `prompt_len` once all are sent (a recompute after preemption skips them).
    next: usize,
}

impl Sequence {
    /// Scores its prompt with `k` alternatives per position (`None`: not asked).
    pub fn with_prompt_scoring(mut self, k: Option<usize>) -> Self {
        self.scoring = k.map(|k| PromptScoring { k, next: 1 });
        self
    }

    /// Whether prompt tokens are still to be scored: its prefill chunks then
    /// return a logits row for every position.
    #[inline]
    pub fn scores_prompt(&self) -> bool {
        self.scoring
            .as_ref()
            .is_some_and(|s| s.next < self.prompt_len)
    }

    /// The largest prefill chunk it may run: `max_chunk`, or at most
    /// `PROMPT_SCORING_CHUNK` while it scores its prompt (bounds its logits rows).
    #[inline]
    pub fn prefill_chunk_cap(&self, max_chunk: usize) -> usize {
        if self.scores_prompt() {
            max_chunk.min(PROMPT_SCORING_CHUNK)
        } else {
            max_chunk
        }
    }

    /// Sends the scores of the prompt tokens that rows `row..row + n` of `logits`
    /// predict: they are the rows of positions `first..first + n` (position `p`'s
    /// row scores token `p + 1`). Tokens already scored are skipped.
    pub fn send_prompt_scores(&mut self, logits: &Logits, row: usize, first: usize, n: usize) {
        let Some(sc) = self.scoring.as_mut() else {
            return;
        };
        let end = (first + n + 1).min(self.prompt_len);
        let from = sc.next.max(first + 1);
        if from >= end {
            return;
        }
        let mut top = Vec::with_capacity(sc.k);
        let scores = (from..end)
            .map(|t| {
                score_token(
                    logits.row(row + t - 1 - first),
                    self.tokens[t],
                    sc.k,
                    &mut top,
                )
            })
            .collect();
        sc.next = end;
        if self.tx.send(Event::PromptLogprobs(scores)).is_err() {
            self.finish(FinishReason::Cancelled);
        }
    }
}
