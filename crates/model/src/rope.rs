//! `Rope`: rotary position embeddings, with cos/sin tables precomputed (in f32, as
//! llama.cpp computes them) for every position up to the context length, in
//! interleaved or half-split pairing.

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
        // In f32, as llama.cpp's `ggml_rope_cache_init` computes it: each angle is the
        // previous one times theta^(-2/d), starting from the position (at long contexts
        // this differs from the exact angle by more than the tolerance of the tests).
        let theta_scale = theta.powf(-2.0 / head_dim as f32);
        for pos in 0..max_pos {
            let mut angle = pos as f32;
            for _ in 0..half {
                let a = freq_scale * angle;
                cos.push(a.cos());
                sin.push(a.sin());
                angle *= theta_scale;
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
