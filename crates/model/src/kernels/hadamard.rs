//! The orthonormal Walsh-Hadamard rotation a quantized KV cache is stored in, as
//! llama.cpp rotates it: q and k (and v) turned by `H` before k and v are quantized,
//! so an outlier dimension spreads over its whole chunk instead of setting one
//! block's scale; `q·k` is unchanged (`H` is orthonormal) and the attention output is
//! turned back by `H` again (`H` is symmetric and its own inverse).

/// `x ← H·x` on each chunk of `n` values (`n` a power of two dividing `x.len()`),
/// `H` Sylvester's: `H[i][j] = (-1)^popcount(i & j) / sqrt(n)` (llama.cpp's
/// `ggml_gen_hadamard`). In place: log2(n) butterfly passes, then the scale.
pub fn rotate(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let scale = 1.0 / (n as f32).sqrt();
    for c in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for pair in c.chunks_exact_mut(2 * h) {
                let (a, b) = pair.split_at_mut(h);
                for (a, b) in a.iter_mut().zip(b) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            h *= 2;
        }
        for v in c {
            *v *= scale;
        }
    }
}

/// The chunk sizes keys (and queries) and values are rotated in for a quantized cache
/// with heads of `head_dim`: llama.cpp's, the largest power of two of at least 64
/// dividing the head for keys, 64 for values; `None` where 64 does not divide it.
pub fn kv_rotation(head_dim: usize) -> Option<(usize, usize)> {
    if !head_dim.is_multiple_of(64) {
        return None;
    }
    let mut k = 64;
    while head_dim.is_multiple_of(2 * k) {
        k *= 2;
    }
    Some((k, 64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_data;

    /// Equals the matrix product with llama.cpp's Sylvester matrix, keeps dot
    /// products, and is its own inverse.
    #[test]
    fn rotation_is_sylvesters_orthonormal_matrix() {
        for n in [64, 128] {
            let x = test_data(2 * n, 3);
            let mut y = x.clone();
            rotate(&mut y, n);
            for (c, yc) in x.chunks(n).zip(y.chunks(n)) {
                for (i, yi) in yc.iter().enumerate() {
                    let want: f64 = (0..n)
                        .map(|j| {
                            let s = if (i & j).count_ones() % 2 == 0 {
                                1.0
                            } else {
                                -1.0
                            };
                            s * c[j] as f64 / (n as f64).sqrt()
                        })
                        .sum();
                    assert!((*yi as f64 - want).abs() < 1e-5, "{n} [{i}]");
                }
            }
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f32>();
            let z = test_data(2 * n, 9);
            let mut zr = z.clone();
            rotate(&mut zr, n);
            assert!((dot(&x, &z) - dot(&y, &zr)).abs() < 1e-3);
            rotate(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5);
            }
        }
        assert_eq!(kv_rotation(64), Some((64, 64)));
        assert_eq!(kv_rotation(128), Some((128, 64)));
        assert_eq!(kv_rotation(192), Some((64, 64)));
        assert_eq!(kv_rotation(256), Some((256, 64)));
        assert_eq!(kv_rotation(96), None);
    }
}
