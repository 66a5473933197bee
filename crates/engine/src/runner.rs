//! The `ModelRunner` trait and the flat batch it consumes: the only contract between
//! the scheduling core and a model implementation.

use std::fmt;

/// What a runner tells the engine about itself once it is loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerInfo {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Number of KV blocks the runner allocated (sized from its memory budget).
    pub num_kv_blocks: usize,
    /// Vocabulary size: the length of one logits row.
    pub vocab_size: usize,
    /// Longest sequence (prompt + output) the model supports.
    pub max_model_len: usize,
    /// Bytes of KV cache one token occupies (all layers, keys and values).
    pub kv_bytes_per_token: usize,
    /// Batches of at most this many tokens take a cheaper path (e.g. streaming
    /// quantized weights instead of a dense GEMM), so a step's cost jumps past it;
    /// the step-time model learns the jump. 0: no such path.
    pub small_batch_max_tokens: usize,
    /// A mixture of experts' routing (`None`: dense), so the step-time model counts
    /// the experts a step touches.
    pub experts: Option<crate::step_cost::ExpertRouting>,
    /// A bidirectional (non-causal) encoder (`bert`): it serves pooled requests
    /// only (`Request::pooling`), and a position's row depends on every position
    /// of its prompt, so each prompt runs whole in one step, never chunked (and
    /// at most `max_num_batched_tokens` long).
    pub encoder: bool,
}

/// One sequence's slice of a [`Batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSeq {
    /// Offset of this sequence's first new token in [`Batch::tokens`].
    pub token_start: usize,
    /// Number of new tokens (a prefill chunk, or 1 for a decode step).
    pub num_tokens: usize,
    /// Tokens of this sequence already in the KV cache: the first new token sits at
    /// this position.
    pub num_cached: usize,
    /// Offset of this sequence's block table in [`Batch::block_tables`].
    pub block_table_start: usize,
    /// Length of this sequence's block table; it covers `num_cached + num_tokens` slots.
    pub block_table_len: usize,
    /// How many of this sequence's last new tokens the runner returns logits
    /// for: 0 (a prefill chunk that samples nothing), 1 (the next token), or
    /// `num_tokens` for a speculative verification row (the newest token and its
    /// draft: one row per position, so every draft token is checked in one step)
    /// and for a prompt-scoring prefill chunk (`Request::prompt_logprobs`).
    pub num_logits: usize,
    /// Its rows are hidden states (after the output norm, `hidden_size` each, in
    /// [`Logits::hidden`]) instead of logits: a pooled request's prefill
    /// (`Request::pooling`).
    pub hidden: bool,
}

impl BatchSeq {
    /// Position of the `i`-th new token.
    #[inline]
    pub fn position(&self, i: usize) -> usize {
        self.num_cached + i
    }
    /// Total tokens of this sequence in the KV cache after this step.
    #[inline]
    pub fn context_len(&self) -> usize {
        self.num_cached + self.num_tokens
    }
    /// Whether the runner returns any logits for this sequence.
    #[inline]
    pub fn want_logits(&self) -> bool {
        self.num_logits > 0 && !self.hidden
    }
    /// How many rows it gets back (logits or hidden states).
    #[inline]
    pub fn num_rows(&self) -> usize {
        self.num_logits.min(self.num_tokens)
    }
    /// Offsets in [`Batch::tokens`] of the tokens whose logits rows are returned.
    #[inline]
    pub fn logit_tokens(&self) -> std::ops::Range<usize> {
        let end = self.token_start + self.num_tokens;
        end - self.num_logits.min(self.num_tokens)..end
    }
}

/// A flat batch: the new tokens of several sequences (prefill chunks and decode
/// steps mixed), each with its block table into the runner's KV cache.
///
/// The engine reuses one `Batch` across steps (`clear` keeps the allocations).
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub seqs: Vec<BatchSeq>,
    pub block_tables: Vec<u32>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.seqs.clear();
        self.block_tables.clear();
    }

    /// Appends one sequence's new tokens and its block table; `want_logits`: a
    /// logits row for the last of them.
    pub fn push(
        &mut self,
        tokens: &[u32],
        num_cached: usize,
        block_table: &[u32],
        want_logits: bool,
    ) {
        self.push_rows(
            tokens,
            &[],
            num_cached,
            block_table,
            usize::from(want_logits),
        );
    }

    /// Appends a pooled request's prefill chunk: hidden-state rows (after the
    /// output norm) for its last `rows` tokens, in [`Logits::hidden`].
    pub fn push_hidden(&mut self, tokens: &[u32], num_cached: usize, table: &[u32], rows: usize) {
        self.push_rows(tokens, &[], num_cached, table, rows);
        self.seqs.last_mut().expect("just pushed").hidden = true;
    }

    /// Appends a prompt-scoring prefill chunk: a logits row for every one of its
    /// tokens (position `p`'s row scores the prompt token at `p + 1`).
    pub fn push_scored(&mut self, tokens: &[u32], num_cached: usize, block_table: &[u32]) {
        self.push_rows(tokens, &[], num_cached, block_table, tokens.len());
    }

    /// Appends a speculative verification row: the sequence's newest token
    /// `tokens` (its uncomputed tail) followed by `draft`, with a logits row for the
    /// newest token and for each draft token.
    pub fn push_verify(&mut self, tokens: &[u32], draft: &[u32], num_cached: usize, table: &[u32]) {
        self.push_rows(tokens, draft, num_cached, table, 1 + draft.len());
    }

    fn push_rows(
        &mut self,
        tokens: &[u32],
        draft: &[u32],
        num_cached: usize,
        block_table: &[u32],
        num_logits: usize,
    ) {
        self.seqs.push(BatchSeq {
            token_start: self.tokens.len(),
            num_tokens: tokens.len() + draft.len(),
            num_cached,
            block_table_start: self.block_tables.len(),
            block_table_len: block_table.len(),
            num_logits,
            hidden: false,
        });
        self.tokens.extend_from_slice(tokens);
        self.tokens.extend_from_slice(draft);
        self.block_tables.extend_from_slice(block_table);
    }

    pub fn seq_tokens(&self, s: &BatchSeq) -> &[u32] {
        &self.tokens[s.token_start..s.token_start + s.num_tokens]
    }

    pub fn block_table(&self, s: &BatchSeq) -> &[u32] {
        &self.block_tables[s.block_table_start..s.block_table_start + s.block_table_len]
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Number of logits rows the runner returns (one per sequence that wants
    /// logits, one per position of a verification row).
    pub fn num_logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| !s.hidden)
            .map(BatchSeq::num_rows)
            .sum()
    }

    /// Number of hidden-state rows the runner returns (pooled requests' rows).
    pub fn num_hidden_rows(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.hidden)
            .map(BatchSeq::num_rows)
            .sum()
    }
}

