//! Token sampling for one sequence: greedy, temperature, top-k, top-p, min-p, seed,
//! presence/frequency penalties, and the top-N logprobs of each sampled token.
//! This module owns the per-sequence sampler state (parameters, RNG, output token
//! counts) and the whole CPU logits-row -> token pipeline; its vocabulary-sized
//! scratch buffers are per thread and reused, so the hot path doesn't allocate.
//!
//! Pipeline of [`Sampler::sample`] (OpenAI / vLLM semantics):
//! 1. log-softmax of the RAW logits gives the returned `logprob` / `top_logprobs`
//!    (skipped by [`Sampler::sample_lean`], the engine's call, when no logprobs
//!    were asked: the draw below never needs the normaliser);
//! 2. with a constraint ([`Sampler::with_constraint`], see [`constraint`]): only
//!    the tokens it allows are drawn from, as if the others were `-inf`;
//!    `logprob` stays raw. One allowed token is taken without a draw; up to a
//!    quarter of the row (a fifth for greedy) is gathered into a compact
//!    candidate list the draw runs over ([`candidates`]: the same token for the
//!    same seed as the masked row); a denser mask is applied by a masked copy
//!    (greedy without penalties: a masked argmax, no copy);
//! 3. on a copy (or the candidates), only when they apply: logit bias, repetition,
//!    presence / frequency penalties over the tokens generated so far (see
//!    [`Sampler::observe`]);
//! 4. temperature < 1e-5 → greedy argmax (ties → lowest id); otherwise divide by the
//!    temperature, then top-k, top-p (nucleus), min-p, renormalise and draw.
//!
//! Cost per token is a few vectorised O(V) reads of the row (a polynomial `exp`,
//! no full sort, no sanitised copy): greedy is one max and one scan; a plain
//! temperature draw sums exp block by block and rescans one block; top-k streams
//! (k ≤ 64) or selects and weighs only its candidates; top-p finds its cut with a
//! histogram over binary exponents and sorts one bucket.
//!
//! Robustness: NaN logits count as `-inf` (never picked unless the whole row is
//! masked), `+inf` logits as `f32::MAX`; a fully masked row is sampled uniformly;
//! out-of-range knobs are clamped; `sample` never panics, not even on an empty row.

use std::cell::RefCell;
use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::event::FinishReason;

mod params;
pub use params::{SampledToken, SamplingParams};

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_TEMPERATURE_EPS: f32 = 1e-5;
/// Most alternatives returned per token (OpenAI's cap).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Temperatures above this are clamped (keeps `x / T` free of `inf * 0`).
const MAX_TEMPERATURE: f32 = 1e6;
/// Up to this k, top-k is one streaming pass; above, `select_nth_unstable`.
const STREAMING_TOP_K: usize = 64;
/// First chunk of the partial sort used by top-p; grows 4x per round.
const NUCLEUS_FIRST_CHUNK: usize = 64;
/// Independent accumulators of the vectorisable reductions.
const LANES: usize = 8;
/// Scans skip chunks of this many values by their (vectorised) max.
const SKIP_CHUNK: usize = 32;
/// Reductions sum blocks of this many f32 in f32 lanes, the blocks in f64.
const BLOCK: usize = 256;

