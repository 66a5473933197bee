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
    /// this itself; the engine calls it when it replays tokens after preemption.
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

/// NaN → -inf, +inf → f32::MAX: the row then holds no NaN and no +inf.
#[inline]
fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

/// Max of a NaN-free slice (-inf when empty or fully masked). Vectorisable.
fn max_of(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(chunks.remainder()) {
        if x > m {
            m = x;
        }
    }
    m
}

/// First index of the maximum (ties → lowest id); 0 when everything is -inf.
fn argmax(xs: &[f32]) -> u32 {
    let m = max_of(xs);
    for (ci, c) in xs.chunks(SKIP_CHUNK).enumerate() {
        if max_of(c) == m {
            let j = c.iter().position(|&x| x == m).unwrap_or(0);
            return (ci * SKIP_CHUNK + j) as u32;
        }
    }
    0
}

/// A u64 whose ascending order is `x` descending, then `id` ascending (so plain
/// integer sorts and selections need no indirection). `x` must not be NaN.
#[inline]
fn desc_key(x: f32, id: u32) -> u64 {
    let b = (x + 0.0).to_bits(); // -0.0 → +0.0
    let ascending = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!ascending) << 32) | u64::from(id)
}

#[inline]
fn key_id(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

/// `exp(x)` in f32 (Cephes polynomial, ~1 ulp on the range used), branch-free so
/// that loops over it vectorise; `x < -87` (incl. -inf) gives exactly 0.
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23: rounds to an integer in the low bits
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * std::f32::consts::LOG2_E + SHIFTER;
    let k = t - SHIFTER; // round(xc / ln 2), in [-126, 127]
    let r = xc - k * LN2_HI - k * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let ki = t.to_bits().wrapping_sub(SHIFTER.to_bits()); // k as two's complement
    let scale = f32::from_bits(ki.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * scale
    }
}

/// Unnormalised softmax weight of `s` given the row max `m`, robust to infinities:
/// a +inf max shares all mass among the +inf entries, a -inf max (fully masked
/// row) is uniform.
#[inline]
fn weight(s: f32, m: f32) -> f32 {
    if m == f32::INFINITY {
        if s == f32::INFINITY {
            1.0
        } else {
            0.0
        }
    } else if m == f32::NEG_INFINITY {
        1.0
    } else {
        fast_exp(s - m)
    }
}

/// Sum of a block (≤ `BLOCK` values) in f32 lanes. Vectorisable.
#[inline]
fn block_sum(b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = b.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    acc.iter().chain(chunks.remainder()).sum()
}

/// Replaces every `s` by `weight(s, m)`; returns the sum, computed block by block
/// exactly as [`walk_dense`] does.
fn exp_in_place(w: &mut [f32], m: f32) -> f64 {
    if m.is_finite() {
        w.iter_mut().for_each(|x| *x = fast_exp(*x - m));
    } else {
        w.iter_mut().for_each(|x| *x = weight(*x, m));
    }
    w.chunks(BLOCK).map(|b| block_sum(b) as f64).sum()
}

/// The token at cumulative weight `u` (in `[0, exp_in_place's sum)`): skips whole
/// blocks by their sums, then scans one block.
fn walk_dense(w: &[f32], u: f64) -> u32 {
    let mut acc = 0.0f64;
    for (bi, b) in w.chunks(BLOCK).enumerate() {
        let s = block_sum(b) as f64;
        if s > 0.0 && u < acc + s {
            let mut a = acc;
            let mut last = 0;
            for (j, &p) in b.iter().enumerate() {
                if p > 0.0 {
                    a += p as f64;
                    last = j;
                    if u < a {
                        break;
                    }
                }
            }
            return (bi * BLOCK + last) as u32;
        }
        acc += s;
    }
    // Rounding (u == sum): the last token with weight.
    w.iter().rposition(|&p| p > 0.0).unwrap_or(0) as u32
}

/// Log-softmax of a sanitised row: `logprob(x) = x - logsumexp(row)`.
struct LogSoftmax {
    /// None: the row is fully masked (all -inf) and is treated as uniform.
    lse: Option<f64>,
    uniform: f32,
}

