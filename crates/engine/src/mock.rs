//! `MockRunner`: a deterministic fake model for scheduler and engine tests (also for
//! other crates' tests with the `mock` feature).
//!
//! It keeps, per KV slot, the token written there and a hash of the whole prefix up
//! to that position, chained from the previous slot *as read back through the block
//! table* (like a transformer's KV, which depends on every earlier token). The next
//! token is a function of the last position's hash, so a wrong block table, a missing
//! or overwritten slot, or a wrongly shared block changes the output. It also asserts
//! that every batch is valid: contiguous positions, tables covering the context, no
//! slot written twice in a step or written while another sequence reads it, and
//! every read slot written and consistent.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::runner::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};

/// Every batch a recording `MockRunner` executed, in order.
pub type BatchLog = Arc<Mutex<Vec<Batch>>>;

const SEED: u64 = 0x5105_e12e_u64;
/// Width of the mock's hidden states (a pooled request's rows).
pub const MOCK_HIDDEN: usize = 4;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hash of the prefix ending at `pos` with `token`, given the previous position's.
fn chain(prev: u64, token: u32, pos: usize) -> u64 {
    splitmix(prev ^ splitmix(((token as u64) << 32) ^ pos as u64))
}

pub struct MockRunner {
    info: RunnerInfo,
    slots: Vec<Option<(u32, u64)>>,
    log: Option<BatchLog>,
    delay_per_token: Duration,
    fail_at_call: Option<usize>,
    calls: usize,
    panic_on_token: Option<u32>,
    reset_fails: bool,
    /// `with_period`: the next token repeats the one this many positions back,
    /// except after one prefix in `noise` (by its hash; 0: never).
    period: Option<(usize, u64)>,
}

impl MockRunner {
    pub fn new(
        num_kv_blocks: usize,
        block_size: usize,
        vocab_size: usize,
        max_model_len: usize,
    ) -> Self {
        MockRunner {
            info: RunnerInfo {
                block_size,
                num_kv_blocks,
                vocab_size,
                max_model_len,
                kv_bytes_per_token: 1,
                encoder: false,
                small_batch_max_tokens: 0,
                experts: None,
            },
            slots: vec![None; num_kv_blocks * block_size],
            log: None,
            delay_per_token: Duration::ZERO,
            fail_at_call: None,
            calls: 0,
            panic_on_token: None,
            reset_fails: false,
            period: None,
        }
    }

    /// Records every executed batch into the returned log.
    pub fn with_log(mut self) -> (Self, BatchLog) {
        let log = BatchLog::default();
        self.log = Some(log.clone());
        (self, log)
    }

    /// Reports itself an encoder (`RunnerInfo::encoder`): pooled requests only,
    /// each prompt whole in one step.
    pub fn as_encoder(mut self) -> Self {
        self.info.encoder = true;
        self
    }

    /// Sleeps this long per batch token (simulated model cost).
    pub fn with_delay_per_token(mut self, d: Duration) -> Self {
        self.delay_per_token = d;
        self
    }

    /// The `n`-th call to `execute` (0-based) returns an error.
    pub fn with_failure_at_call(mut self, n: usize) -> Self {
        self.fail_at_call = Some(n);
        self
    }

    /// `execute` panics on a batch holding `token` (a marked request).
    pub fn with_panic_on_token(mut self, token: u32) -> Self {
        self.panic_on_token = Some(token);
        self
    }

    /// `reset` fails (the engine cannot restart after a panic).
    pub fn with_reset_failure(mut self) -> Self {
        self.reset_fails = true;
        self
    }

    /// A model whose text repeats: after position `p` (at least `period - 1`) it
    /// predicts the token at `p + 1 - period` (so n-gram drafts from the context
    /// are right), before that, and after one prefix in `noise` (0: none), the
    /// hash's token (a draft from the context is then wrong). The prefix hash
    /// chain is still checked.
    pub fn with_period(mut self, period: usize, noise: u64) -> Self {
        self.period = Some((period.max(1), noise));
        self
    }

    /// The token the mock model predicts after a prefix whose last hash is `h`.
    fn predict(h: u64, vocab: usize) -> u32 {
        (splitmix(h ^ 0xa5a5) % vocab as u64) as u32
    }

    /// The prediction after position `pos` (hash `h`); `at(q)` is the token at
    /// position `q <= pos`.
    fn next_token(&self, h: u64, pos: usize, at: impl Fn(usize) -> u32) -> u32 {
        match self.period {
            Some((p, noise)) if pos + 1 >= p && (noise == 0 || !h.is_multiple_of(noise)) => {
                at(pos + 1 - p)
            }
            _ => Self::predict(h, self.info.vocab_size),
        }
    }

