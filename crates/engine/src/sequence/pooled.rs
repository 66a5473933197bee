//! A pooled sequence (`Request::pooling`): the rows each prefill chunk asks the
//! runner for, and its one output sent when the prompt is done.

use super::Sequence;
use crate::event::{Event, FinishReason};
use crate::pooling::{PoolState, Pooling};
use crate::runner::{Batch, BatchSeq, Logits};

impl Sequence {
    /// Pools its prompt as `pooling` says (`None`: generation).
    pub fn with_pooling(mut self, pooling: Option<Pooling>) -> Self {
        self.pooling = pooling.map(PoolState::new);
        self
    }

    /// Whether it is a pooled request.
    #[inline]
    pub fn pools(&self) -> bool {
        self.pooling.is_some()
    }

    /// Appends its chunk `start..end` to `batch` with the rows its pooling needs.
    pub fn push_pooled(&self, batch: &mut Batch, start: usize, end: usize) {
        let p = &self.pooling.as_ref().expect("a pooled sequence").pooling;
        let rows = p.rows(start, end, self.tokens.len());
        let (tokens, table) = (&self.tokens[start..end], self.blocks.ids());
        if p.hidden() {
            batch.push_hidden(tokens, start, table, rows);
        } else {
            batch.push(tokens, start, table, rows > 0);
        }
    }

    /// Takes its chunk's rows back (`entry`, whose rows start at `row` of
    /// `logits`' logits or hidden rows as the entry says); when the prompt is
    /// done, sends the pooled output and finishes (`Length`: it generates
    /// nothing). `start`: the chunk's first position.
    pub fn take_pooled(&mut self, logits: &Logits, entry: &BatchSeq, row: usize, start: usize) {
        let rows = entry.num_rows();
        let done = start + entry.num_tokens >= self.tokens.len() && self.finish_reason().is_none();
        let pool = self.pooling.as_mut().expect("a pooled sequence");
        if rows > 0 {
            let (data, width) = match entry.hidden {
                true => (&logits.hidden, logits.hidden_size),
                false => (&logits.data, logits.vocab_size),
            };
            pool.add(&data[row * width..(row + rows) * width], width, start);
        }
        if !done {
            return;
        }
        let out = pool.take();
        if self.tx.send(Event::Pooled(out)).is_err() {
            self.finish(FinishReason::Cancelled);
        } else {
            self.finish(FinishReason::Length);
        }
    }

    /// Drops what it pooled (its KV was dropped: it prefills again).
    pub(super) fn reset_pooled(&mut self) {
        if let Some(p) = &mut self.pooling {
            p.reset();
        }
    }
}