/// Per-sequence sampler state: the RNG and the output token counts for penalties.
///
/// The vocabulary-sized scratch buffers are per thread (not per sampler), so a
/// thousand live sequences don't each hold megabytes of scratch; they are reused
/// from token to token, so the hot path doesn't allocate (beyond the returned
/// `top_logprobs` when asked for).
pub struct Sampler {
    params: SamplingParams,
    vocab_size: usize,
    // Effective (sanitised) knobs, derived once from `params`.
    greedy: bool,
    inv_temperature: f32,
    /// 0: off.
    top_k: usize,
    /// >= 1: off.
    top_p: f32,
    /// <= 0: off; at most 1.
    min_p: f32,
    presence: f32,
    frequency: f32,
    /// 1: off; else > 0.
    repetition: f32,
    /// The prompt's distinct tokens, sorted (only with a repetition penalty).
    prompt_tokens: Vec<u32>,
    /// None: no top logprobs; otherwise capped at `MAX_TOP_LOGPROBS`.
    num_top_logprobs: Option<usize>,
    rng: StdRng,
    /// Output token id -> times generated. Sparse: O(distinct output tokens).
    counts: HashMap<u32, u32>,
    /// The grammar the draw is masked by (see [`constraint`]), with its mask buffer.
    constraint: Option<Constrained>,
    /// Tests: constrained draws over the masked copy of the row, as before the
    /// candidates (the reference they are checked against).
    #[cfg(test)]
    pub(super) masked_copy_path: bool,
}

/// Reusable buffers of one sampling step.
#[derive(Default)]
struct Scratch {
    /// The penalised copy of the logits row (only when penalties apply).
    pen: Vec<f32>,
    /// Weights exp(s - max) of the candidates (at their ids) or of the whole row.
    work: Vec<f32>,
    /// Candidate tokens as [`desc_key`]s (value-descending, then id-ascending).
    keys: Vec<u64>,
    /// Running top-N (id, value).
    top: Vec<(u32, f32)>,
    /// Per-block weight sums of the dense draw.
    sums: Vec<f32>,
    /// A constrained row's allowed tokens.
    cands: Candidates,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .field("vocab_size", &self.vocab_size)
            .field("distinct_output_tokens", &self.counts.len())
            .field("constrained", &self.constraint.is_some())
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// `vocab_size` is informational (see [`Sampler::vocab_size`]); the length of
    /// each logits row passed to [`Sampler::sample`] is what counts.
    pub fn new(params: SamplingParams, vocab_size: usize) -> Self {
        let t = params.temperature;
        // NaN / tiny / negative temperature => greedy.
        let greedy = t.is_nan() || t < GREEDY_TEMPERATURE_EPS;
        let inv_temperature = if greedy {
            1.0
        } else {
            1.0 / t.min(MAX_TEMPERATURE)
        };
        let top_p = if params.top_p.is_nan() {
            1.0
        } else {
            params.top_p.max(0.0)
        };
        let min_p = if params.min_p.is_nan() {
            0.0
        } else {
            params.min_p.min(1.0)
        };
        let finite_or_zero = |x: f32| if x.is_finite() { x } else { 0.0 };
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Sampler {
            vocab_size,
            greedy,
            inv_temperature,
            top_k: params.top_k,
            top_p,
            min_p,
            presence: finite_or_zero(params.presence_penalty),
            frequency: finite_or_zero(params.frequency_penalty),
            repetition: match params.repetition_penalty {
                r if r.is_finite() && r > 0.0 => r,
                _ => 1.0,
            },
            prompt_tokens: Vec::new(),
            num_top_logprobs: params.logprobs.map(|n| n.min(MAX_TOP_LOGPROBS)),
            rng,
            counts: HashMap::new(),
            constraint: None,
            #[cfg(test)]
            masked_copy_path: false,
            params,
        }
    }

    /// Tokens of the prompt, which the repetition penalty counts as seen (kept only
    /// when one applies).
    pub fn with_prompt(mut self, prompt: &[u32]) -> Self {
        if self.repetition != 1.0 {
            self.prompt_tokens = prompt.to_vec();
            self.prompt_tokens.sort_unstable();
            self.prompt_tokens.dedup();
        }
        self
    }

    /// Masks every draw by `constraint` (see [`constraint`]): only tokens it allows
    /// are drawn (greedy included), each drawn token is committed to it. `None`: as
    /// [`Sampler::new`].
    pub fn with_constraint(mut self, constraint: Option<Box<dyn TokenConstraint>>) -> Self {
        self.constraint = constraint.map(Constrained::new);
        self
    }

