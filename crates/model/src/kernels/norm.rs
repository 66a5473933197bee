//! `rms_norm`: root-mean-square normalisation of each row, scaled by a weight.

/// Each `h`-row of `x` (h = `w.len()`) divided by its RMS (with `eps`) and
/// multiplied by `w`, into `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
