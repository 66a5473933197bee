//! The engine's sampler as of commit dc9079b (before the lean per-token path), frozen
//! as the token bench's baseline; `cargo bench -p sloserve-model --bench token`.
//!
//! Token sampling for one sequence: greedy, temperature, top-k, top-p, min-p, seed,
//! presence/frequency penalties, and the top-N logprobs of each sampled token.
//! This module owns the per-sequence sampler state (parameters, RNG, output token
//! counts) and the whole CPU logits-row -> token pipeline; its vocabulary-sized
//! scratch buffers are per thread and reused, so the hot path doesn't allocate.
//!
//! Pipeline of [`Sampler::sample`] (OpenAI / vLLM semantics):
//! 1. log-softmax of the RAW logits gives the returned `logprob` / `top_logprobs`;
//! 2. on a working copy: presence / frequency penalties over the tokens generated so
//!    far (see [`Sampler::observe`]);
//! 3. temperature < 1e-5 → greedy argmax (ties → lowest id); otherwise divide by the
//!    temperature, then top-k, top-p (nucleus), min-p, renormalise and draw.
//!
//! Cost per token is a handful of vectorised O(V) passes (a polynomial `exp`, no
//! full sort): top-k streams (k ≤ 64) or selects, top-p finds its cut with a
//! histogram over binary exponents and sorts one bucket.
//!
//! Robustness: NaN logits count as `-inf` (never picked unless the whole row is
//! masked), `+inf` logits as `f32::MAX`; a fully masked row is sampled uniformly;
//! out-of-range knobs are clamped; `sample` never panics, not even on an empty row.

use std::cell::RefCell;
use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Sampling parameters of one request (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: usize,
    /// 1.0 means disabled.
    pub top_p: f32,
    /// 0.0 means disabled.
    pub min_p: f32,
    /// Same seed (and same logits) => same tokens.
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Return the top-N logprobs of each sampled token (None: no logprobs at all;
    /// Some(0): only the sampled token's own logprob).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// One sampled token with its logprob (log-softmax of the raw logits) and, when
/// asked, the most likely alternatives (id, logprob), best first.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
}

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
    /// None: no top logprobs; otherwise capped at `MAX_TOP_LOGPROBS`.
    num_top_logprobs: Option<usize>,
    rng: StdRng,
    /// Output token id -> times generated. Sparse: O(distinct output tokens).
    counts: HashMap<u32, u32>,
}

