//! Prefill-only pooled requests (`Request::pooling`): which rows of its prompt a
//! request needs back from the runner, and how they pool into its one output
//! vector (an embedding, or a reranker's token logits).

/// How a pooled request's output is made from its prompt (llama.cpp's
/// `pooling_type` names the first three: mean 1, CLS 2, last 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every prompt position's hidden state.
    Mean,
    /// The first position's hidden state.
    Cls,
    /// The last position's hidden state (decoder embedding models).
    Last,
    /// The last position's logits of these token ids, in this order (a decoder
    /// reranker's "yes" / "no").
    TokenLogits(Vec<u32>),
}

impl Pooling {
    /// Its rows are hidden states (else logits).
    pub fn hidden(&self) -> bool {
        !matches!(self, Pooling::TokenLogits(_))
    }

    /// How many of the last tokens of the chunk `start..end` of a `len`-token
    /// prompt the runner returns rows for.
    pub fn rows(&self, start: usize, end: usize, len: usize) -> usize {
        match self {
            Pooling::Mean => end - start,
            Pooling::Cls if start == 0 => end - start,
            Pooling::Cls => 0,
            Pooling::Last | Pooling::TokenLogits(_) => usize::from(end == len),
        }
    }
}

/// A pooled sequence's running output.
#[derive(Debug, Clone)]
pub(crate) struct PoolState {
    pub pooling: Pooling,
    /// Mean: the sum so far; else the output once taken.
    acc: Vec<f32>,
    /// Rows summed into `acc`.
    count: usize,
}

impl PoolState {
    pub fn new(pooling: Pooling) -> Self {
        PoolState {
            pooling,
            acc: Vec::new(),
            count: 0,
        }
    }

    /// Back to nothing computed (the sequence's KV was dropped: preemption).
    pub fn reset(&mut self) {
        self.acc.clear();
        self.count = 0;
    }

    /// Takes the rows of one chunk (`rows`: each of `width` floats; for a
    /// chunk starting at position 0, the first is position 0's).
    pub fn add(&mut self, rows: &[f32], width: usize, chunk_start: usize) {
        if rows.is_empty() {
            return;
        }
        match &self.pooling {
            Pooling::Mean => {
                if self.acc.is_empty() {
                    self.acc.resize(width, 0.0);
                }
                // Summed position by position in prompt order: the same sum
                // however the prompt was chunked.
                for row in rows.chunks_exact(width) {
                    for (a, v) in self.acc.iter_mut().zip(row) {
                        *a += v;
                    }
                    self.count += 1;
                }
            }
            Pooling::Cls if chunk_start == 0 => {
                self.acc = rows[..width].to_vec();
                self.count = 1;
            }
            Pooling::Cls => {}
            Pooling::Last => {
                self.acc = rows[rows.len() - width..].to_vec();
                self.count = 1;
            }
            Pooling::TokenLogits(ids) => {
                let last = &rows[rows.len() - width..];
                self.acc = ids.iter().map(|&id| last[id as usize]).collect();
                self.count = 1;
            }
        }
    }

    /// The pooled output (the mean divided out).
    pub fn take(&mut self) -> Vec<f32> {
        if self.pooling == Pooling::Mean && self.count > 0 {
            let n = self.count as f32;
            self.acc.iter_mut().for_each(|a| *a /= n);
        }
        std::mem::take(&mut self.acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_asked_per_chunk() {
        let (m, c, l) = (Pooling::Mean, Pooling::Cls, Pooling::Last);
        let t = Pooling::TokenLogits(vec![3, 1]);
        assert_eq!([m.rows(0, 4, 9), m.rows(4, 9, 9)], [4, 5]);
        assert_eq!([c.rows(0, 4, 9), c.rows(4, 9, 9)], [4, 0]);
        assert_eq!([l.rows(0, 4, 9), l.rows(4, 9, 9)], [0, 1]);
        assert_eq!([t.rows(0, 4, 9), t.rows(4, 9, 9)], [0, 1]);
        assert!(m.hidden() && !t.hidden());
    }

    #[test]
    fn pooling_over_chunks() {
        // Positions 0..3 with rows [p, 10p].
        let rows = |a: usize, b: usize| -> Vec<f32> {
            (a..b).flat_map(|p| [p as f32, 10.0 * p as f32]).collect()
        };
        let mut mean = PoolState::new(Pooling::Mean);
        mean.add(&rows(0, 2), 2, 0);
        mean.add(&rows(2, 4), 2, 2);
        assert_eq!(mean.take(), [1.5, 15.0]);
        let mut cls = PoolState::new(Pooling::Cls);
        cls.add(&rows(0, 2), 2, 0);
        cls.add(&[], 2, 2);
        assert_eq!(cls.take(), [0.0, 0.0]);
        let mut last = PoolState::new(Pooling::Last);
        last.add(&rows(3, 4), 2, 3);
        assert_eq!(last.take(), [3.0, 30.0]);
        let mut tl = PoolState::new(Pooling::TokenLogits(vec![1, 0]));
        tl.add(&[0.5, -2.0, 7.0], 3, 5);
        assert_eq!(tl.take(), [-2.0, 0.5]);
        // A preempted sequence starts over.
        let mut again = PoolState::new(Pooling::Mean);
        again.add(&rows(0, 4), 2, 0);
        again.reset();
        again.add(&rows(0, 2), 2, 0);
        assert_eq!(again.take(), [0.5, 5.0]);
    }
}
