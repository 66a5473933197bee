//! `StreamDecoder`: incremental detokenization of generated ids into text pieces that
//! are always whole UTF-8 (an incomplete multi-byte sequence is held back until a later
//! token completes it), matching `Tokenizer::decode` of the whole sequence.

use crate::tokenizer::Tokenizer;

/// Turns token ids into text one at a time. The concatenation of every `push` result
/// and the final `flush` equals `tokenizer.decode(all_ids, skip_special)`.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    skip_special: bool,
    /// Control tokens decoded even when skipping: a tool-call format's markers
    /// (`crate::tool_format::ToolCallFormat::rendered_markers`), as llama.cpp's preserved tokens.
    kept: Vec<u32>,
    /// Bytes of a UTF-8 sequence not yet complete.
    pending: Vec<u8>,
    /// The text produced by the latest `push` (buffer reused between calls).
    out: String,
}

impl StreamDecoder {
    /// `skip_special`: drop control tokens (`<|im_end|>`, ...) instead of emitting their text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            kept: Vec::new(),
            pending: Vec::with_capacity(16),
            out: String::with_capacity(64),
        }
    }

    /// Decodes the control tokens `ids` even when skipping the others.
    pub fn keep(&mut self, ids: Vec<u32>) {
        self.kept = ids;
    }

    /// Feeds one token and returns the text it completes (possibly empty). Ids outside the
    /// vocab contribute nothing. Invalid byte sequences become U+FFFD, as in `decode`.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> &str {
        self.out.clear();
        if self.skip_special && tok.is_special(id) && !self.kept.contains(&id) {
            return &self.out;
        }
        self.pending.extend_from_slice(tok.token_bytes_ref(id));
        self.drain_valid();
        &self.out
    }

    /// Returns whatever is still held back (an incomplete sequence becomes U+FFFD) and
    /// resets the decoder for reuse.
    pub fn flush(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.out.clear();
        rest
    }

    /// True when bytes of an incomplete UTF-8 sequence are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Moves every complete character of `pending` into `out`, replacing invalid
    /// sequences the way `String::from_utf8_lossy` does, and keeps an incomplete tail.
    fn drain_valid(&mut self) {
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    self.out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is UTF-8, so this never fails.
                    if let Ok(s) = std::str::from_utf8(&self.pending[start..start + valid]) {
                        self.out.push_str(s);
                    }
                    start += valid;
                    match e.error_len() {
                        Some(n) => {
                            self.out.push('\u{FFFD}');
                            start += n;
                        }
                        None => break, // incomplete: wait for more bytes
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}
