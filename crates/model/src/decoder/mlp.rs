//! `Mlp`: a block's gated feed-forward, `down(act(gate(x)) · up(x))` with SiLU or
//! the tanh GELU, or gpt-oss's clamped SwiGLU (each projection with its bias there);
//! gate and up apart or, as phi3 stores them, stacked in `ffn_up`.

use super::fused::FusedLinear;
use super::{sized, Loader};
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::kernels::activation::{
    gelu_mul, gelu_mul_rows, silu_mul, silu_mul_rows, swiglu_oai_mul, swiglu_oai_mul_rows,
};
use crate::linear::{first_switch, Linear, Tokens};
use crate::weights::WeightData;

pub(super) struct Mlp {
    /// gate and up projections (parts 0, 1).
    gate_up: FusedLinear,
    down: Linear,
    activation: Activation,
}

/// The MLP's activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub(super) struct MlpScratch {
    gate: Vec<f32>,
    up: Vec<f32>,
    both: Vec<f32>,
}

impl Mlp {
    /// Loads `{prefix}.ffn_gate`, `ffn_up` and `ffn_down` (or, where the family stacks
    /// the gate into `ffn_up`, those two).
    pub(super) fn new(ld: &mut Loader, prefix: &str, c: &ModelConfig) -> Result<Self> {
        let (h, ffn) = (c.hidden_size, c.intermediate_size);
        if c.family.ffn_up_holds_gate {
            return Ok(Mlp {
                gate_up: FusedLinear::stacked(
                    ld,
                    &format!("{prefix}.ffn_up"),
                    vec![ffn, ffn],
                    h,
                    None,
                )?,
                down: ld.linear(&format!("{prefix}.ffn_down"), h, ffn, false)?,
                activation: c.activation,
            });
        }
        Self::named(
            ld,
            prefix,
            "",
            (c.hidden_size, c.intermediate_size),
            c.activation,
        )
    }

    /// Loads `{prefix}.ffn_gate{suffix}`, `ffn_up{suffix}` and `ffn_down{suffix}`
    /// (`_shexp`: a shared expert), `ffn` wide.
    pub(super) fn named(
        ld: &mut Loader,
        prefix: &str,
        suffix: &str,
        (h, ffn): (usize, usize),
        activation: Activation,
    ) -> Result<Self> {
        Ok(Mlp {
            gate_up: FusedLinear::load(
                ld,
                &[
                    (format!("{prefix}.ffn_gate{suffix}"), ffn),
                    (format!("{prefix}.ffn_up{suffix}"), ffn),
                ],
                h,
                false,
            )?,
            down: ld.linear(&format!("{prefix}.ffn_down{suffix}"), h, ffn, false)?,
            activation,
        })
    }

    /// One expert's feed-forward from its gate, up (`[ffn, hidden]`) and down
    /// (`[hidden, ffn]`) weights, and their biases where it has them (already counted
    /// as held).
    pub(super) fn from_weights(
        ld: &mut Loader,
        [gate, up, down]: [WeightData; 3],
        biases: Option<[Vec<f32>; 3]>,
        (h, ffn): (usize, usize),
        activation: Activation,
    ) -> Self {
        let (gate_up_b, down_b) = match biases {
            Some([g, u, d]) => (vec![g, u], Some(d)),
            None => (Vec::new(), None),
        };
        Mlp {
            gate_up: FusedLinear::from_weights(ld, vec![gate, up], vec![ffn, ffn], h, gate_up_b),
            down: ld.new_linear(down, h, ffn, down_b),
            activation,
        }
    }

    /// Where its batches leave the quantized path (`Linear::small_batch_max_rows`).
    pub(super) fn small_batch_max_rows(&self) -> Option<usize> {
        first_switch(
            self.gate_up.small_batch_max_rows(),
            self.down.small_batch_max_rows(),
        )
    }

    /// The gate/up projections and the down projection.
    pub(super) fn projections(&self) -> (&FusedLinear, &Linear) {
        (&self.gate_up, &self.down)
    }

    /// `out[r] = act(gate_r) · up_r` for each row of a stacked gate/up product
    /// (`both`: `[rows, 2·ffn]`, `out`: `[rows, ffn]`).
    pub(super) fn activate_rows(&self, both: &[f32], out: &mut [f32]) {
        let ffn = self.gate_up.width(0);
        match self.activation {
            Activation::Silu => silu_mul_rows(both, ffn, out),
            Activation::GeluTanh => gelu_mul_rows(both, ffn, out),
            Activation::SwigluOai { alpha, limit } => {
                swiglu_oai_mul_rows(both, ffn, out, alpha, limit)
            }
        }
    }

    /// `xn` is the normed input `[t, hidden]`; writes `[t, hidden]` into `out`.
    pub(super) fn forward(&self, xn: &[f32], t: Tokens, s: &mut MlpScratch, out: &mut [f32]) {
        let ffn = self.gate_up.width(0);
        if let Some(both) = self.gate_up.forward_joined(xn, t, &mut s.both) {
            // Gate and up stacked: the activation reads them where the product left
            // them and writes the down projection's input.
            let h = sized(&mut s.gate, t.n * ffn);
            self.activate_rows(both, h);
            return self.down.forward(h, t, out);
        }
        let gate = sized(&mut s.gate, t.n * ffn);
        let up = sized(&mut s.up, t.n * ffn);
        let mut outs = [gate, up];
        self.gate_up.forward(xn, t, &mut s.both, &mut outs);
        let [gate, up] = outs;
        match self.activation {
            Activation::Silu => silu_mul(gate, up),
            Activation::GeluTanh => gelu_mul(gate, up),
            Activation::SwigluOai { alpha, limit } => swiglu_oai_mul(gate, up, alpha, limit),
        }
        self.down.forward(gate, t, out);
    }
}