/// Logits returned by a runner: rows of `vocab_size`, for each sequence of the
/// batch in order, one per token of its [`BatchSeq::logit_tokens`] in order;
/// the rows of sequences marked [`BatchSeq::hidden`] are hidden states instead,
/// in `hidden` (rows of `hidden_size`, in the same order).
#[derive(Debug, Default, Clone)]
pub struct Logits {
    pub data: Vec<f32>,
    pub vocab_size: usize,
    pub hidden: Vec<f32>,
    pub hidden_size: usize,
}

impl Logits {
    pub fn num_rows(&self) -> usize {
        self.data.len().checked_div(self.vocab_size).unwrap_or(0)
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
    pub fn num_hidden_rows(&self) -> usize {
        self.hidden.len().checked_div(self.hidden_size).unwrap_or(0)
    }
    pub fn hidden_row(&self, i: usize) -> &[f32] {
        &self.hidden[i * self.hidden_size..(i + 1) * self.hidden_size]
    }
}

/// A failure inside a runner (a bad batch, an internal error of the backend).
#[derive(Debug, Clone)]
pub struct RunnerError(pub String);

impl fmt::Display for RunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for RunnerError {}

/// A model that runs flat batches over a paged KV cache it owns.
///
/// The runner knows nothing about scheduling: the engine decides which tokens run,
/// allocates KV blocks and passes block tables; the runner writes the new keys and
/// values into the slots those tables name (slot = `table[pos / block_size] *
/// block_size + pos % block_size`), attends causally over each sequence's own
/// cached tokens, and fills `out` with the logits rows the batch asks for
/// ([`BatchSeq::num_logits`]: the last token of a sequence, or each position of
/// a verification row), or the hidden states (after the output norm) a pooled
/// request's rows ask for ([`BatchSeq::hidden`]). A position's row must not
/// depend on how many other positions share the step (the engine's speculation
/// relies on it, and a pooled request's embedding on its companions).
pub trait ModelRunner: Send {
    fn info(&self) -> &RunnerInfo;
    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> Result<(), RunnerError>;

    /// Called when the engine restarts after a panic on its thread, before the
    /// runner serves again: drop any state a half-finished `execute` left. The KV
    /// contents need not be cleared (the engine restarts with every block free and
    /// an empty prefix cache, so no slot is read before it is written again).
    /// An error means the runner cannot serve again; the engine then stops.
    fn reset(&mut self) -> Result<(), RunnerError> {
        Ok(())
    }

    /// What a KV block's bytes mean, as one hash: the model file (its header and
    /// size, so its tokenizer too), the KV element type, the precision, the block
    /// size, anything else that changes the values. Blocks are kept on disk
    /// (`--prefix-cache-dir`) under it and never read back under another. `None`:
    /// the runner cannot copy its blocks (no disk tier).
    fn kv_identity(&self) -> Option<u64> {
        None
    }

    /// Bytes of one KV block as [`Self::read_kv_block`] copies it (all layers'
    /// keys and values).
    fn kv_block_bytes(&self) -> usize {
        0
    }

    /// Copies KV block `block` into `out` (`kv_block_bytes` long).
    fn read_kv_block(&self, block: u32, out: &mut [u8]) -> Result<(), RunnerError> {
        let _ = (block, out);
        Err(RunnerError("this runner cannot copy KV blocks".into()))
    }

    /// Writes `data` (what `read_kv_block` copied, maybe in an earlier process
    /// of the same `kv_identity`) into KV block `block`.
    fn write_kv_block(&mut self, block: u32, data: &[u8]) -> Result<(), RunnerError> {
        let _ = (block, data);
        Err(RunnerError("this runner cannot copy KV blocks".into()))
    }
}
