//! `Rope`: rotary position embeddings, with cos/sin tables precomputed for every
//! position up to the context length, in interleaved or half-split pairing.

use crate::config::RopeStyle;

pub struct Rope {
    style: RopeStyle,
    half: usize,
    max_pos: usize,
    /// `[max_pos, half]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub fn new(style: RopeStyle, head_dim: usize, theta: f32, max_pos: usize) -> Self {
        Self::scaled(style, head_dim, theta, 1.0, max_pos)
    }

    /// Like `new`, with positions multiplied by `freq_scale` (linear RoPE scaling).
    pub fn scaled(
        style: RopeStyle,
        head_dim: usize,
        theta: f32,
        freq_scale: f32,
        max_pos: usize,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| freq_scale as f64 * (theta as f64).powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        for pos in 0..max_pos {
            for f in &inv_freq {
                let a = pos as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Rope {
            style,
            half,
            max_pos,
            cos,
            sin,
        }
    }

    pub fn max_pos(&self) -> usize {
        self.max_pos
    }

    /// Rotates every head of `x` (`num_heads * head_dim` values) for position `pos`.
    #[inline]
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (x0, x1) = (pair[0], pair[1]);
                        pair[0] = x0 * cos[i] - x1 * sin[i];
                        pair[1] = x0 * sin[i] + x1 * cos[i];
                    }
                }
                RopeStyle::HalfSplit => {
                    let (a, b) = head.split_at_mut(half);
                    for i in 0..half {
                        let (x0, x1) = (a[i], b[i]);
                        a[i] = x0 * cos[i] - x1 * sin[i];
                        b[i] = x0 * sin[i] + x1 * cos[i];
                    }
                }
            }
        }
    }
}