impl LogSoftmax {
    fn new(row: &[f32], max: f32) -> Self {
        if max == f32::NEG_INFINITY {
            return LogSoftmax {
                lse: None,
                uniform: -(row.len() as f64).ln() as f32,
            };
        }
        // exp into a stack block first: that map loop vectorises, a fused
        // exp-and-accumulate loop does not.
        let mut buf = [0.0f32; BLOCK];
        let mut sum = 0.0f64;
        for b in row.chunks(BLOCK) {
            let e = &mut buf[..b.len()];
            for (o, &x) in e.iter_mut().zip(b) {
                *o = fast_exp(x - max);
            }
            sum += block_sum(e) as f64;
        }
        LogSoftmax {
            lse: Some(max as f64 + sum.ln()),
            uniform: 0.0,
        }
    }

    #[inline]
    fn logprob(&self, x: f32) -> f32 {
        match self.lse {
            Some(lse) => (x as f64 - lse) as f32,
            None => self.uniform,
        }
    }
}

/// The `k` largest (id, value) of the NaN-free `vals`, best first, ties → lowest
/// id, in one pass (a small sorted buffer; most elements cost one comparison).
fn top_n_into(top: &mut Vec<(u32, f32)>, vals: &[f32], k: usize) {
    top.clear();
    if k == 0 {
        return;
    }
    for (ci, c) in vals.chunks(SKIP_CHUNK).enumerate() {
        // Once full, most chunks hold nothing better than the current k-th: skip
        // them at vectorised speed.
        if top.len() == k && max_of(c) <= top[k - 1].1 {
            continue;
        }
        for (j, &x) in c.iter().enumerate() {
            if top.len() == k {
                if x <= top[k - 1].1 {
                    continue;
                }
                top.pop();
            }
            let pos = top.iter().position(|&(_, v)| v < x).unwrap_or(top.len());
            top.insert(pos, ((ci * SKIP_CHUNK + j) as u32, x));
        }
    }
}

/// Sorts (a prefix of) `keys` (see [`desc_key`]) best first and returns the length
/// of the shortest prefix whose weight sum reaches `target`, and whether it does
/// (if not: all of `keys`). Partial sort: select + sort a chunk at a time, growing
/// 4x, so a small nucleus among many candidates costs O(n) rather than O(n log n).
fn nucleus_len(keys: &mut [u64], w: &[f32], target: f64) -> (usize, bool) {
    let n = keys.len();
    let mut start = 0;
    let mut chunk = NUCLEUS_FIRST_CHUNK;
    let mut cum = 0.0f64;
    while start < n {
        let end = (start + chunk).min(n);
        if end < n {
            keys[start..].select_nth_unstable(end - start - 1);
        }
        keys[start..end].sort_unstable();
        for (j, &k) in keys[start..end].iter().enumerate() {
            cum += w[key_id(k)] as f64;
            if cum >= target {
                return (start + j + 1, true);
            }
        }
        start = end;
        chunk = chunk.saturating_mul(4);
    }
    (n, false)
}

/// Binary exponent bucket of a weight in [0, 1].
#[inline]
fn bucket(p: f32) -> usize {
    (p.to_bits() >> 23) as usize & 0xFF
}

/// Keys of the tokens with weight > 0, ≥ `min_w`, and in bucket ≥ `min_bucket`.
fn min_p_survivors(w: &[f32], min_w: f32, min_bucket: usize) -> impl Iterator<Item = u64> + '_ {
    w.iter()
        .enumerate()
        .filter(move |&(_, &p)| p > 0.0 && p >= min_w && bucket(p) >= min_bucket)
        .map(|(i, &p)| desc_key(p, i as u32))
}