    /// Whether the draw is constrained.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// How the constraint ended the sequence, once it did: `Stop` when the grammar
    /// is complete, `Error` when it failed (mask error, nothing allowed, token refused).
    pub fn constraint_end(&self) -> Option<FinishReason> {
        self.constraint.as_ref().and_then(|c| c.end.clone())
    }

    /// How long the grammar took to fill the mask of the latest sampled token
    /// (None when unconstrained or before the first).
    pub fn last_mask_time(&self) -> Option<std::time::Duration> {
        self.constraint.as_ref().and_then(|c| c.mask_time)
    }

    /// The constraint's matcher (forced tokens, rollback), if any.
    pub fn constraint_mut(&mut self) -> Option<&mut (dyn TokenConstraint + 'static)> {
        self.constraint.as_mut().map(|c| &mut *c.matcher)
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The vocabulary size given to [`Sampler::new`].
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// How many times `token` has been generated (observed) so far.
    pub fn count(&self, token: u32) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }

    /// Samples the next token from one logits row and always fills the sampled
    /// token's `logprob` (plus `top_logprobs` when asked). `logits` is not modified.
    ///
    /// Calls [`Sampler::observe`] exactly once with the returned id (except for an
    /// empty row, which yields id 0 with logprob `-inf` and records nothing).
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        self.sample_scratch(logits, true)
    }

    /// The engine's per-token call: [`Sampler::sample`] (the same token for the
    /// same seed), except that the log-softmax over the row is computed only when
    /// the request asked for logprobs (`SamplingParams::logprobs` is `Some`);
    /// otherwise `logprob` is NaN and the row is read once or twice, not normalised.
    pub fn sample_lean(&mut self, logits: &[f32]) -> SampledToken {
        let asked = self.num_top_logprobs.is_some();
        self.sample_scratch(logits, asked)
    }

    fn sample_scratch(&mut self, logits: &[f32], logprob: bool) -> SampledToken {
        let shared = SCRATCH.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => Some(self.sample_with(&mut scratch, logits, logprob)),
            Err(_) => None,
        });
        match shared {
            Ok(Some(token)) => token,
            // Thread-local storage being torn down (or re-entered): use a fresh one.
            _ => self.sample_with(&mut Scratch::default(), logits, logprob),
        }
    }

    /// Records a generated token (for presence/frequency penalties). `sample` calls
    /// this itself. The engine never calls it: a preempted sequence keeps its
    /// generated tokens and this sampler (counts and RNG), and recomputing its KV
    /// samples nothing, so no token is observed twice.
    pub fn observe(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// The repetition penalty on a sanitised copy (or the candidates): each token
    /// seen in the prompt or the output once, positive logits divided by it,
    /// negative ones multiplied.
    fn penalise_repeats<S: Slots>(&self, row: &mut S) {
        let r = self.repetition;
        let mut apply = |id: u32| {
            if let Some(x) = row.slot(id) {
                *x = if *x > 0.0 { *x / r } else { *x * r };
            }
        };
        self.prompt_tokens.iter().for_each(|&id| apply(id));
        self.counts
            .keys()
            .filter(|id| self.prompt_tokens.binary_search(id).is_err())
            .for_each(|&id| apply(id));
    }

    /// Which of logit bias, repetition penalty, presence / frequency penalties
    /// change this token's row.
    fn adjustments(&self) -> Adjust {
        Adjust {
            biased: !self.params.logit_bias.is_empty(),
            repeated: self.repetition != 1.0
                && !(self.counts.is_empty() && self.prompt_tokens.is_empty()),
            penalised: (self.presence != 0.0 || self.frequency != 0.0) && !self.counts.is_empty(),
        }
    }

    /// Applies `a` to a sanitised (masked) copy of the row or to the candidates,
    /// in this order: bias, repetition, presence / frequency.
    fn adjust<S: Slots>(&self, row: &mut S, a: Adjust) {
        for &(id, b) in self.params.logit_bias.iter().filter(|_| a.biased) {
            if let Some(x) = row.slot(id) {
                // -inf (masked) stays -inf.
                *x += if b.is_finite() { b } else { 0.0 };
            }
        }
        if a.repeated {
            self.penalise_repeats(row);
        }
        for (&id, &c) in self.counts.iter().filter(|_| a.penalised) {
            if let Some(x) = row.slot(id) {
                if c > 0 {
                    let y = *x - (self.presence + self.frequency * c as f32);
                    // -inf - -inf (huge negative penalties): stay masked.
                    *x = if y.is_nan() { f32::NEG_INFINITY } else { y };
                }
            }
        }
    }

    /// Whether a constrained draw goes over the gathered candidates (otherwise over
    /// a masked copy of the row: top-k above `STREAMING_TOP_K`, whose selection
    /// order is the full row's).
    fn draws_candidates(&self, n: usize) -> bool {
        #[cfg(test)]
        if self.masked_copy_path {
            return false;
        }
        !(self.top_k > STREAMING_TOP_K && self.top_k < n)
    }

    /// Every kernel sanitises as it reads (NaN → -inf, +inf → `f32::MAX`), so the
    /// raw row is read in place: copied only when penalties change it. A
    /// constrained row's allowed tokens are gathered ([`candidates`]) and the draw
    /// runs over them; one allowed token is taken without a draw.
    fn sample_with(&mut self, sc: &mut Scratch, logits: &[f32], logprob: bool) -> SampledToken {
        let n = logits.len();
        if n == 0 {
            return SampledToken {
                id: 0,
                logprob: f32::NEG_INFINITY,
                top_logprobs: Vec::new(),
            };
        }

        // 1. The grammar's mask: the allowed tokens gathered (most rows), or a
        // sanitised copy with -inf where disallowed (dense masks, top-k > 64).
        let candidates = self.draws_candidates(n);
        // Greedy gathers fewer candidates than sampling before a scan of the
        // masked row is cheaper, and needs no copy for it without penalties.
        let max_fraction = if self.greedy {
            GREEDY_CANDIDATES_MAX_FRACTION
        } else {
            CANDIDATES_MAX_FRACTION
        };
        let fused_argmax = candidates && self.greedy && !self.adjustments().any();
        let masked = match &mut self.constraint {
            Some(c) => match c.timed_fill(n) {
                0 => Masked::No,
                1 if candidates => Masked::Forced(only_allowed(&c.mask)),
                allowed if candidates && allowed <= n / max_fraction => {
                    sc.cands.gather(logits, &c.mask, allowed);
                    Masked::Candidates
                }
                _ if fused_argmax => Masked::Argmax(masked_argmax(logits, &c.mask)),
                _ => Masked::Copy(masked_copy(&mut sc.pen, logits, &c.mask)),
            },
            None => Masked::No,
        };

        // 2. The log-softmax of the raw row, only when the logprobs are wanted
        // (the raw max also when the raw row is drawn from).
        let raw_max = (logprob || masked == Masked::No).then(|| sanitize(max_of(logits)));
        let norm = raw_max
            .filter(|_| logprob)
            .map(|m| LogSoftmax::new(logits, m));
        let top_logprobs = match (&norm, self.num_top_logprobs) {
            (Some(norm), Some(k)) if k > 0 => {
                top_n_into(&mut sc.top, logits, k.min(n), 1.0);
                sc.top
                    .iter()
                    .map(|&(id, x)| (id, norm.logprob(x)))
                    .collect()
            }
            _ => Vec::new(),
        };

        // 3. Penalties over the tokens generated so far, then the pick.
        let id = match masked {
            Masked::Forced(id) => {
                // The random number a draw would take, so that a seed's later
                // tokens are those it gave before.
                if !self.greedy {
                    let _: f64 = self.rng.random();
                }
                id
            }
            Masked::Argmax(id) => id,
            Masked::Candidates => self.pick_candidate(sc),
            Masked::Copy(max) => self.pick_row(sc, logits, max, true),
            Masked::No => self.pick_row(sc, logits, raw_max.unwrap_or(f32::NAN), false),
        };

        self.observe(id);
        if let Some(c) = &mut self.constraint {
            c.commit(id);
        }
        SampledToken {
            id,
            logprob: norm.map_or(f32::NAN, |nm| nm.logprob(sanitize(logits[id as usize]))),
            top_logprobs,
        }
    }

    /// The pick over the row (`logits`, or `sc.pen` when `copied` holds its masked
    /// copy), whose sanitised max is `max`: penalties on a sanitised copy when they
    /// apply, then greedy or draw.
    fn pick_row(&mut self, sc: &mut Scratch, logits: &[f32], max: f32, copied: bool) -> u32 {
        let a = self.adjustments();
        let (row, max) = if a.any() {
            if !copied {
                sc.pen.clear();
                sc.pen.extend(logits.iter().map(|&x| sanitize(x)));
            }
            self.adjust(&mut sc.pen, a);
            (&sc.pen[..], max_of(&sc.pen))
        } else if copied {
            (&sc.pen[..], max)
        } else {
            (logits, max)
        };
        if self.greedy {
            return argmax(row);
        }
        let Scratch {
            work,
            keys,
            top,
            sums,
            ..
        } = sc;
        let bufs = Bufs {
            work,
            keys,
            top,
            sums,
        };
        self.draw(row, max, bufs, None)
    }

    /// The pick over the gathered candidates (`sc.cands`, at least two):
    /// penalties on them, then greedy or draw — the token the masked row gives.
    fn pick_candidate(&mut self, sc: &mut Scratch) -> u32 {
        let Scratch {
            cands,
            work,
            keys,
            top,
            sums,
            ..
        } = sc;
        let a = self.adjustments();
        if a.any() {
            self.adjust(cands, a);
        }
        let i = if self.greedy {
            argmax(&cands.vals)
        } else {
            let max = max_of(&cands.vals);
            let bufs = Bufs {
                work,
                keys,
                top,
                sums,
            };
            self.draw(&cands.vals, max, bufs, Some(cands))
        };
        cands.ids[i as usize]
    }
}