    /// What greedy decoding of `prompt` yields for `n` tokens, computed directly
    /// (no engine, no KV cache): the ground truth for engine outputs.
    pub fn reference(prompt: &[u32], n: usize, vocab_size: usize) -> Vec<u32> {
        MockRunner::new(1, 1, vocab_size, usize::MAX).greedy(prompt, n)
    }

    /// What greedy decoding of `prompt` yields for `n` tokens on this mock (its
    /// period, if any), computed directly.
    pub fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut h = SEED;
        let mut all = prompt.to_vec();
        for (pos, &t) in prompt.iter().enumerate() {
            h = chain(h, t, pos);
        }
        for _ in 0..n {
            let pos = all.len() - 1;
            let t = self.next_token(h, pos, |q| all[q]);
            all.push(t);
            h = chain(h, t, pos + 1);
        }
        all.split_off(prompt.len())
    }

    fn slot(&self, table: &[u32], pos: usize) -> usize {
        let bs = self.info.block_size;
        table[pos / bs] as usize * bs + pos % bs
    }

    fn check(&self, batch: &Batch) -> Result<(), String> {
        let bs = self.info.block_size;
        let mut offset = 0;
        let mut writes = HashSet::new();
        let mut reads = HashSet::new();
        for (k, s) in batch.seqs.iter().enumerate() {
            if s.token_start != offset || s.num_tokens == 0 {
                return Err(format!("seq {k}: tokens not contiguous or empty"));
            }
            offset += s.num_tokens;
            let table = batch.block_table(s);
            if table.len() * bs < s.context_len() {
                return Err(format!(
                    "seq {k}: block table of {} blocks cannot hold {} tokens",
                    table.len(),
                    s.context_len()
                ));
            }
            if s.context_len() > self.info.max_model_len {
                return Err(format!(
                    "seq {k}: context {} over max_model_len",
                    s.context_len()
                ));
            }
            if let Some(b) = table
                .iter()
                .find(|&&b| b as usize >= self.info.num_kv_blocks)
            {
                return Err(format!("seq {k}: block {b} out of range"));
            }
            for pos in 0..s.num_cached {
                let slot = self.slot(table, pos);
                reads.insert(slot);
                if self.slots[slot].is_none() {
                    return Err(format!(
                        "seq {k}: position {pos} (slot {slot}) was never written"
                    ));
                }
            }
            for pos in s.num_cached..s.context_len() {
                if !writes.insert(self.slot(table, pos)) {
                    return Err(format!(
                        "seq {k}: slot of position {pos} written twice in one batch"
                    ));
                }
            }
        }
        if offset != batch.tokens.len() {
            return Err("batch tokens and sequences disagree".into());
        }
        if let Some(slot) = writes.intersection(&reads).next() {
            return Err(format!(
                "slot {slot} written while another sequence reads it"
            ));
        }
        Ok(())
    }
}

