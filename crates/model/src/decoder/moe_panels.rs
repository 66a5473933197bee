//! `PanelExperts`: a mixture's chosen experts multiplied over their 8-bit panels in
//! two jobs a step, every chosen expert's gate/up product in one and every down
//! product in the other (`int8_gemm::matmul_parts`), where the per-expert path
//! (`Mlp::forward` for each) opens two parallel sections an expert: 16 a layer at
//! batch 1 with 8 chosen, each ending in a wait for the slower thread. A token's row
//! is quantized once, and each expert's rows are copies of its tokens' quantized
//! rows; every row's arithmetic is the per-expert path's, bit for bit.

use super::mlp::Mlp;
use super::sized;
use crate::kernels::act_quant::QuantActs;
use crate::kernels::int8_gemm::{matmul_parts, Isa, Part, PartTask};
use crate::kernels::int8_panels::Int8Panels;
use crate::linear::Linear;

pub(super) struct PanelExperts {
    isa: Isa,
}

/// `PanelExperts`' buffers, grown to the largest batch seen.
#[derive(Default)]
pub(super) struct PanelScratch {
    /// The step's token rows, quantized.
    tokens: QuantActs,
    /// The slots' rows grouped by expert: their tokens' rows, then their hidden
    /// activations.
    slots: QuantActs,
    /// Each grouped slot's token.
    rows: Vec<u32>,
    /// `[slots, 2·ffn]` gate and up products, and `[slots, ffn]` activations.
    gate_up: Vec<f32>,
    hidden: Vec<f32>,
    tasks: Vec<PartTask>,
}

/// A projection's panels and bias, if it is held as panels.
fn part(l: &Linear) -> Option<(Part<'_>, Isa)> {
    let (w, isa) = l.panels()?;
    let bias = l.bias.as_deref();
    Some((Part { w, bias }, isa))
}

/// Expert `e`'s gate/up (stacked) and down projections as panels.
fn parts(e: &Mlp) -> Option<[(Part<'_>, Isa); 2]> {
    let (gate_up, down) = e.projections();
    Some([part(gate_up.joined()?)?, part(down)?])
}

impl PanelExperts {
    /// Where every expert's gate and up are stacked and every projection is held as
    /// 8-bit panels, gate/ups of one layout and downs of another, on one instruction
    /// set; else `None` (exact precision, types that differ, no AVX2).
    /// `SLOSERVE_MOE=per-expert` leaves the experts on the per-expert path (A/B
    /// measurements, and the test that both give the same bits).
    pub(super) fn of(experts: &[Mlp]) -> Option<Self> {
        if std::env::var("SLOSERVE_MOE").is_ok_and(|v| v == "per-expert") {
            return None;
        }
        let first = parts(experts.first()?)?;
        let isa = first[0].1;
        let same = |a: &Int8Panels, b: &Int8Panels| a.same_layout(b);
        for e in experts {
            let [(gu, i0), (d, i1)] = parts(e)?;
            let ok = i0 == isa && i1 == isa && same(gu.w, first[0].0.w) && same(d.w, first[1].0.w);
            if !ok {
                return None;
            }
        }
        Some(PanelExperts { isa })
    }

    /// The chosen experts' outputs: `xn` is the normed input (`[tokens, hidden]`), the
    /// slots (`token · used + choice`) grouped by expert in `order`, expert `e`'s at
    /// `starts[e]..starts[e + 1]`; writes each slot's `[hidden]` output at its place in
    /// `order` into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        experts: &[Mlp],
        xn: &[f32],
        (hidden, used): (usize, usize),
        starts: &[usize],
        order: &[u32],
        s: &mut PanelScratch,
        out: &mut [f32],
    ) {
        let slots = order.len();
        let tokens = slots / used;
        s.tokens.quantize(&xn[..tokens * hidden], hidden);
        s.rows.clear();
        s.rows.extend(order.iter().map(|&slot| slot / used as u32));
        s.slots.gather(&s.tokens, &s.rows);
        let gate_up = |e: usize| parts(&experts[e]).expect("checked at load")[0].0;
        let width = gate_up(0).w.n;
        let both = sized(&mut s.gate_up, slots * width);
        matmul_parts(self.isa, starts, &gate_up, &mut s.slots, both, &mut s.tasks);
        let ffn = width / 2;
        let h = sized(&mut s.hidden, slots * ffn);
        // Every expert's activation is its family's: the first's serves all.
        experts[0].activate_rows(both, h);
        s.slots.quantize(h, ffn);
        let down = |e: usize| parts(&experts[e]).expect("checked at load")[1].0;
        let out = &mut out[..slots * hidden];
        matmul_parts(self.isa, starts, &down, &mut s.slots, out, &mut s.tasks);
    }
}
