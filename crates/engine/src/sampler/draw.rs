//! The random draw of one token (temperature, top-k, top-p, min-p) from a raw or
//! penalised logits row, read in place: the dense draw reads the row twice and
//! writes nothing row-sized, top-k touches only its candidates' weights.

use super::*;

/// The draw's scratch buffers (disjoint parts of the per-thread scratch).
pub(super) struct Bufs<'a> {
    pub(super) work: &'a mut Vec<f32>,
    pub(super) keys: &'a mut Vec<u64>,
    pub(super) top: &'a mut Vec<(u32, f32)>,
    pub(super) sums: &'a mut Vec<f32>,
}

impl Sampler {
    /// Temperature, top-k, top-p, min-p and the random draw over `row` (non-empty,
    /// read through [`sanitize`]), whose sanitised maximum is `max`; returns an
    /// index into `row`.
    ///
    /// With `cands`, `row` is `cands.vals`, the allowed tokens of a longer row (the
    /// others `-inf`): the draw is the one that longer masked row would give (see
    /// [`super::candidates`]), as the candidate index. Top-k above
    /// `STREAMING_TOP_K` is not for candidates (its selection's order is the full
    /// row's).
    ///
    /// Every value is `sanitize(x) * inv_temperature`, the bits the scaled copy of
    /// the row used to hold, and the max of those is `max * inv_temperature`
    /// (rounding is monotonic), so the weights, sums and draws are unchanged.
    pub(super) fn draw(
        &mut self,
        row: &[f32],
        max: f32,
        b: Bufs<'_>,
        cands: Option<&Candidates>,
    ) -> u32 {
        let Bufs {
            work: w,
            keys,
            top,
            sums,
        } = b;
        // The full row's length decides whether top-k applies, as it did.
        let n = cands.map_or(row.len(), |c| c.n);
        let inv_t = self.inv_temperature;
        let m = max * inv_t;
        let use_top_k = self.top_k > 0 && self.top_k < n;
        let use_top_p = self.top_p < 1.0;
        let use_min_p = self.min_p > 0.0;

        if !(use_top_k || use_top_p || use_min_p) {
            // Plain softmax over the whole row: block sums, then one block's walk.
            if let Some(c) = cands {
                let z = c.dense_block_sums(inv_t, m, sums);
                let u = self.rng.random::<f64>() * z;
                return c.walk_block_sums(inv_t, m, sums, u) as u32;
            }
            let z = dense_block_sums(row, inv_t, m, sums);
            let u = self.rng.random::<f64>() * z;
            return walk_block_sums(row, inv_t, m, sums, u);
        }

        // Candidate keys, with weights exp(s - max) written into `w` at their ids.
        // The max token always survives, with weight exactly 1.
        keys.clear();
        let min_w = self.min_p;
        if use_top_k {
            // Only the candidates' slots are written and read.
            w.resize(row.len(), 0.0);
            if self.top_k <= STREAMING_TOP_K {
                top_n_into(top, row, self.top_k, inv_t);
                keys.extend(top.iter().map(|&(id, x)| desc_key(x, id)));
            } else {
                keys.extend(
                    row.iter()
                        .enumerate()
                        .map(|(i, &x)| desc_key(sanitize(x) * inv_t, i as u32)),
                );
                if self.top_k < keys.len() {
                    keys.select_nth_unstable(self.top_k - 1);
                    keys.truncate(self.top_k);
                }
            }
            let mut z = 0.0f64;
            for &k in keys.iter() {
                let i = key_id(k);
                let p = weight(sanitize(row[i]) * inv_t, m);
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
            let z = exp_row(row, inv_t, m, w, cands);
            if use_top_p {
                let ids = cands.map(|c| &c.ids[..]);
                nucleus_dense(w, keys, min_w, self.top_p as f64 * z, ids);
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
        // Rounding (u == total): the last candidate (all have weight > 0). The max
        // token always survives, so `keys` is never empty: the best token if it were.
        match keys.last() {
            Some(&k) => key_id(k) as u32,
            None => argmax(row),
        }
    }
}

/// `weight(sanitize(x) * inv_t, m)` for each `x` of `src`, `m` the max of those.
#[inline(always)]
pub(super) fn weights_into(out: &mut [f32], src: &[f32], inv_t: f32, m: f32) {
    if m.is_finite() {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = fast_exp(sanitize(x) * inv_t - m);
        }
    } else {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = weight(sanitize(x) * inv_t, m);
        }
    }
}

/// Writes the weights of the whole `row` into `w` (see [`weights_into`]); returns
/// their sum, block by block (the full row's blocks with `cands`).
pub(super) fn exp_row(
    row: &[f32],
    inv_t: f32,
    m: f32,
    w: &mut Vec<f32>,
    cands: Option<&Candidates>,
) -> f64 {
    w.resize(row.len(), 0.0);
    weights_into(w, row, inv_t, m);
    match cands {
        Some(c) => c.weight_sums(w),
        None => w.chunks(BLOCK).map(|b| block_sum(b) as f64).sum(),
    }
}

/// The weights' sum of each `BLOCK` of `row` into `sums` (nothing row-sized is
/// written: each block's weights live in a stack buffer); returns the total.
pub(super) fn dense_block_sums(row: &[f32], inv_t: f32, m: f32, sums: &mut Vec<f32>) -> f64 {
    let mut buf = [0.0f32; BLOCK];
    sums.clear();
    for b in row.chunks(BLOCK) {
        let e = &mut buf[..b.len()];
        weights_into(e, b, inv_t, m);
        sums.push(block_sum(e));
    }
    sums.iter().map(|&s| s as f64).sum()
}

/// The token at cumulative weight `u` (in `[0, total)`, the blocks' weight sums
/// being `sums`): skips whole blocks by their sums, then recomputes and scans one.
fn walk_block_sums(row: &[f32], inv_t: f32, m: f32, sums: &[f32], u: f64) -> u32 {
    let mut buf = [0.0f32; BLOCK];
    let mut acc = 0.0f64;
    for (bi, (b, &s)) in row.chunks(BLOCK).zip(sums).enumerate() {
        let s = s as f64;
        if s > 0.0 && u < acc + s {
            let e = &mut buf[..b.len()];
            weights_into(e, b, inv_t, m);
            let mut a = acc;
            let mut last = 0;
            for (j, &p) in e.iter().enumerate() {
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
    // Rounding (u == total): the last token with weight, in the last block with
    // any (a sum of non-negative weights is 0 only when all are).
    let Some(bi) = sums.iter().rposition(|&s| s > 0.0) else {
        return 0;
    };
    let b = &row[bi * BLOCK..((bi + 1) * BLOCK).min(row.len())];
    let e = &mut buf[..b.len()];
    weights_into(e, b, inv_t, m);
    (bi * BLOCK + e.iter().rposition(|&p| p > 0.0).unwrap_or(0)) as u32
}
