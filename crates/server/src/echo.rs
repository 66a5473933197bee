//! The prompt's part of a completion choice: `echo`'s text (the prompt ids
//! decoded, control tokens kept) and its legacy logprobs (`null` for the first
//! token, whose score needs a token before it), and vLLM's `prompt_logprobs`
//! list, both from the engine's prompt scores (`Event::PromptLogprobs`).

use sloserve_api::{CompletionLogprobs, PromptLogprobsEntry, PromptTokenLogprob, TopLogprobsMap};
use sloserve_engine::PromptLogprob;
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::tokenizer::Tokenizer;

use crate::generation::logprobs::token_text;

/// What a completion asked of its prompt.
#[derive(Debug, Clone, Default)]
pub struct PromptAsk {
    /// `echo`: the prompt ids whose text comes first.
    pub echo: Option<Vec<u32>>,
    /// `echo` with `logprobs`: that many alternatives per prompt token.
    pub echo_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: that many alternatives per prompt position.
    pub prompt_logprobs: Option<usize>,
}

impl PromptAsk {
    /// Whether the choice has a prompt part.
    pub fn any(&self) -> bool {
        self.echo.is_some() || self.prompt_logprobs.is_some()
    }
}

/// A choice's prompt part.
#[derive(Debug, Default)]
pub struct PromptPart {
    /// The echoed text ("" without `echo`).
    pub text: String,
    /// `echo` with `logprobs`: the prompt tokens' legacy logprobs.
    pub logprobs: Option<CompletionLogprobs>,
    /// vLLM's `prompt_logprobs`.
    pub prompt_logprobs: Option<Vec<Option<PromptLogprobsEntry>>>,
}

/// The prompt part for `ids` (the prompt as the engine saw it) and `scores` (one
/// per prompt token after the first, in order; fewer if the request ended early).
pub fn prompt_part(
    tok: &Tokenizer,
    ask: &PromptAsk,
    ids: &[u32],
    scores: &[PromptLogprob],
) -> PromptPart {
    let mut part = PromptPart::default();
    if ask.echo.is_some() {
        let mut dec = StreamDecoder::new(false);
        let mut offsets = Vec::with_capacity(ids.len());
        for &id in ids {
            offsets.push(part.text.len());
            part.text.push_str(dec.push(tok, id));
        }
        part.text.push_str(&dec.flush());
        if let Some(k) = ask.echo_logprobs {
            part.logprobs = Some(legacy(tok, ids, scores, &offsets, k));
        }
    }
    if let Some(k) = ask.prompt_logprobs {
        let entries = scores.iter().map(|s| Some(vllm_entry(tok, s, k)));
        part.prompt_logprobs = Some(std::iter::once(None).chain(entries).collect());
    }
    part
}

/// The legacy shape of the prompt tokens: `null` first, then each score with its
/// `k` best alternatives.
fn legacy(
    tok: &Tokenizer,
    ids: &[u32],
    scores: &[PromptLogprob],
    offsets: &[usize],
    k: usize,
) -> CompletionLogprobs {
    let n = ids.len().min(scores.len() + 1);
    let score = |j: usize| (j > 0).then(|| &scores[j - 1]);
    CompletionLogprobs {
        tokens: ids[..n].iter().map(|&id| token_text(tok, id)).collect(),
        token_logprobs: (0..n).map(|j| score(j).map(|s| s.logprob)).collect(),
        top_logprobs: (0..n)
            .map(|j| {
                score(j).map(|s| {
                    let top = s.top_logprobs.iter().take(k);
                    TopLogprobsMap(top.map(|&(id, lp)| (token_text(tok, id), lp)).collect())
                })
            })
            .collect(),
        text_offset: offsets[..n].to_vec(),
    }
}

/// vLLM's entry of one position: the prompt token, then its `k` best
/// alternatives (ranked 1..), each token once.
fn vllm_entry(tok: &Tokenizer, s: &PromptLogprob, k: usize) -> PromptLogprobsEntry {
    let entry = |logprob, rank, id| PromptTokenLogprob {
        logprob,
        rank,
        decoded_token: token_text(tok, id),
    };
    let mut out = vec![(s.id, entry(s.logprob, s.rank, s.id))];
    for (r, &(id, lp)) in s.top_logprobs.iter().take(k).enumerate() {
        if id != s.id {
            out.push((id, entry(lp, r as u32 + 1, id)));
        }
    }
    PromptLogprobsEntry(out)
}

/// Prepends the prompt's legacy logprobs to the generated tokens' (`gen`, whose
/// offsets are in the completion text), shifting those by `shift` bytes.
pub fn join_logprobs(
    prompt: Option<CompletionLogprobs>,
    gen: Option<CompletionLogprobs>,
    shift: usize,
) -> Option<CompletionLogprobs> {
    let mut gen = gen?;
    let Some(mut out) = prompt else {
        return Some(gen);
    };
    out.tokens.append(&mut gen.tokens);
    out.token_logprobs.append(&mut gen.token_logprobs);
    out.top_logprobs.append(&mut gen.top_logprobs);
    out.text_offset
        .extend(gen.text_offset.iter().map(|o| o + shift));
    Some(out)
}
