//! `matmul_parts`: several matrices of one layout, each over its own run of
//! activation rows, as one job on the pool: a mixture's chosen experts, whose
//! products at batch 1 (one row, a few hundred kilobytes of weights each) would
//! otherwise be a parallel section apiece, each ending with a wait for the slower
//! thread. The tiles and their order within a row are `matmul`'s, so each row's
//! outputs are bit for bit what `matmul` gives it alone.

use std::ops::Range;

use super::{ready, run_task, Isa, MC};
use crate::kernels::act_quant::QuantActs;
use crate::kernels::cpu::OutPtr;
use crate::kernels::int8_panels::{Int8Panels, NR};
use crate::kernels::pool::{parallel_for, threads};

/// One part of a product: its weights, and the bias added to its outputs.
#[derive(Clone, Copy)]
pub struct Part<'a> {
    pub w: &'a Int8Panels,
    pub bias: Option<&'a [f32]>,
}

/// One task of `matmul_parts`: a part, a run of its rows, a run of its panels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartTask {
    part: u32,
    rows: (u32, u32),
    panels: (u32, u32),
}

/// Tasks a thread takes in a job, on average: enough that a thread slowed by another
/// process leaves little of the job to wait for.
const TASKS_PER_THREAD: usize = 8;

/// `out[r] = acts[r] · W_iᵀ (+ b_i)` for the rows `starts[i]..starts[i + 1]` of part
/// `i = 0..starts.len() - 1` (`part(i)`; parts without rows are never asked for), all
/// in one parallel section. `acts` holds `starts[last]` rows quantized (`QuantActs::
/// quantize` or `gather`); every part has the same shape and layout
/// (`Int8Panels::same_layout`); `out` is `[rows, n]`. `tasks` is the caller's buffer
/// for the job's task list (kept between calls: no allocation once grown).
pub fn matmul_parts<'a>(
    isa: Isa,
    starts: &[usize],
    part: &(dyn Fn(usize) -> Part<'a> + Sync),
    acts: &mut QuantActs,
    out: &mut [f32],
    tasks: &mut Vec<PartTask>,
) {
    assert!(
        isa.available(),
        "{isa:?} cannot multiply these weights here"
    );
    let Some(first) = (0..starts.len().saturating_sub(1)).find(|&i| starts[i + 1] > starts[i])
    else {
        return;
    };
    let w0 = part(first).w;
    let (n, k, m) = (w0.n, w0.k, starts[starts.len() - 1]);
    assert!(acts.rows == m && acts.kb * 32 == k && out.len() >= m * n);
    assert!(!w0.has_min || w0.zero == 0, "a minimum and a zero point");
    ready(acts, w0, isa);
    let panels = n.div_ceil(NR);
    let chunks: usize = starts.windows(2).map(|s| (s[1] - s[0]).div_ceil(MC)).sum();
    let per_task = (panels * chunks)
        .div_ceil(threads() * TASKS_PER_THREAD)
        .clamp(1, panels);
    tasks.clear();
    for (i, s) in starts.windows(2).enumerate() {
        if s[1] > s[0] {
            let w = part(i).w;
            assert!(
                w.same_layout(w0),
                "part {i}'s layout differs from part {first}'s"
            );
        }
        for r0 in (s[0]..s[1]).step_by(MC) {
            for p0 in (0..panels).step_by(per_task) {
                tasks.push(PartTask {
                    part: i as u32,
                    rows: (r0 as u32, (r0 + MC).min(s[1]) as u32),
                    panels: (p0 as u32, (p0 + per_task).min(panels) as u32),
                });
            }
        }
    }
    let (acts, tasks): (&QuantActs, &[PartTask]) = (acts, tasks);
    let ptr = OutPtr(out.as_mut_ptr());
    parallel_for(tasks.len(), &|t| {
        let task = tasks[t];
        let Part { w, bias } = part(task.part as usize);
        let rows = task.rows.0 as usize..task.rows.1 as usize;
        let panels = task.panels.0 as usize..task.panels.1 as usize;
        // SAFETY: the tasks cover each (row, panel) of out once; acts holds the rows,
        // readied for this layout (every part's: `same_layout`); the CPU has `isa`.
        unsafe { run_task(w, isa, acts, rows.clone(), panels.clone(), ptr, n) };
        if let Some(b) = bias {
            let cols = panels.start * NR..(panels.end * NR).min(n);
            // SAFETY: as above, this task alone writes these rows' columns `cols`.
            unsafe { add_bias(ptr, n, rows, cols, b) };
        }
    });
}

/// `out[r][c] += bias[c]` for `r` in `rows`, `c` in `cols` (`Linear::forward`'s sum).
///
/// # Safety
/// The rows' columns lie inside `out` (row stride `ldc`) and no other thread
/// touches them.
unsafe fn add_bias(out: OutPtr, ldc: usize, rows: Range<usize>, cols: Range<usize>, bias: &[f32]) {
    for r in rows {
        // SAFETY: the caller's word.
        let row = unsafe { std::slice::from_raw_parts_mut(out.get().add(r * ldc), ldc) };
        for (o, b) in row[cols.clone()].iter_mut().zip(&bias[cols.clone()]) {
            *o += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::block_scales::random_blocks;
    use crate::kernels::cpu::test_data;
    use crate::kernels::int8_gemm::matmul;
    use candle_core::quantized::GgmlDType;

    /// Each part's rows come out bit for bit as `matmul` gives them over that part's
    /// rows alone, bias added, whatever the other parts (empty ones included) and
    /// however many rows each has, for each layout the loader makes on this CPU.
    #[test]
    fn each_part_is_its_own_product_bit_for_bit() {
        let Some(isa) = Isa::best() else { return };
        let (n, k) = (40, 512);
        for dtype in [
            GgmlDType::Q4K,
            GgmlDType::Q6K,
            GgmlDType::Q8_0,
            GgmlDType::Q3K,
        ] {
            let ws: Vec<Int8Panels> = (0..5)
                .map(|e| {
                    let mut p = Int8Panels::pack(&random_blocks(dtype, n, k, e + 1), n, k).unwrap();
                    p.repack(isa.packing());
                    p
                })
                .collect();
            let biases: Vec<Vec<f32>> = (0..5).map(|e| test_data(n, 30 + e as u32)).collect();
            for rows in [[1, 0, 1, 1, 0], [3, 70, 0, 1, 9], [0, 0, 0, 0, 2]] {
                let mut starts = vec![0];
                for r in rows {
                    starts.push(starts.last().unwrap() + r);
                }
                let m = starts[5];
                let x = test_data(m * k, 7);
                let mut acts = QuantActs::default();
                acts.quantize(&x, k);
                let mut out = vec![f32::NAN; m * n];
                let part = |e: usize| Part {
                    w: &ws[e],
                    bias: e.is_multiple_of(2).then_some(&biases[e][..]),
                };
                matmul_parts(isa, &starts, &part, &mut acts, &mut out, &mut Vec::new());
                for e in 0..5 {
                    let (r0, r1) = (starts[e], starts[e + 1]);
                    let mut want = vec![0f32; (r1 - r0) * n];
                    matmul(&ws[e], isa, &x[r0 * k..r1 * k], r1 - r0, &mut want);
                    if e.is_multiple_of(2) {
                        want.chunks_exact_mut(n).for_each(|row| {
                            row.iter_mut().zip(&biases[e]).for_each(|(o, b)| *o += b)
                        });
                    }
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&out[r0 * n..r1 * n]),
                        bits(&want),
                        "{dtype:?} {isa:?} part {e} of {rows:?}"
                    );
                }
            }
        }
    }
}