/// Top-p then min-p over a whole row of weights `w` (max weight 1): fills `keys`
/// with the smallest best-first prefix whose mass reaches `target`, intersected
/// with {w ≥ min_w}. O(V) plus a sort of one exponent bucket: a histogram of the
/// mass per binary exponent finds the `edge` bucket where the cumulative mass
/// (from the top) reaches `target`; every token above it is in, and only the
/// edge bucket needs sorting.
fn nucleus_dense(w: &[f32], keys: &mut Vec<u64>, min_w: f32, target: f64) {
    // Two interleaved histograms halve the add-latency chains on busy buckets.
    let mut hist = [[0.0f64; 256]; 2];
    let mut pairs = w.chunks_exact(2);
    for c in &mut pairs {
        hist[0][bucket(c[0])] += c[0] as f64;
        hist[1][bucket(c[1])] += c[1] as f64;
    }
    for &p in pairs.remainder() {
        hist[0][bucket(p)] += p as f64;
    }
    let mut cum = 0.0f64;
    let mut edge = 0;
    for e in (0..256).rev() {
        cum += hist[0][e] + hist[1][e];
        if cum > 0.0 && cum >= target {
            edge = e;
            break;
        }
    }
    // One pass collects the survivors of buckets ≥ edge; then the ones above the
    // edge (all in the nucleus) are moved to the front.
    keys.clear();
    let mut edge_filtered = false;
    for (i, &p) in w.iter().enumerate() {
        if p > 0.0 && bucket(p) >= edge {
            if p >= min_w {
                keys.push(desc_key(p, i as u32));
            } else if bucket(p) == edge {
                edge_filtered = true;
            }
        }
    }
    let mut above = 0;
    let mut mass_above = 0.0f64;
    for j in 0..keys.len() {
        let p = w[key_id(keys[j])];
        if bucket(p) > edge {
            keys.swap(above, j);
            above += 1;
            mass_above += p as f64;
        }
    }
    if mass_above < target {
        let (cut, reached) = nucleus_len(&mut keys[above..], w, target - mass_above);
        // Not reached: either min-p cut into the edge bucket (then it also drops
        // everything below: keep all survivors), or the histogram's rounding put
        // the edge one bucket too high (fall back to the generic path below).
        if reached || edge_filtered {
            keys.truncate((above + cut).max(1));
            return;
        }
        if edge == 0 {
            return; // nothing below bucket 0 with weight > 0
        }
    }
    // Rounding corner cases: redo over all survivors.
    keys.clear();
    keys.extend(min_p_survivors(w, min_w, 0));
    let (cut, _) = nucleus_len(keys, w, target);
    keys.truncate(cut.max(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(7),
            ..Default::default()
        };
        f(&mut p);
        p
    }

    fn random_logits(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    /// Reference log-softmax in f64.
    fn log_softmax(logits: &[f32]) -> Vec<f64> {
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let s: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
        logits.iter().map(|&x| x as f64 - m - s.ln()).collect()
    }

    fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut h = vec![0; logits.len()];
        for _ in 0..draws {
            h[s.sample(logits).id as usize] += 1;
        }
        h
    }

    fn ln_probs(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x.ln() as f32).collect()
    }

    #[test]
    fn greedy_picks_argmax_ties_lowest_id() {
        let mut s = Sampler::new(SamplingParams::greedy(), 5);
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0, 1.9]).id, 1);
        assert_eq!(s.sample(&[f32::NAN, -3.0, 5.0, f32::NAN]).id, 2);
        for seed in 0..20 {
            let l = random_logits(seed, 1000, 10.0);
            let expect = (0..l.len())
                .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
                .unwrap();
            assert_eq!(s.sample(&l).id as usize, expect);
        }
        // Tiny temperatures are greedy too.
        let mut s = Sampler::new(params(|p| p.temperature = 1e-6), 3);
        for _ in 0..50 {
            assert_eq!(s.sample(&[1.0, 1.01, 0.99]).id, 1);
        }
    }

    #[test]
    fn logprobs_hand_computed_on_4_tokens() {
        let logits = [1.0f32, 2.0, 3.0, 4.0];
        // lse = 4 + ln(1 + e^-1 + e^-2 + e^-3) = 4.440189698561196
        let lse = 4.0 + (1.0 + (-1.0f64).exp() + (-2.0f64).exp() + (-3.0f64).exp()).ln();
        assert!((lse - 4.440_189_698_561_196).abs() < 1e-12);
        let mut s = Sampler::new(
            SamplingParams {
                logprobs: Some(4),
                ..SamplingParams::greedy()
            },
            4,
        );
        let t = s.sample(&logits);
        assert_eq!(t.id, 3);
        assert!((t.logprob - (-0.440_189_7)).abs() < 1e-6, "{}", t.logprob);
        let expect = [
            (3, -0.440_189_7f32),
            (2, -1.440_189_7),
            (1, -2.440_189_7),
            (0, -3.440_189_7),
        ];
        assert_eq!(t.top_logprobs.len(), 4);
        for (got, want) in t.top_logprobs.iter().zip(expect) {
            assert_eq!(got.0, want.0);
            assert!((got.1 - want.1).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn logprobs_sum_to_one() {
        for seed in 0..10 {
            let logits = random_logits(seed, 20, 8.0);
            let mut s = Sampler::new(params(|p| p.logprobs = Some(20)), 20);
            let t = s.sample(&logits);
            assert_eq!(t.top_logprobs.len(), 20);
            let total: f64 = t
                .top_logprobs
                .iter()
                .map(|&(_, lp)| (lp as f64).exp())
                .sum();
            assert!((total - 1.0).abs() < 1e-5, "sum = {total}");
            let reference = log_softmax(&logits);
            for &(id, lp) in &t.top_logprobs {
                assert!((lp as f64 - reference[id as usize]).abs() < 1e-5);
            }
            assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-5);
        }
        // Big vocabulary: the sampled token's logprob matches the reference.
        let logits = random_logits(99, 50_000, 12.0);
        let reference = log_softmax(&logits);
        let mut s = Sampler::new(params(|_| {}), 50_000);
        for _ in 0..20 {
            let t = s.sample(&logits);
            assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-4);
            assert!(t.top_logprobs.is_empty());
        }
    }

    #[test]
    fn logprobs_are_of_raw_logits_not_processed_ones() {
        // Temperature, top-k and penalties must not change the reported logprobs.
        let logits = [0.5f32, 1.5, -0.5, 1.0];
        let reference = log_softmax(&logits);
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.3;
                p.top_k = 2;
                p.presence_penalty = 1.0;
                p.frequency_penalty = 0.5;
                p.logprobs = Some(4);
            }),
            4,
        );
        for _ in 0..30 {
            let t = s.sample(&logits);
            assert!((t.logprob as f64 - reference[t.id as usize]).abs() < 1e-6);
            let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
            assert_eq!(ids, vec![1, 3, 0, 2]);
        }
    }

    #[test]
    fn top_logprobs_ordering_and_length() {
        let logits = random_logits(3, 300, 5.0);
        let reference = log_softmax(&logits);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));

        let mut s = Sampler::new(params(|p| p.logprobs = Some(5)), 300);
        let t = s.sample(&logits);
        assert_eq!(t.top_logprobs.len(), 5);
        for (j, &(id, lp)) in t.top_logprobs.iter().enumerate() {
            assert_eq!(id as usize, order[j]);
            assert!((lp as f64 - reference[id as usize]).abs() < 1e-5);
        }
        assert!(t.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));

        // Capped at 20.
        let mut s = Sampler::new(params(|p| p.logprobs = Some(100)), 300);
        let t = s.sample(&logits);
        assert_eq!(t.top_logprobs.len(), 20);
        let ids: Vec<usize> = t.top_logprobs.iter().map(|x| x.0 as usize).collect();
        assert_eq!(ids, order[..20].to_vec());
        // Capped at the vocabulary too.
        let mut s = Sampler::new(params(|p| p.logprobs = Some(10)), 3);
        assert_eq!(s.sample(&[1.0, 2.0, 3.0]).top_logprobs.len(), 3);
        // Some(0) and None: no alternatives, but the sampled logprob is filled.
        for lp in [Some(0), None] {
            let mut s = Sampler::new(
                SamplingParams {
                    logprobs: lp,
                    ..SamplingParams::greedy()
                },
                300,
            );
            let t = s.sample(&logits);
            assert!(t.top_logprobs.is_empty());
            assert_eq!(t.id as usize, order[0]);
            assert!((t.logprob as f64 - reference[order[0]]).abs() < 1e-5);
        }
        // Ties: lower id first.
        let mut s = Sampler::new(params(|p| p.logprobs = Some(3)), 5);
        let t = s.sample(&[1.0, 3.0, 2.0, 3.0, 2.0]);
        let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
    }

    #[test]
    fn top_k_1_equals_greedy_at_any_temperature() {
        for (seed, temperature) in [(1, 0.1f32), (2, 0.7), (3, 1.0), (4, 5.0), (5, 1000.0)] {
            let mut greedy = Sampler::new(SamplingParams::greedy(), 500);
            let mut topk = Sampler::new(
                params(|p| {
                    p.temperature = temperature;
                    p.top_k = 1;
                    p.seed = Some(seed);
                }),
                500,
            );
            for step in 0..50 {
                let l = random_logits(seed * 1000 + step, 500, 3.0);
                assert_eq!(topk.sample(&l).id, greedy.sample(&l).id);
            }
        }
    }

    #[test]
    fn top_k_keeps_only_the_k_best_renormalised() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let logits = ln_probs(&probs);
        let mut s = Sampler::new(params(|p| p.top_k = 2), 4);
        let h = histogram(&mut s, &logits, 20_000);
        assert_eq!(h[0] + h[1], 0, "{h:?}");
        let f3 = h[3] as f64 / 20_000.0;
        assert!((f3 - 4.0 / 7.0).abs() < 0.02, "{h:?}");
        // Huge / exact-vocab top-k is a no-op (no panic).
        for k in [4, 5, usize::MAX] {
            let mut s = Sampler::new(params(|p| p.top_k = k), 4);
            let h = histogram(&mut s, &logits, 2_000);
            assert!(h.iter().all(|&c| c > 0), "{h:?}");
        }
    }

    #[test]
    fn top_p_tiny_keeps_only_the_best() {
        let logits = random_logits(11, 1000, 2.0);
        let best = argmax(&logits);
        for top_p in [1e-6f32, 0.0, -1.0] {
            let mut s = Sampler::new(
                params(|p| {
                    p.top_p = top_p;
                    p.temperature = 2.0;
                }),
                1000,
            );
            for _ in 0..200 {
                assert_eq!(s.sample(&logits).id, best);
            }
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        // Cumulative: 0.4, 0.7, 0.9, 1.0 → top_p 0.65 keeps {0, 1}.
        let logits = ln_probs(&[0.4, 0.3, 0.2, 0.1]);
        let mut s = Sampler::new(params(|p| p.top_p = 0.65), 4);
        let h = histogram(&mut s, &logits, 20_000);
        assert_eq!(h[2] + h[3], 0, "{h:?}");
        assert!((h[0] as f64 / 20_000.0 - 4.0 / 7.0).abs() < 0.02, "{h:?}");
        // With top-k=3 first: renormalised {0.4,0.3,0.2}/0.9 → cum 0.444, 0.778:
        // top_p 0.75 keeps {0, 1}; without top-k, 0.75 would keep {0, 1, 2}.
        let mut s = Sampler::new(
            params(|p| {
                p.top_p = 0.75;
                p.top_k = 3;
            }),
            4,
        );
        let h = histogram(&mut s, &logits, 5_000);
        assert_eq!(h[2] + h[3], 0, "{h:?}");
        let mut s = Sampler::new(params(|p| p.top_p = 0.75), 4);
        let h = histogram(&mut s, &logits, 5_000);
        assert!(h[2] > 0 && h[3] == 0, "{h:?}");
    }

    /// Reference order: value descending, ties → lowest id.
    fn sorted_desc(v: &[f32]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..v.len() as u32).collect();
        order.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
        order
    }

    #[test]
    fn nucleus_partial_sort_matches_full_sort() {
        for (seed, n) in [(1u64, 10usize), (2, 1000), (3, 20_000), (4, 100_000)] {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut w: Vec<f32> = (0..n).map(|_| rng.random::<f32>().powi(8)).collect();
            w[n / 2] = w[n / 3]; // a tie
            let z: f64 = w.iter().map(|&x| x as f64).sum();
            let full = sorted_desc(&w);
            for top_p in [0.0, 0.01, 0.3, 0.9, 0.999, 2.0] {
                let target = top_p * z;
                let mut keys: Vec<u64> =
                    (0..n as u32).map(|i| desc_key(w[i as usize], i)).collect();
                let (cut, _) = nucleus_len(&mut keys, &w, target);
                let mut cum = 0.0;
                let mut want = n;
                for (j, &i) in full.iter().enumerate() {
                    cum += w[i as usize] as f64;
                    if cum >= target {
                        want = j + 1;
                        break;
                    }
                }
                assert_eq!(cut, want, "n={n} top_p={top_p}");
                let got: Vec<u32> = keys[..cut].iter().map(|&k| key_id(k) as u32).collect();
                assert_eq!(got, full[..cut]);
            }
        }
    }

    #[test]
    fn nucleus_dense_matches_reference() {
        use std::collections::BTreeSet;
        for (seed, n, power) in [
            (1u64, 10usize, 1i32),
            (2, 1000, 8),
            (3, 50_000, 30),
            (4, 50_000, 1),
            (5, 5, 0),
            (6, 20_000, 200),
        ] {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut w: Vec<f32> = (0..n).map(|_| rng.random::<f32>().powi(power)).collect();
            let best = rng.random_range(1..n);
            w[best] = 1.0;
            w[0] = 0.0;
            let z: f64 = w.iter().map(|&x| x as f64).sum();
            let order = sorted_desc(&w);
            for top_p in [0.0, 1e-6, 0.2, 0.5, 0.9, 0.99, 0.999_999] {
                for min_p in [0.0f32, 1e-3, 0.3] {
                    let target = top_p * z;
                    let mut cum = 0.0;
                    let mut cut = n;
                    for (j, &i) in order.iter().enumerate() {
                        cum += w[i as usize] as f64;
                        if cum >= target {
                            cut = j + 1;
                            break;
                        }
                    }
                    let want: BTreeSet<u32> = order[..cut]
                        .iter()
                        .copied()
                        .filter(|&i| w[i as usize] > 0.0 && w[i as usize] >= min_p)
                        .collect();
                    let mut keys = Vec::new();
                    nucleus_dense(&w, &mut keys, min_p, target);
                    let got: BTreeSet<u32> = keys.iter().map(|&k| key_id(k) as u32).collect();
                    assert_eq!(got.len(), keys.len());
                    assert_eq!(got, want, "seed={seed} top_p={top_p} min_p={min_p}");
                }
            }
        }
    }

    #[test]
    fn desc_key_orders_by_value_then_id() {
        let v = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            f32::INFINITY,
            1e-40,
            -1e-40,
            1.0,
            3.5,
        ];
        let mut keys: Vec<u64> = (0..v.len() as u32)
            .map(|i| desc_key(v[i as usize], i))
            .collect();
        keys.sort_unstable();
        let got: Vec<u32> = keys.iter().map(|&k| key_id(k) as u32).collect();
        // -0.0 counts as +0.0 (tie → lower id).
        assert_eq!(got, vec![7, 5, 11, 2, 10, 8, 0, 1, 9, 3, 6, 4]);
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let rel = ((fast_exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert!(fast_exp(f32::INFINITY).is_finite());
    }

    #[test]
    fn top_k_streaming_and_selection_paths_agree() {
        // k ≤ STREAMING_TOP_K streams, larger k selects: both give the k best
        // (ties → lower id), so seeded draws match a reference built from them.
        let mut logits = random_logits(21, 5_000, 4.0);
        logits[100] = logits[200]; // a tie
        let order = sorted_desc(&logits);
        for k in [1, 2, STREAMING_TOP_K, STREAMING_TOP_K + 1, 1_000, 4_999] {
            let allowed: std::collections::HashSet<u32> = order[..k].iter().copied().collect();
            let mut s = Sampler::new(
                params(|p| {
                    p.top_k = k;
                    p.temperature = 3.0;
                }),
                5_000,
            );
            let mut seen = std::collections::HashSet::new();
            for _ in 0..3_000 {
                let id = s.sample(&logits).id;
                assert!(allowed.contains(&id), "k={k} id={id}");
                seen.insert(id);
            }
            if k <= 100 {
                assert_eq!(seen.len(), k, "k={k}: all of the k best get drawn");
            }
        }
    }

    #[test]
    fn min_p_filters_relative_to_the_max() {
        // p ≥ 0.35 × 0.5 = 0.175 keeps {0, 1}.
        let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
        let mut s = Sampler::new(params(|p| p.min_p = 0.35), 4);
        let h = histogram(&mut s, &logits, 20_000);
        assert_eq!(h[2] + h[3], 0, "{h:?}");
        assert!((h[0] as f64 / 20_000.0 - 0.625).abs() < 0.02, "{h:?}");
        // min_p 0.25 keeps {0, 1, 2} (0.15 ≥ 0.125).
        let mut s = Sampler::new(params(|p| p.min_p = 0.25), 4);
        let h = histogram(&mut s, &logits, 20_000);
        assert!(h[2] > 0 && h[3] == 0, "{h:?}");
        // Combined with top-k (min-p applies to the survivors of top-k).
        let mut s = Sampler::new(
            params(|p| {
                p.min_p = 0.25;
                p.top_k = 2;
            }),
            4,
        );
        let h = histogram(&mut s, &logits, 5_000);
        assert!(h[0] > 0 && h[1] > 0 && h[2] + h[3] == 0, "{h:?}");
        // min_p ≥ 1 keeps only the max.
        let mut s = Sampler::new(params(|p| p.min_p = 5.0), 4);
        let h = histogram(&mut s, &logits, 1_000);
        assert_eq!(h[0], 1_000);
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let run = |seed: u64| {
            let mut s = Sampler::new(
                params(|p| {
                    p.seed = Some(seed);
                    p.temperature = 1.3;
                    p.top_p = 0.95;
                }),
                64,
            );
            (0..100)
                .map(|step| s.sample(&random_logits(step, 64, 2.0)).id)
                .collect::<Vec<u32>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // Unseeded samplers work (and are almost surely different).
        let mut a = Sampler::new(SamplingParams::default(), 64);
        let mut b = Sampler::new(SamplingParams::default(), 64);
        let l = vec![0.0f32; 64];
        let sa: Vec<u32> = (0..100).map(|_| a.sample(&l).id).collect();
        let sb: Vec<u32> = (0..100).map(|_| b.sample(&l).id).collect();
        assert_ne!(sa, sb);
    }

    #[test]
    fn empirical_distribution_matches_softmax() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let logits: Vec<f32> = ln_probs(&probs).iter().map(|x| x + 3.0).collect();
        let mut s = Sampler::new(params(|_| {}), 4);
        let draws = 20_000;
        let h = histogram(&mut s, &logits, draws);
        for (c, p) in h.iter().zip(probs) {
            // σ ≤ sqrt(0.25 / 20000) ≈ 0.0035; allow ~4σ.
            let f = *c as f64 / draws as f64;
            assert!((f - p).abs() < 0.015, "{h:?}");
        }
        // Temperature 2 flattens: p ∝ sqrt(probs).
        let mut s = Sampler::new(params(|p| p.temperature = 2.0), 4);
        let h = histogram(&mut s, &logits, draws);
        let r: Vec<f64> = probs.iter().map(|p: &f64| p.sqrt()).collect();
        let rz: f64 = r.iter().sum();
        for (c, p) in h.iter().zip(r) {
            assert!((*c as f64 / draws as f64 - p / rz).abs() < 0.015, "{h:?}");
        }
    }

    #[test]
    fn presence_and_frequency_penalties_change_the_argmax() {
        let logits = [2.0f32, 1.5, 1.0, 0.0];
        // Frequency 0.4, greedy: [2,1.5,1,0] → 0; [1.6,1.5,..] → 0; [1.2,1.5] → 1;
        // [1.2,1.1,1.0] → 0; [0.8,1.1,1.0] → 1; [0.8,0.7,1.0] → 2.
        let mut s = Sampler::new(
            SamplingParams {
                frequency_penalty: 0.4,
                ..SamplingParams::greedy()
            },
            4,
        );
        let ids: Vec<u32> = (0..6).map(|_| s.sample(&logits).id).collect();
        assert_eq!(ids, vec![0, 0, 1, 0, 1, 2]);
        assert_eq!(
            (s.count(0), s.count(1), s.count(2), s.count(3)),
            (3, 2, 1, 0)
        );

        // Presence 0.8 does not grow with the count: [2,1.5,..] → 0; [1.2,1.5] → 1;
        // then [1.2,0.7,1.0,0] → 0 for good (frequency 0.8 would move on to 2).
        let mut s = Sampler::new(
            SamplingParams {
                presence_penalty: 0.8,
                logprobs: Some(1),
                ..SamplingParams::greedy()
            },
            4,
        );
        let ids: Vec<u32> = (0..5).map(|_| s.sample(&logits).id).collect();
        assert_eq!(ids, vec![0, 1, 0, 0, 0]);
        // Reported logprobs stay those of the raw logits.
        let t = s.sample(&logits);
        assert_eq!(t.top_logprobs[0].0, 0);
        assert!((t.logprob as f64 - log_softmax(&logits)[0]).abs() < 1e-6);

        // Replayed tokens (observe) count like sampled ones; negative penalties boost.
        let mut s = Sampler::new(
            SamplingParams {
                presence_penalty: 0.6,
                ..SamplingParams::greedy()
            },
            4,
        );
        s.observe(0);
        assert_eq!(s.sample(&logits).id, 1); // 1.4 < 1.5
        let mut s = Sampler::new(
            SamplingParams {
                frequency_penalty: -0.6,
                ..SamplingParams::greedy()
            },
            4,
        );
        s.observe(2);
        // Token 2: 1.0 + 0.6 = 1.6 < 2.0.
        assert_eq!(s.sample(&logits).id, 0);
        s.observe(2);
        s.observe(2);
        // Token 2: 1.0 + 3 × 0.6 = 2.8 > token 0: 2.0 + 0.6 = 2.6.
        assert_eq!(s.sample(&logits).id, 2);
        // Out-of-range observed ids are harmless.
        s.observe(u32::MAX);
        assert!(s.sample(&logits).id < 4);
    }

    #[test]
    fn sampler_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Sampler>();
    }

    #[test]
    fn sample_observes_exactly_once() {
        let mut s = Sampler::new(params(|_| {}), 8);
        let l = random_logits(5, 8, 1.0);
        let mut total = 0;
        for _ in 0..100 {
            s.sample(&l);
            total += 1;
            let sum: u32 = (0..8).map(|i| s.count(i)).sum();
            assert_eq!(sum, total);
        }
    }

    #[test]
    fn never_panics_on_degenerate_input() {
        let rows: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN; 7],
            vec![f32::NEG_INFINITY; 7],
            vec![f32::NAN, f32::INFINITY, 1.0, f32::INFINITY],
            vec![f32::MAX, -f32::MAX, f32::MAX, 0.0],
            vec![1e30, -1e30, f32::NAN, f32::NEG_INFINITY],
            vec![3.0],
        ];
        let knobs: Vec<SamplingParams> = vec![
            SamplingParams::greedy(),
            params(|_| {}),
            params(|p| p.temperature = f32::NAN),
            params(|p| p.temperature = f32::INFINITY),
            params(|p| p.temperature = -1.0),
            params(|p| p.temperature = 1e-5),
            params(|p| {
                p.top_k = usize::MAX;
                p.top_p = f32::NAN;
                p.min_p = f32::NAN;
            }),
            params(|p| {
                p.top_k = 2;
                p.top_p = 0.5;
                p.min_p = 0.5;
                p.logprobs = Some(usize::MAX);
            }),
            params(|p| {
                p.presence_penalty = f32::NAN;
                p.frequency_penalty = f32::INFINITY;
                p.top_p = 0.9;
            }),
            params(|p| {
                p.frequency_penalty = 1e38;
                p.presence_penalty = -1e38;
                p.min_p = 0.1;
            }),
        ];
        for kp in &knobs {
            for row in &rows {
                let mut s = Sampler::new(kp.clone(), row.len());
                for _ in 0..20 {
                    let t = s.sample(row);
                    assert!(row.is_empty() || (t.id as usize) < row.len());
                    assert!(!t.logprob.is_nan(), "{kp:?} {row:?} {t:?}");
                    assert!(t.top_logprobs.iter().all(|x| !x.1.is_nan()));
                }
            }
        }
        // A NaN is never picked while a real logit exists.
        let mut s = Sampler::new(params(|p| p.temperature = 100.0), 3);
        for _ in 0..200 {
            assert_eq!(s.sample(&[f32::NAN, 0.0, f32::NAN]).id, 1);
        }
        // +inf logits share the mass; everything else gets none.
        let mut s = Sampler::new(params(|_| {}), 4);
        let h = histogram(&mut s, &[0.0, f32::INFINITY, 5.0, f32::INFINITY], 2_000);
        assert!(h[0] + h[2] == 0 && h[1] > 0 && h[3] > 0, "{h:?}");
        // A fully masked row is uniform, logprob -ln(n).
        let mut s = Sampler::new(params(|_| {}), 4);
        let t = s.sample(&[f32::NEG_INFINITY; 4]);
        assert!((t.logprob - -(4.0f32).ln()).abs() < 1e-6);
    }
}
