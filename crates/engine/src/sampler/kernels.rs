//! The sampler's vectorised building blocks over one logits row: sanitising,
//! max/argmax, a polynomial exp, log-softmax, block sums, top-N selection, nucleus
//! (top-p) cuts. The ones that read a logits row sanitise as they read, so the raw
//! row needs no sanitised copy.

use super::*;

/// NaN → -inf, +inf → f32::MAX: the row then holds no NaN and no +inf.
#[inline]
pub(super) fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

/// Max of a slice, NaN ignored (-inf when empty or fully masked); `sanitize` of it
/// is the max of the sanitised slice. Vectorisable.
pub(super) fn max_of(xs: &[f32]) -> f32 {
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

/// First index of the sanitised maximum (ties → lowest id); 0 when everything is
/// -inf or NaN.
pub(super) fn argmax(xs: &[f32]) -> u32 {
    let m = sanitize(max_of(xs));
    for (ci, c) in xs.chunks(SKIP_CHUNK).enumerate() {
        if sanitize(max_of(c)) == m {
            let j = c.iter().position(|&x| sanitize(x) == m).unwrap_or(0);
            return (ci * SKIP_CHUNK + j) as u32;
        }
    }
    0
}

/// A u64 whose ascending order is `x` descending, then `id` ascending (so plain
/// integer sorts and selections need no indirection). `x` must not be NaN.
#[inline]
pub(super) fn desc_key(x: f32, id: u32) -> u64 {
    let b = (x + 0.0).to_bits(); // -0.0 → +0.0
    let ascending = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!ascending) << 32) | u64::from(id)
}

#[inline]
pub(super) fn key_id(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

/// `exp(x)` in f32 (Cephes polynomial, ~1 ulp on the range used), branch-free so
/// that loops over it vectorise; `x < -87` (incl. -inf) gives exactly 0.
#[inline(always)]
pub(super) fn fast_exp(x: f32) -> f32 {
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
pub(super) fn weight(s: f32, m: f32) -> f32 {
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
pub(super) fn block_sum(b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = b.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    acc.iter().chain(chunks.remainder()).sum()
}

/// Log-softmax of a row, read through [`sanitize`]: `logprob(x) = x - logsumexp(row)`.
pub(super) struct LogSoftmax {
    /// None: the row is fully masked (all -inf) and is treated as uniform.
    pub(super) lse: Option<f64>,
    pub(super) uniform: f32,
}

impl LogSoftmax {
    pub(super) fn new(row: &[f32], max: f32) -> Self {
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
                *o = fast_exp(sanitize(x) - max);
            }
            sum += block_sum(e) as f64;
        }
        LogSoftmax {
            lse: Some(max as f64 + sum.ln()),
            uniform: 0.0,
        }
    }

    #[inline]
    pub(super) fn logprob(&self, x: f32) -> f32 {
        match self.lse {
            Some(lse) => (x as f64 - lse) as f32,
            None => self.uniform,
        }
    }
}

/// The `k` largest (id, value) of `sanitize(x) * scale` over `vals` (`scale` > 0),
/// best first, ties → lowest id, in one pass (a small sorted buffer; most elements
/// cost one comparison).
pub(super) fn top_n_into(top: &mut Vec<(u32, f32)>, vals: &[f32], k: usize, scale: f32) {
    top.clear();
    if k == 0 {
        return;
    }
    for (ci, c) in vals.chunks(SKIP_CHUNK).enumerate() {
        // Once full, most chunks hold nothing better than the current k-th: skip
        // them at vectorised speed.
        if top.len() == k && sanitize(max_of(c)) * scale <= top[k - 1].1 {
            continue;
        }
        for (j, &x) in c.iter().enumerate() {
            let x = sanitize(x) * scale;
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
pub(super) fn nucleus_len(keys: &mut [u64], w: &[f32], target: f64) -> (usize, bool) {
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
pub(super) fn bucket(p: f32) -> usize {
    (p.to_bits() >> 23) as usize & 0xFF
}

/// Keys of the tokens with weight > 0, ≥ `min_w`, and in bucket ≥ `min_bucket`.
pub(super) fn min_p_survivors(
    w: &[f32],
    min_w: f32,
    min_bucket: usize,
) -> impl Iterator<Item = u64> + '_ {
    w.iter()
        .enumerate()
        .filter(move |&(_, &p)| p > 0.0 && p >= min_w && bucket(p) >= min_bucket)
        .map(|(i, &p)| desc_key(p, i as u32))
}

/// The mass of `w` per binary exponent ([`bucket`]), in two histograms: even and
/// odd positions (interleaved, they halve the add-latency chains on busy buckets).
/// With `ids`, `w` holds the candidates' weights only and each goes by its token's
/// position in the full row, giving the full row's sums bit for bit.
pub(super) fn mass_histograms(w: &[f32], ids: Option<&[u32]>) -> [[f64; 256]; 2] {
    let mut hist = [[0.0f64; 256]; 2];
    if let Some(ids) = ids {
        for (&p, &id) in w.iter().zip(ids) {
            hist[(id & 1) as usize][bucket(p)] += p as f64;
        }
    } else {
        let mut pairs = w.chunks_exact(2);
        for c in &mut pairs {
            hist[0][bucket(c[0])] += c[0] as f64;
            hist[1][bucket(c[1])] += c[1] as f64;
        }
        for &p in pairs.remainder() {
            hist[0][bucket(p)] += p as f64;
        }
    }
    hist
}

/// Top-p then min-p over a whole row of weights `w` (max weight 1): fills `keys`
/// with the smallest best-first prefix whose mass reaches `target`, intersected
/// with {w ≥ min_w}. O(V) plus a sort of one exponent bucket: a histogram of the
/// mass per binary exponent finds the `edge` bucket where the cumulative mass
/// (from the top) reaches `target`; every token above it is in, and only the
/// edge bucket needs sorting.
///
/// With `ids` (the candidates' token ids, `w` then holding only theirs), the
/// histograms are the full row's (see [`mass_histograms`]).
pub(super) fn nucleus_dense(
    w: &[f32],
    keys: &mut Vec<u64>,
    min_w: f32,
    target: f64,
    ids: Option<&[u32]>,
) {
    let hist = mass_histograms(w, ids);
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