/// Which adjustments apply to one row (see [`Sampler::adjustments`]).
#[derive(Clone, Copy)]
struct Adjust {
    biased: bool,
    repeated: bool,
    penalised: bool,
}

impl Adjust {
    fn any(self) -> bool {
        self.biased || self.repeated || self.penalised
    }
}

/// How a constrained row's mask was applied.
#[derive(Clone, Copy, PartialEq)]
enum Masked {
    No,
    /// Gathered into `Scratch::cands`.
    Candidates,
    /// A masked copy in `Scratch::pen`, with its max.
    Copy(f32),
    /// The only token allowed.
    Forced(u32),
    /// The masked row's argmax, found without a copy (greedy, no penalties).
    Argmax(u32),
}

/// A mask allowing more than 1 / this of the row is sampled from a masked copy (a
/// string's mask: most of the vocabulary): gathering that many candidates costs
/// more than copying the row and drawing from it.
const CANDIDATES_MAX_FRACTION: usize = 4;
/// The same for greedy, whose pick over the masked row is one scan.
const GREEDY_CANDIDATES_MAX_FRACTION: usize = 5;

mod candidates;
use candidates::{Candidates, Slots};
pub mod constraint;
use constraint::{masked_argmax, masked_copy, only_allowed, Constrained, TokenConstraint};
mod draw;
use draw::Bufs;
mod kernels;
use kernels::*;
pub mod score;

#[cfg(test)]
mod bench_tests;
#[cfg(test)]
mod candidates_tests;
#[cfg(test)]
mod constraint_tests;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod lean_tests;
#[cfg(test)]
mod tests;
