//! `rms_norm`: root-mean-square normalisation of each row, scaled by a weight (rows
//! spread over the pool in large batches); `layer_norm_in_place`: LayerNorm with
//! weight and bias (an encoder's).

use crate::kernels::pool::{parallel_rows, ROWS_PER_TASK};

/// Each `h`-row of `x` (h = `w.len()`) divided by its RMS (with `eps`) and
/// multiplied by `w`, into `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    let n = x.len().min(out.len()) / h * h;
    parallel_rows(&mut out[..n], h, ROWS_PER_TASK, &|r0, out| {
        for (xr, or) in x[r0 * h..].chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            let ss = mean_square(xr);
            let scale = 1.0 / (ss + eps).sqrt();
            for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * scale * g;
            }
        }
    });
}

/// The mean of the squares, summed in f64 as ggml does.
#[inline]
fn mean_square(x: &[f32]) -> f32 {
    (x.iter().map(|&v| (v * v) as f64).sum::<f64>() / x.len() as f64) as f32
}

/// `rms_norm` of each `w.len()`-row of `x`, in place (e.g. per attention head).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let h = w.len();
    // Heads are short rows: a task takes ROWS_PER_TASK x 1,024 values of them.
    parallel_rows(x, h, ROWS_PER_TASK * 1024 / h.max(1), &|_, x| {
        for xr in x.chunks_exact_mut(h) {
            let ss = mean_square(xr);
            let scale = 1.0 / (ss + eps).sqrt();
            for (v, g) in xr.iter_mut().zip(w) {
                *v = *v * scale * g;
            }
        }
    });
}

/// Each `w.len()`-row of `x`, in place: minus its mean, divided by its standard
/// deviation (with `eps`), times `w` plus `b` (ggml's `ggml_norm` with its sums in
/// f64, then `ggml_mul` and `ggml_add`).
pub fn layer_norm_in_place(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let h = w.len();
    parallel_rows(x, h, ROWS_PER_TASK, &|_, x| {
        for xr in x.chunks_exact_mut(h) {
            let mean = (xr.iter().map(|&v| v as f64).sum::<f64>() / h as f64) as f32;
            let mut sum2 = 0.0f64;
            for v in xr.iter_mut() {
                *v -= mean;
                sum2 += (*v * *v) as f64;
            }
            let scale = 1.0 / ((sum2 / h as f64) as f32 + eps).sqrt();
            for ((v, g), c) in xr.iter_mut().zip(w).zip(b) {
                *v = *v * scale * g + c;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_scales_and_shifts_each_row() {
        // Rows [1, 3] (mean 2, variance 1) and [5, 5] (variance 0: all zero, then b).
        let mut x = [1.0, 3.0, 5.0, 5.0];
        layer_norm_in_place(&mut x, &[2.0, 1.0], &[0.5, -1.0], 1e-12);
        let want = [-1.5, 0.0, 0.5, -1.0];
        for (v, w) in x.iter().zip(want) {
            assert!((v - w).abs() < 1e-6, "{v} vs {w}");
        }
    }

    #[test]
    fn normalises_each_row() {
        // Rows [3, 4] (mean square 12.5) and [1, -1] (mean square 1).
        let mut out = [0.0; 4];
        rms_norm(&[3.0, 4.0, 1.0, -1.0], &[1.0, 2.0], 0.0, &mut out);
        let s = 12.5f32.sqrt();
        let want = [3.0 / s, 8.0 / s, 1.0, -2.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{o} vs {w}");
        }
    }
}
