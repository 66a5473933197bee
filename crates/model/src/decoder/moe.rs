//! `Moe`: a mixture-of-experts feed-forward, as llama.cpp's `build_moe_ffn` computes
//! it: the router scores every expert for each token (softmax or sigmoid), the top-k
//! are chosen and their weights renormalised where the family says; each chosen
//! expert runs once over the rows routed to it, so a step reads only the experts its
//! tokens chose; a token's output is its experts' outputs weighted and summed in the
//! order of its choices, whatever else is in the batch. Qwen2-MoE adds a shared
//! expert scaled by `sigmoid(gate · x)`; gpt-oss biases the router and every expert
//! matrix and weighs the chosen experts by a softmax over their logits alone.

use super::mlp::{Mlp, MlpScratch};
use super::moe_panels::{PanelExperts, PanelScratch};
use super::{sized, Loader};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::Result;
use crate::family::Gating;
use crate::linear::{first_switch, Linear, Tokens};

pub(super) struct Moe {
    /// `ffn_gate_inp`: `[experts, hidden]`.
    router: Linear,
    experts: Vec<Mlp>,
    /// The experts' products as two jobs a step, where they are all 8-bit panels.
    panels: Option<PanelExperts>,
    /// The shared expert and its gate vector (`ffn_gate_inp_shexp`, `[hidden]`).
    shared: Option<(Mlp, Vec<f32>)>,
    cfg: MoeConfig,
    hidden: usize,
}

/// The mixture's buffers, grown to the largest batch seen.
#[derive(Default)]
pub(super) struct MoeScratch {
    /// `[t, experts]` router scores, then probabilities.
    probs: Vec<f32>,
    /// `[t, used]`: each token's chosen experts and their weights, in choice order.
    chosen: Vec<(u32, f32)>,
    /// Each expert's first slot in `order`; `[experts + 1]`.
    starts: Vec<usize>,
    /// Slots (`token * used + choice`) grouped by expert, tokens in order within one.
    order: Vec<u32>,
    /// Each expert's next free place in `order` while grouping.
    next: Vec<usize>,
    /// Each slot's place in `order`.
    place: Vec<u32>,
    /// One expert's rows in.
    rows_in: Vec<f32>,
    /// `[t * used, hidden]`: each slot's expert output, in `order`.
    slot_out: Vec<f32>,
    shared_out: Vec<f32>,
    mlp: MlpScratch,
    panels: PanelScratch,
}