/// Reusable buffers of one sampling step.
#[derive(Default)]
struct Scratch {
    /// Working copy of the logits row (then penalised / scaled logits, weights).
    work: Vec<f32>,
    /// Candidate tokens as [`desc_key`]s (value-descending, then id-ascending).
    keys: Vec<u64>,
    /// Running top-N (id, value).
    top: Vec<(u32, f32)>,
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
            num_top_logprobs: params.logprobs.map(|n| n.min(MAX_TOP_LOGPROBS)),
            rng,
            counts: HashMap::new(),
            params,
        }
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

    /// Samples the next token from one logits row. `logits` is not modified.
    ///
    /// Calls [`Sampler::observe`] exactly once with the returned id (except for an
    /// empty row, which yields id 0 with logprob `-inf` and records nothing).
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        let shared = SCRATCH.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => Some(self.sample_with(&mut scratch, logits)),
            Err(_) => None,
        });
        match shared {
            Ok(Some(token)) => token,
            // Thread-local storage being torn down (or re-entered): use a fresh one.
            _ => self.sample_with(&mut Scratch::default(), logits),
        }
    }

    /// Records a generated token (for presence/frequency penalties). `sample` calls
    /// this itself. The engine never calls it: a preempted sequence keeps its
    /// generated tokens and this sampler (counts and RNG), and recomputing its KV
    /// samples nothing, so no token is observed twice.
    pub fn observe(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    fn sample_with(&mut self, sc: &mut Scratch, logits: &[f32]) -> SampledToken {
        let n = logits.len();
        if n == 0 {
            return SampledToken {
                id: 0,
                logprob: f32::NEG_INFINITY,
                top_logprobs: Vec::new(),
            };
        }

        // 1. Sanitised working copy and the log-softmax normaliser of the raw row.
        sc.work.clear();
        sc.work.extend(logits.iter().map(|&x| sanitize(x)));
        let raw_max = max_of(&sc.work);
        let norm = LogSoftmax::new(&sc.work, raw_max);

        let top_logprobs = match self.num_top_logprobs {
            Some(k) if k > 0 => {
                top_n_into(&mut sc.top, &sc.work, k.min(n));
                sc.top
                    .iter()
                    .map(|&(id, x)| (id, norm.logprob(x)))
                    .collect()
            }
            _ => Vec::new(),
        };

        // 2. Penalties over the tokens generated so far.
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&id, &c) in &self.counts {
                if let Some(x) = sc.work.get_mut(id as usize) {
                    if c > 0 {
                        let y = *x - (self.presence + self.frequency * c as f32);
                        // -inf - -inf (huge negative penalties): stay masked.
                        *x = if y.is_nan() { f32::NEG_INFINITY } else { y };
                    }
                }
            }
        }

        // 3. Pick.
        let id = if self.greedy {
            argmax(&sc.work)
        } else {
            self.draw(sc)
        };

        self.observe(id);
        SampledToken {
            id,
            logprob: norm.logprob(sanitize(logits[id as usize])),
            top_logprobs,
        }
    }

    /// Temperature, top-k, top-p, min-p and the random draw, on the penalised
    /// working copy in `sc.work` (which it overwrites). `sc.work` is non-empty.
    fn draw(&mut self, sc: &mut Scratch) -> u32 {
        let Scratch { work: w, keys, top } = sc;
        let n = w.len();
        if self.inv_temperature != 1.0 {
            let inv_t = self.inv_temperature;
            w.iter_mut().for_each(|x| *x *= inv_t);
        }
        let m = max_of(w);
        let use_top_k = self.top_k > 0 && self.top_k < n;
        let use_top_p = self.top_p < 1.0;
        let use_min_p = self.min_p > 0.0;

        if !(use_top_k || use_top_p || use_min_p) {
            // Plain softmax over the whole row: no candidate list needed.
            let z = exp_in_place(w, m);
            let u = self.rng.random::<f64>() * z;
            return walk_dense(w, u);
        }

        // Candidate keys, with weights exp(s - max) written into `w` at their ids.
        // The max token always survives, with weight exactly 1.
        keys.clear();
        let min_w = self.min_p;
        if use_top_k {
            if self.top_k <= STREAMING_TOP_K {
                top_n_into(top, w, self.top_k);
                keys.extend(top.iter().map(|&(id, x)| desc_key(x, id)));
            } else {
                keys.extend(w.iter().enumerate().map(|(i, &x)| desc_key(x, i as u32)));
                keys.select_nth_unstable(self.top_k - 1);
                keys.truncate(self.top_k);
            }
            let mut z = 0.0f64;
            for &k in keys.iter() {
                let i = key_id(k);
                let p = weight(w[i], m);
                w[i] = p;
                z += p as f64;
            }
            keys.retain(|&k| {
                let p = w[key_id(k)];
                p > 0.0 && p >= min_w
            });
            // Top-p over the top-k renormalised distribution, then intersected
            // with min-p: both keep a prefix of the sorted order, so cutting the
            // min-p survivors at the top-p mass (measured against the top-k
            // normaliser `z`) is the same as applying top-p then min-p.
            if use_top_p {
                let (cut, _) = nucleus_len(keys, w, self.top_p as f64 * z);
                keys.truncate(cut.max(1));
            }
        } else {
            let z = exp_in_place(w, m);
            if use_top_p {
                nucleus_dense(w, keys, min_w, self.top_p as f64 * z);
            } else {
                keys.extend(min_p_survivors(w, min_w, 0));
            }
        }

        let total: f64 = keys.iter().map(|&k| w[key_id(k)] as f64).sum();
        let u = self.rng.random::<f64>() * total;
        let mut acc = 0.0f64;
        for &k in keys.iter() {
            acc += w[key_id(k)] as f64;
            if u < acc {
                return key_id(k) as u32;
            }
        }
        // Rounding (u == total): the last candidate (all have weight > 0).
        match keys.last() {
            Some(&k) => key_id(k) as u32,
            None => argmax(w),
        }
    }
}

mod kernels;
use kernels::*;