impl ModelRunner for MockRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> Result<(), RunnerError> {
        let call = self.calls;
        self.calls += 1;
        if let Some(log) = &self.log {
            log.lock().unwrap().push(batch.clone());
        }
        if self.fail_at_call == Some(call) {
            return Err(RunnerError("injected failure".into()));
        }
        if let Some(t) = self.panic_on_token {
            assert!(
                !batch.tokens.contains(&t),
                "MockRunner: marked token {t} in the batch"
            );
        }
        if let Err(e) = self.check(batch) {
            panic!("MockRunner: invalid batch: {e}");
        }
        let vocab = self.info.vocab_size;
        out.vocab_size = vocab;
        out.data.clear();
        out.hidden_size = MOCK_HIDDEN;
        out.hidden.clear();
        for s in &batch.seqs {
            let table = batch.block_table(s);
            // Read the whole context back and verify its hash chain.
            let mut h = SEED;
            for pos in 0..s.num_cached {
                let (t, stored) = self.slots[self.slot(table, pos)].expect("checked");
                h = chain(h, t, pos);
                assert_eq!(
                    h, stored,
                    "MockRunner: KV at position {pos} belongs to another prefix"
                );
            }
            let first_row = s.num_tokens - s.num_logits;
            for (i, &t) in batch.seq_tokens(s).iter().enumerate() {
                let pos = s.position(i);
                h = chain(h, t, pos);
                let slot = self.slot(table, pos);
                self.slots[slot] = Some((t, h));
                if i >= first_row && s.hidden {
                    // A hidden state that depends on the whole prefix (its chain hash).
                    out.hidden
                        .extend((0..MOCK_HIDDEN as u64).map(|k| ((h >> (8 * k)) & 0xff) as f32));
                } else if i >= first_row {
                    let slots = &self.slots;
                    let at = |q: usize| slots[self.slot(table, q)].expect("written").0;
                    let next = self.next_token(h, pos, at) as usize;
                    let start = out.data.len();
                    out.data.resize(start + vocab, 0.0);
                    out.data[start + next] = 10.0;
                    out.data[start + (next + 1) % vocab] = 5.0;
                }
            }
        }
        if !self.delay_per_token.is_zero() {
            std::thread::sleep(self.delay_per_token * batch.num_tokens() as u32);
        }
        Ok(())
    }

    /// Forgets every slot (a restarted engine must write before it reads).
    fn reset(&mut self) -> Result<(), RunnerError> {
        if self.reset_fails {
            return Err(RunnerError("mock reset failure".into()));
        }
        self.slots.fill(None);
        Ok(())
    }

    fn kv_identity(&self) -> Option<u64> {
        let i = &self.info;
        Some(splitmix(
            SEED ^ ((i.block_size as u64) << 32) ^ i.vocab_size as u64,
        ))
    }

    /// A slot: written (1 byte), token (4), prefix hash (8).
    fn kv_block_bytes(&self) -> usize {
        MOCK_SLOT_BYTES * self.info.block_size
    }

    fn read_kv_block(&self, block: u32, out: &mut [u8]) -> Result<(), RunnerError> {
        let bs = self.info.block_size;
        let slots = &self.slots[block as usize * bs..(block as usize + 1) * bs];
        for (s, o) in slots.iter().zip(out.chunks_exact_mut(MOCK_SLOT_BYTES)) {
            let (t, h) = s.unwrap_or((0, 0));
            o[0] = s.is_some() as u8;
            o[1..5].copy_from_slice(&t.to_le_bytes());
            o[5..].copy_from_slice(&h.to_le_bytes());
        }
        Ok(())
    }

    fn write_kv_block(&mut self, block: u32, data: &[u8]) -> Result<(), RunnerError> {
        let bs = self.info.block_size;
        if data.len() != MOCK_SLOT_BYTES * bs {
            return Err(RunnerError("KV block of the wrong size".into()));
        }
        let slots = &mut self.slots[block as usize * bs..(block as usize + 1) * bs];
        for (s, d) in slots.iter_mut().zip(data.chunks_exact(MOCK_SLOT_BYTES)) {
            let t = u32::from_le_bytes(d[1..5].try_into().expect("4 bytes"));
            let h = u64::from_le_bytes(d[5..].try_into().expect("8 bytes"));
            *s = (d[0] == 1).then_some((t, h));
        }
        Ok(())
    }
}

/// Bytes of one mock KV slot as `read_kv_block` copies it.
const MOCK_SLOT_BYTES: usize = 13;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_matches_reference_through_block_tables() {
        let mut r = MockRunner::new(8, 4, 50, 64);
        let prompt = [3, 1, 4, 1, 5, 9];
        let expect = MockRunner::reference(&prompt, 3, 50);
        let mut logits = Logits::default();
        let argmax = |l: &Logits| {
            let row = l.row(0);
            (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap() as u32
        };
        // Prefill in two chunks over scattered blocks 5 and 2, then decode.
        let mut b = Batch::default();
        b.push(&prompt[..4], 0, &[5], false);
        r.execute(&b, &mut logits).unwrap();
        b.clear();
        b.push(&prompt[4..], 4, &[5, 2], true);
        r.execute(&b, &mut logits).unwrap();
        assert_eq!(argmax(&logits), expect[0]);
        b.clear();
        b.push(&[expect[0]], 6, &[5, 2], true);
        r.execute(&b, &mut logits).unwrap();
        assert_eq!(argmax(&logits), expect[1]);
    }

    #[test]
    #[should_panic(expected = "never written")]
    fn mock_rejects_reading_unwritten_kv() {
        let mut r = MockRunner::new(8, 4, 50, 64);
        let mut b = Batch::default();
        b.push(&[1], 3, &[0], true);
        r.execute(&b, &mut Logits::default()).unwrap();
    }

    #[test]
    #[should_panic(expected = "written twice")]
    fn mock_rejects_two_writers_of_one_slot() {
        let mut r = MockRunner::new(8, 4, 50, 64);
        let mut b = Batch::default();
        b.push(&[1, 2], 0, &[0], true);
        b.push(&[1], 0, &[0], true);
        r.execute(&b, &mut Logits::default()).unwrap();
    }
}
