//! `GrammarMatcher`: one sequence's grammar state over llguidance's `Matcher`, as
//! the engine's `TokenConstraint` (mask, commit, finished, forced tokens, rollback).

use llguidance::api::StopReason;
use llguidance::Matcher;
use sloserve_engine::sampler::constraint::TokenConstraint;
use sloserve_model::tokenizer::TextEncoder;

use crate::error::readable;

/// A per-sequence matcher. Masks are bitsets over the model's vocabulary (bit
/// `i % 32` of word `i / 32`: token `i` allowed).
pub struct GrammarMatcher {
    m: Matcher,
    vocab_size: usize,
    /// The model's tokenizer for forced text (else the trie's greedy tokenization).
    text: Option<TextEncoder>,
}

impl GrammarMatcher {
    pub(crate) fn new(m: Matcher, vocab_size: usize, text: Option<TextEncoder>) -> Self {
        GrammarMatcher {
            m,
            vocab_size,
            text,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether the grammar could end here (EOS allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.m.is_accepting().unwrap_or(false)
    }

    /// The matcher's error, once it failed.
    pub fn error(&self) -> Option<String> {
        self.m.get_error()
    }

    /// The bytes the grammar forces next (whatever the tokenization).
    pub fn forced_bytes(&mut self) -> Vec<u8> {
        self.m.compute_ff_bytes()
    }

    /// Fills `allowed` with the EOS set only.
    fn eos_only(&mut self, allowed: &mut [u32]) {
        allowed.fill(0);
        if let Ok(env) = self.m.tok_env() {
            for &t in env.tok_trie().eos_tokens() {
                if let Some(w) = allowed.get_mut(t as usize / 32) {
                    *w |= 1 << (t % 32);
                }
            }
        }
    }
}

impl TokenConstraint for GrammarMatcher {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        if self.m.is_stopped() {
            self.eos_only(allowed);
            return match self.m.get_error() {
                Some(e) => Err(readable(&e)),
                None => Ok(()),
            };
        }
        match self.m.compute_mask() {
            Ok(vob) => {
                let words = vob.as_slice();
                let n = words.len().min(allowed.len());
                allowed[..n].copy_from_slice(&words[..n]);
                allowed[n..].fill(0);
                // Bits past the vocabulary in the last word stay clear.
                let tail = self.vocab_size % 32;
                if tail != 0 && self.vocab_size / 32 < allowed.len() {
                    allowed[self.vocab_size / 32] &= (1u32 << tail) - 1;
                }
                Ok(())
            }
            Err(e) => {
                self.eos_only(allowed);
                Err(readable(&e.to_string()))
            }
        }
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.m
            .consume_token(token)
            .map_err(|e| readable(&e.to_string()))
    }

    fn is_finished(&self) -> bool {
        matches!(
            self.m.stop_reason(),
            StopReason::NoExtension
                | StopReason::NoExtensionBias
                | StopReason::EndOfSentence
                | StopReason::MaxTokensTotal
        ) && !self.m.is_error()
    }

    /// The forced bytes tokenized as the model's tokenizer would (so the model is
    /// likely to draw the same tokens and the draft is accepted), or greedily by the
    /// token trie when the bytes are not whole UTF-8 or that tokenization is refused;
    /// checked against the grammar.
    fn forced_tokens(&mut self) -> Vec<u32> {
        let bytes = self.m.compute_ff_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        let model = (self.text.as_ref())
            .zip(std::str::from_utf8(&bytes).ok())
            .and_then(|(t, text)| t.encode(text));
        if let Some(tokens) = model {
            let tokens = self.valid_prefix(tokens);
            if !tokens.is_empty() {
                return tokens;
            }
        }
        let Ok(env) = self.m.tok_env() else {
            return Vec::new();
        };
        let greedy = env.tok_trie().greedy_tokenize(&bytes);
        self.valid_prefix(greedy)
    }

    fn rollback(&mut self, n: usize) -> Result<(), String> {
        self.m.rollback(n).map_err(|e| e.to_string())
    }
}

impl GrammarMatcher {
    /// The longest prefix of `tokens`, less its last token (which what follows may
    /// extend: left to the draw), that the grammar accepts from here.
    fn valid_prefix(&mut self, mut tokens: Vec<u32>) -> Vec<u32> {
        tokens.pop();
        match self.m.validate_tokens(&tokens) {
            Ok(n) => {
                tokens.truncate(n);
                tokens
            }
            Err(_) => Vec::new(),
        }
    }
}