impl Moe {
    /// Loads `blk.{layer}.ffn_gate_inp`, every expert of `ffn_{gate,up,down}_exps`
    /// (each held as its own matrices) and the shared expert where the family has one.
    pub(super) fn new(
        ld: &mut Loader,
        prefix: &str,
        c: &ModelConfig,
        cfg: MoeConfig,
    ) -> Result<Self> {
        let (h, n, ffn) = (c.hidden_size, cfg.experts, cfg.ffn);
        let biased = cfg.rules.biases;
        let router = ld.linear(&format!("{prefix}.ffn_gate_inp"), n, h, biased)?;
        let name = |part: &str| format!("{prefix}.ffn_{part}_exps.weight");
        let (gate, up, down) = (name("gate"), name("up"), name("down"));
        let bias = |part: &str| format!("{prefix}.ffn_{part}_exps.bias");
        // Each expert's gate, up and down biases (gpt-oss), `[experts, width]` each.
        let mut biases = match biased {
            true => Some([
                ld.stacked_vectors(&bias("gate"), n, ffn)?.into_iter(),
                ld.stacked_vectors(&bias("up"), n, ffn)?.into_iter(),
                ld.stacked_vectors(&bias("down"), n, h)?.into_iter(),
            ]),
            false => None,
        };
        let experts = (0..n)
            .map(|e| {
                let w = [
                    ld.expert(&gate, e, n, ffn, h)?,
                    ld.expert(&up, e, n, ffn, h)?,
                    ld.expert(&down, e, n, h, ffn)?,
                ];
                let b = biases.as_mut().map(|[g, u, d]| {
                    let next = |i: &mut std::vec::IntoIter<Vec<f32>>| i.next().expect("n biases");
                    [next(g), next(u), next(d)]
                });
                Ok(Mlp::from_weights(ld, w, b, (h, ffn), c.activation))
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match cfg.shared_ffn {
            Some(sffn) => Some((
                Mlp::named(ld, prefix, "_shexp", (h, sffn), c.activation)?,
                ld.vector(&format!("{prefix}.ffn_gate_inp_shexp.weight"), h)?,
            )),
            None => None,
        };
        Ok(Moe {
            router,
            panels: PanelExperts::of(&experts),
            experts,
            shared,
            cfg,
            hidden: h,
        })
    }

    /// Where its batches leave the quantized path (`Linear::small_batch_max_rows`).
    pub(super) fn small_batch_max_rows(&self) -> Option<usize> {
        let experts = self.experts.iter().map(Mlp::small_batch_max_rows);
        let shared = self.shared.iter().map(|(m, _)| m.small_batch_max_rows());
        experts.chain(shared).fold(None, first_switch)
    }

    /// Whether the chosen experts run in two jobs a step (`PanelExperts`).
    pub(super) fn in_two_jobs(&self) -> bool {
        self.panels.is_some()
    }

    /// `xn` is the normed input `[t, hidden]`; writes `[t, hidden]` into `out`.
    pub(super) fn forward(&self, xn: &[f32], t: Tokens, s: &mut MoeScratch, out: &mut [f32]) {
        let (h, n, k) = (self.hidden, self.cfg.experts, self.cfg.used);
        let probs = sized(&mut s.probs, t.n * n);
        self.router.forward(xn, t, probs);
        s.chosen.clear();
        for row in probs.chunks_exact_mut(n) {
            self.route(row, &mut s.chosen);
        }
        self.group(t.n, s);
        let slot_out = sized(&mut s.slot_out, t.n * k * h);
        match &self.panels {
            Some(p) => {
                let shape = (h, k);
                p.forward(
                    &self.experts,
                    xn,
                    shape,
                    &s.starts,
                    &s.order,
                    &mut s.panels,
                    slot_out,
                )
            }
            None => {
                for e in 0..n {
                    let (r0, r1) = (s.starts[e], s.starts[e + 1]);
                    if r0 == r1 {
                        continue;
                    }
                    let rows_in = sized(&mut s.rows_in, (r1 - r0) * h);
                    for (dst, &slot) in rows_in.chunks_exact_mut(h).zip(&s.order[r0..r1]) {
                        let token = slot as usize / k;
                        dst.copy_from_slice(&xn[token * h..][..h]);
                    }
                    let te = Tokens { n: r1 - r0, ..t };
                    let rows_out = &mut slot_out[r0 * h..r1 * h];
                    self.experts[e].forward(rows_in, te, &mut s.mlp, rows_out);
                }
            }
        }
        for (token, o) in out[..t.n * h].chunks_exact_mut(h).enumerate() {
            o.fill(0.0);
            for c in 0..k {
                let slot = token * k + c;
                let w = s.chosen[slot].1;
                let y = &slot_out[s.place[slot] as usize * h..][..h];
                for (a, b) in o.iter_mut().zip(y) {
                    *a += w * b;
                }
            }
        }
        if let Some((mlp, gate)) = &self.shared {
            let y = sized(&mut s.shared_out, t.n * h);
            mlp.forward(xn, t, &mut s.mlp, y);
            for ((o, y), x) in out
                .chunks_exact_mut(h)
                .zip(y.chunks_exact(h))
                .zip(xn.chunks_exact(h))
            {
                let g: f32 = x.iter().zip(gate).map(|(a, b)| a * b).sum();
                let g = 1.0 / (1.0 + (-g).exp());
                for (a, b) in o.iter_mut().zip(y) {
                    *a += b * g;
                }
            }
        }
    }

    /// One token's scores (`row`, turned into probabilities in place) to its top-k
    /// experts and their weights, appended to `chosen` in descending order.
    fn route(&self, row: &mut [f32], chosen: &mut Vec<(u32, f32)>) {
        match self.cfg.rules.gating {
            Gating::Softmax => softmax(row),
            Gating::Sigmoid => row.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            // Chosen on the logits; the softmax is over the chosen ones, below.
            Gating::SoftmaxChosen => {}
        }
        let start = chosen.len();
        for _ in 0..self.cfg.used {
            // The highest probability not yet chosen; the lower index on a tie.
            let mut best: Option<(usize, f32)> = None;
            for (e, &p) in row.iter().enumerate() {
                let taken = chosen[start..].iter().any(|&(c, _)| c as usize == e);
                if !taken && best.is_none_or(|(_, bp)| p > bp) {
                    best = Some((e, p));
                }
            }
            let (e, p) = best.expect("used <= experts");
            chosen.push((e as u32, p));
        }
        let mine = &mut chosen[start..];
        if self.cfg.rules.gating == Gating::SoftmaxChosen {
            let mut w: [f32; MAX_USED] = [0.0; MAX_USED];
            let w = &mut w[..mine.len()];
            w.iter_mut().zip(mine.iter()).for_each(|(w, c)| *w = c.1);
            softmax(w);
            mine.iter_mut().zip(w.iter()).for_each(|(c, w)| c.1 = *w);
        }
        if self.cfg.rules.norm_weights {
            // llama.cpp clamps the sum to f16's smallest normal.
            let sum: f32 = mine.iter().map(|c| c.1).sum::<f32>().max(6.103_515_6e-5);
            mine.iter_mut().for_each(|c| c.1 /= sum);
        }
        if self.cfg.weights_scale != 1.0 {
            mine.iter_mut().for_each(|c| c.1 *= self.cfg.weights_scale);
        }
    }

    /// Groups the `t * used` slots by expert (a counting sort: `starts`, `order`).
    fn group(&self, t: usize, s: &mut MoeScratch) {
        let n = self.cfg.experts;
        s.starts.clear();
        s.starts.resize(n + 1, 0);
        for &(e, _) in &s.chosen {
            s.starts[e as usize + 1] += 1;
        }
        for e in 0..n {
            s.starts[e + 1] += s.starts[e];
        }
        s.order.clear();
        s.order.resize(t * self.cfg.used, 0);
        // Each expert's next free place in `order`.
        s.next.clear();
        s.next.extend_from_slice(&s.starts[..n]);
        s.place.clear();
        s.place.resize(t * self.cfg.used, 0);
        for (slot, &(e, _)) in s.chosen.iter().enumerate() {
            s.order[s.next[e as usize]] = slot as u32;
            s.place[slot] = s.next[e as usize] as u32;
            s.next[e as usize] += 1;
        }
    }
}

/// The most experts a token may use under `Gating::SoftmaxChosen` (checked at load:
/// `MoeConfig`); the weights' softmax runs on the stack.
pub(crate) const MAX_USED: usize = 64;

/// `row` becomes its softmax, as ggml's `soft_max` (the sum in f64, then one f32
/// reciprocal multiplied in).
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}
