//! `Vocab`: a model's tokens as llguidance's token trie sees them: each token's raw
//! bytes, control tokens as `\xFF<name>` (toktrie's special-token marker, so no
//! grammar text ever matches them and Lark can name them as `<|im_end|>`), and the
//! model's end tokens as the trie's EOS set.

use std::sync::Arc;

use sloserve_model::tokenizer::Tokenizer;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::GrammarError;

/// The vocabulary a [`crate::GrammarFactory`] is built from.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Token `i`'s bytes; empty: never allowed (unused ids, padding past the tokenizer).
    pub tokens: Vec<Vec<u8>>,
    /// Control tokens (never produced by grammar text; named in Lark as `<...>`).
    pub special: Vec<bool>,
    /// The tokens that end a sequence (the trie's EOS set), first = the EOS.
    pub eos: Vec<u32>,
}

impl Vocab {
    /// From sloserve's tokenizer: `token_bytes` are already raw bytes for both
    /// families (byte-level BPE unmapped from its printable alphabet, SentencePiece
    /// `▁` as a space and `<0xNN>` as the byte). `n_vocab` is the model's logits
    /// width (at least the tokenizer's size; the ids past it are padding).
    pub fn from_tokenizer(tok: &Tokenizer, n_vocab: usize) -> Result<Self, GrammarError> {
        let n = n_vocab.max(tok.vocab_size());
        let mut tokens = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        for id in 0..n as u32 {
            tokens.push(tok.token_bytes_ref(id).to_vec());
            special.push(tok.is_special(id));
        }
        let mut eos: Vec<u32> = tok.eos_id().into_iter().collect();
        for id in tok.stop_token_ids() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        Ok(Vocab {
            tokens,
            special,
            eos,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token trie and tokenizer environment of llguidance. Tokenization inside
    /// llguidance is the trie's greedy one (not canonical), so llguidance does not
    /// force tokens by itself; every tokenization of the allowed text stays allowed.
    pub(crate) fn tok_env(&self) -> Result<TokEnv, GrammarError> {
        let n = self.tokens.len();
        if n == 0 || self.special.len() != n {
            return Err(GrammarError::Vocab(format!(
                "{n} tokens with {} special flags",
                self.special.len()
            )));
        }
        let Some(&first) = self.eos.first() else {
            return Err(GrammarError::Vocab("the tokenizer has no EOS token".into()));
        };
        if let Some(bad) = self.eos.iter().find(|&&e| e as usize >= n) {
            return Err(GrammarError::Vocab(format!(
                "EOS id {bad} out of range ({n})"
            )));
        }
        let words: Vec<Vec<u8>> = self
            .tokens
            .iter()
            .zip(&self.special)
            .enumerate()
            // End tokens are always special: no grammar text may spell them.
            .map(|(id, (b, &sp))| (b, sp || self.eos.contains(&(id as u32))))
            .map(|(b, sp)| match (sp, b.is_empty()) {
                (_, true) => Vec::new(),
                (true, false) => {
                    let mut w = Vec::with_capacity(b.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(b);
                    w
                }
                (false, false) => b.clone(),
            })
            .collect();
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&self.eos);
        Ok(Arc::new(ApproximateTokEnv::new(trie)))
    }
}
