//! `FusedLinear`: linear layers that read the same input (q/k/v; gate/up), stacked
//! at load into one matrix when their weight types agree, so that one pass quantizes
//! the input once and multiplies every part in one parallel section.

use super::{sized, Loader};
use crate::error::Result;
use crate::kernels::pool::{parallel_rows, ROWS_PER_TASK};
use crate::linear::{first_switch, Linear, Tokens};
use crate::weights::WeightData;

pub(super) struct FusedLinear {
    /// Output width of each part, in order.
    widths: Vec<usize>,
    kind: Kind,
}

enum Kind {
    /// The parts' rows stacked: `[sum widths, k]`.
    Stacked(Box<Linear>),
    /// Types differ (e.g. a Q6_K `attn_v` among Q4_K): one matrix per part.
    Separate(Vec<Linear>),
}

impl FusedLinear {
    /// Loads `{name}.weight` (and `{name}.bias` with `bias`) of each `(name, width)`,
    /// all `[width, k]`.
    pub(super) fn load(
        ld: &mut Loader,
        parts: &[(String, usize)],
        k: usize,
        bias: bool,
    ) -> Result<Self> {
        let mut weights = Vec::with_capacity(parts.len());
        let mut biases = Vec::with_capacity(parts.len());
        for (name, n) in parts {
            weights.push(ld.tensor(&format!("{name}.weight"), &[*n, k])?);
            if bias {
                biases.push(ld.vector(&format!("{name}.bias"), *n)?);
            }
        }
        let widths: Vec<usize> = parts.iter().map(|p| p.1).collect();
        Ok(Self::from_weights(ld, weights, widths, k, biases))
    }

    /// Parts the file already holds stacked in one matrix `{name}.weight`
    /// (`[sum widths, k]`: phi3's `attn_qkv`, its `ffn_up` with the gate's rows first),
    /// with `bias` (`sum widths` values) added.
    pub(super) fn stacked(
        ld: &mut Loader,
        name: &str,
        widths: Vec<usize>,
        k: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        let l = ld.matrix(&format!("{name}.weight"), widths.iter().sum(), k, bias)?;
        Ok(FusedLinear {
            widths,
            kind: Kind::Stacked(Box::new(l)),
        })
    }

    /// The parts from their loaded weights (each `[widths[i], k]`) and biases (none,
    /// or one per part).
    pub(super) fn from_weights(
        ld: &mut Loader,
        weights: Vec<WeightData>,
        widths: Vec<usize>,
        k: usize,
        biases: Vec<Vec<f32>>,
    ) -> Self {
        let bias = !biases.is_empty();
        let refs: Vec<&WeightData> = weights.iter().collect();
        let kind = match WeightData::concat_rows(&refs) {
            Some(w) => {
                let b = bias.then(|| biases.concat());
                Kind::Stacked(Box::new(ld.new_linear(w, widths.iter().sum(), k, b)))
            }
            None => {
                let mut biases = biases.into_iter();
                let linears = weights
                    .into_iter()
                    .zip(&widths)
                    .map(|(w, &n)| ld.new_linear(w, n, k, biases.next()))
                    .collect();
                Kind::Separate(linears)
            }
        };
        FusedLinear { widths, kind }
    }

    /// Where the parts' batches leave the quantized path (`Linear::small_batch_max_rows`).
    pub(super) fn small_batch_max_rows(&self) -> Option<usize> {
        match &self.kind {
            Kind::Stacked(l) => l.small_batch_max_rows(),
            Kind::Separate(ls) => ls
                .iter()
                .map(Linear::small_batch_max_rows)
                .fold(None, first_switch),
        }
    }

    /// The parts stacked in one matrix, if they are.
    pub(super) fn joined(&self) -> Option<&Linear> {
        match &self.kind {
            Kind::Stacked(l) => Some(l),
            Kind::Separate(_) => None,
        }
    }

    /// Output width of part `i`.
    pub(super) fn width(&self, i: usize) -> usize {
        self.widths[i]
    }

    /// With the parts stacked: their product `[t.n, sum widths]` (each row's parts
    /// side by side, in order) in `tmp`, with no split; else `None`, and nothing is
    /// computed (`forward` then writes the parts apart).
    pub(super) fn forward_joined<'a>(
        &self,
        x: &[f32],
        t: Tokens,
        tmp: &'a mut Vec<f32>,
    ) -> Option<&'a [f32]> {
        let Kind::Stacked(l) = &self.kind else {
            return None;
        };
        let all = sized(tmp, t.n * l.n_out);
        l.forward(x, t, all);
        Some(all)
    }

    /// `x` is `[t.n, k]`; writes part `i`'s `[t.n, width(i)]` into `outs[i]`. `tmp`
    /// holds the stacked product before it is split.
    pub(super) fn forward(
        &self,
        x: &[f32],
        t: Tokens,
        tmp: &mut Vec<f32>,
        outs: &mut [&mut [f32]],
    ) {
        match &self.kind {
            Kind::Separate(linears) => {
                for (l, out) in linears.iter().zip(outs.iter_mut()) {
                    l.forward(x, t, out);
                }
            }
            Kind::Stacked(l) => {
                let n = l.n_out;
                let all = sized(tmp, t.n * n);
                l.forward(x, t, all);
                let all: &[f32] = all;
                let mut off = 0;
                for (out, &w) in outs.iter_mut().zip(&self.widths) {
                    parallel_rows(&mut out[..t.n * w], w, ROWS_PER_TASK, &|r0, out| {
                        for (r, o) in out.chunks_exact_mut(w).enumerate() {
                            o.copy_from_slice(&all[(r0 + r) * n + off..][..w]);
                        }
                    });
                    off += w;
                }
            }
        }
    }
}
