//! The reasoning budget (`thinking_token_budget`, vLLM's name): a constraint wrapped
//! around the request's own (or none) that lets the model reason freely, counts its
//! reasoning tokens as `usage` counts them (`crate::reasoning::ReasoningCount`, each
//! token's text through the answer's own splitter), and once the budget is spent while
//! the model still reasons, allows only the tokens of the reasoning's end
//! (`ReasoningFormat::close_text`: `</think>`; harmony's `<|end|><|start|>assistant
//! <|channel|>final<|message|>`), one after the other. These are the engine's forced
//! tokens: the mask allows one token, and the scheduler's fast-forward verifies them
//! as a draft (`TokenConstraint::forced_tokens`). No text is edited.
//!
//! The request's own grammar (response_format, tool calls) applies after the
//! reasoning ends when the answer starts inside it (a prompt that opened the block,
//! as DeepSeek-R1 distills' do: there the wrapper is used without a budget too, with
//! an unbounded one); otherwise from the first token, as without a budget.

use std::sync::Arc;

use sloserve_engine::sampler::constraint::{ConstraintFactory, SharedConstraint, TokenConstraint};
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::reasoning::ReasoningSplitter;

use crate::error::ServerError;
use crate::reasoning::ReasoningCount;
use crate::state::AppState;

/// One request's budget: what each sequence's matcher starts from.
struct Budget {
    state: Arc<AppState>,
    splitter: ReasoningSplitter,
    budget: u32,
    /// The tokens that end the reasoning.
    close: Vec<u32>,
    inner: Option<SharedConstraint>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("budget", &self.budget)
            .field("close", &self.close)
            .finish()
    }
}

/// The constraint of a request with `thinking_token_budget` `budget` on a model that
/// reasons (`None` where it does not: the budget has nothing to end), wrapping its
/// own constraint `inner`.
/// `splitter`: the answer's (`crate::reasoning::splitter`).
pub(crate) fn wrap(
    state: &Arc<AppState>,
    splitter: Option<ReasoningSplitter>,
    budget: u32,
    inner: Option<SharedConstraint>,
) -> Result<Option<SharedConstraint>, ServerError> {
    let Some(splitter) = splitter else {
        return Ok(inner);
    };
    let format = state
        .chat_template
        .as_ref()
        .map(|t| t.reasoning_format())
        .and_then(|f| f.close_text());
    let Some(text) = format else {
        return Ok(inner);
    };
    let close = state
        .tokenizer
        .encode(&text, true)
        .map_err(|e| ServerError::Internal(format!("cannot encode {text:?}: {e}")))?;
    Ok(Some(Arc::new(Budget {
        state: state.clone(),
        splitter,
        budget,
        close,
        inner,
    })))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reasoning (or not yet), within the budget.
    Free,
    /// The budget is spent: the `i`-th closing token is next.
    Closing(usize),
    /// The reasoning ended: the request's own constraint, if any, from here.
    After,
}

struct Matcher {
    state: Arc<AppState>,
    count: ReasoningCount,
    decoder: StreamDecoder,
    budget: u32,
    close: Vec<u32>,
    phase: Phase,
    inner: Option<Box<dyn TokenConstraint>>,
}

impl ConstraintFactory for Budget {
    fn matcher(&self) -> Box<dyn TokenConstraint> {
        // The answer starts inside the reasoning: the request's grammar waits for
        // its end; else it applies from the first token.
        let deferred = self.splitter.in_reasoning();
        let mut m = Matcher {
            state: self.state.clone(),
            count: ReasoningCount::new(self.splitter.clone()),
            decoder: StreamDecoder::new(true),
            budget: self.budget,
            close: self.close.clone(),
            phase: Phase::Free,
            inner: self.inner.as_ref().map(|f| f.matcher()),
        };
        if !deferred && m.inner.is_some() {
            m.phase = Phase::After;
        } else if deferred && self.budget == 0 {
            m.phase = Phase::Closing(0);
        }
        Box::new(m)
    }
}

impl TokenConstraint for Matcher {
    fn fill_mask(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        match (self.phase, &mut self.inner) {
            (Phase::Closing(i), _) => {
                allowed.fill(0);
                let t = self.close[i] as usize;
                match allowed.get_mut(t / 32) {
                    Some(w) => *w |= 1 << (t % 32),
                    None => return Err(format!("closing token {t} is past the vocabulary")),
                }
                Ok(())
            }
            (Phase::After, Some(inner)) => inner.fill_mask(allowed),
            _ => {
                allowed.fill(u32::MAX);
                Ok(())
            }
        }
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if self.phase == Phase::After {
            return match &mut self.inner {
                Some(inner) => inner.commit(token),
                None => Ok(()),
            };
        }
        let was = self.count.in_reasoning();
        let tok = &self.state.tokenizer;
        let piece = self.decoder.push(tok, token);
        if !piece.is_empty() || !tok.is_special(token) {
            self.count.push(piece);
        }
        self.phase = match self.phase {
            Phase::Closing(i) if token != self.close[i] => {
                return Err(format!("token {token} is not the reasoning's end"))
            }
            Phase::Closing(i) if i + 1 < self.close.len() => Phase::Closing(i + 1),
            Phase::Closing(_) => Phase::After,
            _ if was && !self.count.in_reasoning() => Phase::After,
            _ if self.count.in_reasoning() && self.count.count() >= self.budget => {
                Phase::Closing(0)
            }
            p => p,
        };
        Ok(())
    }

    fn is_finished(&self) -> bool {
        match (&self.phase, &self.inner) {
            (Phase::After, Some(inner)) => inner.is_finished(),
            _ => false,
        }
    }

    fn forced_tokens(&mut self) -> Vec<u32> {
        match (self.phase, &mut self.inner) {
            (Phase::Closing(i), _) => self.close[i..].to_vec(),
            (Phase::After, Some(inner)) => inner.forced_tokens(),
            _ => Vec::new(),
        }
    }
}
