//! `Rope`: rotary position embeddings, with cos/sin tables precomputed (in f32, as
//! llama.cpp's `ggml_rope_cache_init` computes them) for every position up to the
//! context length, in interleaved or half-split pairing; with the long-context
//! scalings llama.cpp applies (`RopeScaling`: linear, YaRN) and per-dimension
//! frequency factors (`RopeFactors`: Llama 3's `rope_freqs`, Phi-3's LongRoPE), over
//! the first `rope.dimension_count` dimensions of each head (all of them, or fewer:
//! Phi-4-mini rotates 96 of 128).

use crate::error::{ModelError, Result};
use crate::family::RopeStyle;
use crate::gguf::GgufFile;

/// A file's (or the command line's) RoPE scaling type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalingKind {
    None,
    Linear,
    Yarn,
}

impl ScalingKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(ScalingKind::None),
            "linear" => Some(ScalingKind::Linear),
            "yarn" => Some(ScalingKind::Yarn),
            _ => None,
        }
    }
}

/// How RoPE's angles are scaled, in llama.cpp's terms (`llama_cparams`): positions
/// times `freq_scale`; with `ext_factor` != 0 (YaRN) the dimensions between the
/// correction dims blend interpolation and extrapolation, and cos/sin are
/// multiplied by an attention factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    pub kind: ScalingKind,
    /// 1 / factor (1 without scaling).
    pub freq_scale: f32,
    pub ext_factor: f32,
    /// `yarn_attn_factor` as llama.cpp's context computes it (before `rope_yarn`'s own
    /// `1 + 0.1 ln(factor)`).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The context the model was trained on before scaling (YaRN's `n_ctx_orig`).
    pub orig_ctx: usize,
}

/// Command-line overrides of the file's RoPE scaling (`--rope-scaling`,
/// `--rope-scale`, `--yarn-orig-ctx`, as llama-server names them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RopeOverride {
    pub kind: Option<ScalingKind>,
    pub factor: Option<f32>,
    pub orig_ctx: Option<usize>,
}

impl RopeScaling {
    /// No scaling: llama.cpp's angles exactly.
    pub const NONE: RopeScaling = RopeScaling {
        kind: ScalingKind::None,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        orig_ctx: 0,
    };

    /// Reads `{arch}.rope.scaling.*` as llama.cpp's loader and context do (a factor
    /// with no type is linear), then applies `over`.
    pub fn from_gguf(
        f: &GgufFile,
        arch: &str,
        ctx_train: usize,
        over: &RopeOverride,
    ) -> Result<Self> {
        let k = |name: &str| format!("{arch}.rope.scaling.{name}");
        let kind = match over.kind {
            Some(kind) => kind,
            None => match f.get_str(&k("type")) {
                Ok(s) => ScalingKind::parse(&s).ok_or_else(|| ModelError::BadMetadata {
                    path: f.path.clone(),
                    key: k("type"),
                    reason: format!("RoPE scaling '{s}' is not supported (none, linear, yarn)"),
                })?,
                Err(_) => ScalingKind::Linear,
            },
        };
        let factor = over
            .factor
            .or_else(|| f.get_f32(&k("factor")).ok())
            .or_else(|| f.get_f32(&format!("{arch}.rope.scale_linear")).ok())
            .filter(|&x| x > 0.0);
        let freq_scale = match kind {
            ScalingKind::None => 1.0,
            _ => factor.map_or(1.0, |x| 1.0 / x),
        };
        let opt = |name: &str| f.get_f32(&k(name)).ok();
        let orig_ctx = over
            .orig_ctx
            .or_else(|| f.get_usize(&k("original_context_length")).ok())
            .unwrap_or(ctx_train);
        let ext_factor = opt("yarn_ext_factor")
            .filter(|&x| x >= 0.0)
            .unwrap_or(if kind == ScalingKind::Yarn { 1.0 } else { 0.0 });
        let mut attn_factor = opt("yarn_attn_factor").unwrap_or(1.0);
        if ext_factor != 0.0 {
            // llama_context's constructor: the magnitude correction, and `rope_yarn`'s own
            // factor cancelled (it is applied again per angle).
            let mscale = |scale: f32, m: f32| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let factor = 1.0 / freq_scale;
            let log_mul = opt("yarn_log_multiplier").unwrap_or(0.0);
            attn_factor = if log_mul != 0.0 {
                mscale(factor, 1.0) / mscale(factor, log_mul)
            } else {
                mscale(factor, 1.0)
            };
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        attn_factor *= opt("attn_factor").unwrap_or(1.0);
        Ok(RopeScaling {
            kind,
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast: opt("yarn_beta_fast").unwrap_or(32.0),
            beta_slow: opt("yarn_beta_slow").unwrap_or(1.0),
            orig_ctx,
        })
    }

    /// YaRN's correction dims (`ggml_rope_yarn_corr_dims`).
    fn corr_dims(&self, n_dims: usize, base: f32) -> [f32; 2] {
        let dim = |n_rot: f32| {
            n_dims as f32 * (self.orig_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_dims as f32 - 1.0)]
    }
}

/// Which per-dimension frequency factors RoPE reads (each pair's angle divided by its
/// factor), as llama.cpp's `llama_model::get_rope_factors` chooses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeFactors {
    None,
    /// Llama 3's `rope_freqs.weight`, at every context.
    Freqs,
    /// LongRoPE (Phi-3, Phi-3.5, Phi-4-mini): `rope_factors_long.weight` when the served
    /// context of a sequence is longer than `orig_ctx` (the file's
    /// `rope.scaling.original_context_length`), else `rope_factors_short.weight`, for
    /// every position of every sequence: the choice follows the context the model is
    /// served with, not a prompt's length (llama.cpp: `n_ctx_seq > n_ctx_orig_yarn`;
    /// its context is rounded up to a multiple of 256 first, which decides the same
    /// for an original context that is one, as every Phi-3's 4,096 is).
    /// The attention factor (`rope.scaling.attn_factor`, which llama.cpp's converter
    /// sets to `sqrt(1 + ln(ctx / orig_ctx) / ln(orig_ctx))`) applies with either pair.
    LongShort {
        orig_ctx: usize,
    },
}

impl RopeFactors {
    /// The tensor to read for a model served with `served_ctx` positions per sequence.
    pub fn tensor(self, served_ctx: usize) -> Option<&'static str> {
        match self {
            RopeFactors::None => None,
            RopeFactors::Freqs => Some("rope_freqs.weight"),
            RopeFactors::LongShort { orig_ctx } if served_ctx > orig_ctx => {
                Some("rope_factors_long.weight")
            }
            RopeFactors::LongShort { .. } => Some("rope_factors_short.weight"),
        }
    }
}

pub struct Rope {
    style: RopeStyle,
    head_dim: usize,
    /// Rotated pairs per head (`rope.dimension_count / 2`); the dimensions past them
    /// pass through.
    half: usize,
    max_pos: usize,
    /// `[max_pos, half]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// Unscaled RoPE over the first `n_rot` of each head's `head_dim` dimensions.
    pub fn new(
        style: RopeStyle,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        max_pos: usize,
    ) -> Self {
        Self::scaled(
            style,
            head_dim,
            n_rot,
            theta,
            &RopeScaling::NONE,
            None,
            max_pos,
        )
    }

    /// The tables for `scaling`, rotating the first `n_rot` (even, at most `head_dim`)
    /// dimensions of each head, with each pair's base angle divided by its
    /// `freq_factors` entry where given (`n_rot / 2` values).
    pub fn scaled(
        style: RopeStyle,
        head_dim: usize,
        n_rot: usize,
        theta: f32,
        scaling: &RopeScaling,
        freq_factors: Option<&[f32]>,
        max_pos: usize,
    ) -> Self {
        assert!(
            n_rot.is_multiple_of(2) && n_rot <= head_dim,
            "n_rot {n_rot} of {head_dim}"
        );
        let half = n_rot / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        let corr = scaling.corr_dims(n_rot, theta);
        let s = scaling;
        // In f32, as llama.cpp's `ggml_rope_cache_init` computes it: each angle is the
        // previous one times theta^(-2/d), starting from the position (at long contexts
        // this differs from the exact angle by more than the tolerance of the tests).
        let theta_scale = theta.powf(-2.0 / n_rot as f32);
        for pos in 0..max_pos {
            let mut angle = pos as f32;
            for i in 0..half {
                let ff = freq_factors.map_or(1.0, |f| f[i]);
                let extrap = angle / ff;
                // `rope_yarn`.
                let interp = s.freq_scale * extrap;
                let (mut a, mut mscale) = (interp, s.attn_factor);
                if s.ext_factor != 0.0 {
                    let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                    let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * s.ext_factor;
                    a = interp * (1.0 - ramp_mix) + extrap * ramp_mix;
                    mscale *= 1.0 + 0.1 * (1.0 / s.freq_scale).ln();
                }
                cos.push(a.cos() * mscale);
                sin.push(a.sin() * mscale);
                angle *= theta_scale;
            }
        }
        Rope {
            style,
            head_dim,
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
        for head in x.chunks_exact_mut(self.head_dim) {
            let head = &mut head[..2 * half];
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Without scaling, the table is the plain angle pos * theta^(-2i/d).
    #[test]
    fn unscaled_angles_are_plain() {
        let r = Rope::new(RopeStyle::HalfSplit, 8, 8, 10_000.0, 4);
        let want = (3.0f32 * 10_000f32.powf(-2.0 / 8.0)).cos();
        assert!((r.cos[3 * 4 + 1] - want).abs() < 1e-6);
    }

    /// Frequency factors divide a pair's angle; YaRN with factor 1 changes nothing.
    #[test]
    fn freq_factors_divide_the_angle() {
        let ff = [1.0, 2.0, 4.0, 8.0];
        let plain = Rope::new(RopeStyle::HalfSplit, 8, 8, 10_000.0, 8);
        let r = Rope::scaled(
            RopeStyle::HalfSplit,
            8,
            8,
            10_000.0,
            &RopeScaling::NONE,
            Some(&ff),
            8,
        );
        for (i, f) in ff.iter().enumerate() {
            let want = (7.0f32 * 10_000f32.powf(-2.0 * i as f32 / 8.0) / f).sin();
            assert!((r.sin[7 * 4 + i] - want).abs() < 1e-5, "pair {i}");
        }
        assert_eq!(plain.sin[7 * 4], r.sin[7 * 4]);
    }

    /// YaRN: the fastest pairs extrapolate (unscaled angle), the slowest interpolate
    /// (angle times freq_scale), all scaled in magnitude by 1 + 0.1 ln(factor) times
    /// the attention factor.
    #[test]
    fn yarn_blends_extrapolation_and_interpolation() {
        let yarn = RopeScaling {
            kind: ScalingKind::Yarn,
            freq_scale: 0.25,
            ext_factor: 1.0,
            attn_factor: 1.0 / (1.0 + 0.1 * 4f32.ln()),
            orig_ctx: 256,
            ..RopeScaling::NONE
        };
        let d = 64;
        let r = Rope::scaled(RopeStyle::HalfSplit, d, d, 10_000.0, &yarn, None, 100);
        let pos = 99usize;
        let angle = |i: usize| pos as f32 * 10_000f32.powf(-2.0 * i as f32 / d as f32);
        let mag = |i: usize| (r.cos[pos * 32 + i].powi(2) + r.sin[pos * 32 + i].powi(2)).sqrt();
        assert!((mag(0) - 1.0).abs() < 1e-5);
        assert!((r.cos[pos * 32] - angle(0).cos()).abs() < 1e-3);
        assert!((r.cos[pos * 32 + 31] - (angle(31) * 0.25).cos()).abs() < 1e-4);
    }

    /// Partial rotary (Phi-4-mini: 96 of 128): the first `n_rot` dimensions of each head
    /// turn as a head of `n_rot` would (pairs `i`, `i + n_rot/2`), the rest pass through.
    #[test]
    fn partial_rotary_turns_the_first_dims_only() {
        let (d, n) = (8, 4);
        let part = Rope::new(RopeStyle::HalfSplit, d, n, 10_000.0, 4);
        let small = Rope::new(RopeStyle::HalfSplit, n, n, 10_000.0, 4);
        let x: Vec<f32> = (0..2 * d).map(|i| 1.0 + i as f32).collect();
        let mut a = x.clone();
        part.apply(&mut a, 3);
        for h in 0..2 {
            let mut b = x[h * d..h * d + n].to_vec();
            small.apply(&mut b, 3);
            assert_eq!(&a[h * d..h * d + n], &b[..]);
            assert_eq!(&a[h * d + n..(h + 1) * d], &x[h * d + n..(h + 1) * d]);
        }
    }

    /// LongRoPE's long factors are read exactly when the served context is past the
    /// original one; Llama 3's at every context.
    #[test]
    fn long_factors_follow_the_served_context() {
        let f = RopeFactors::LongShort { orig_ctx: 1024 };
        assert_eq!(f.tensor(1024), Some("rope_factors_short.weight"));
        assert_eq!(f.tensor(1025), Some("rope_factors_long.weight"));
        assert_eq!(RopeFactors::Freqs.tensor(8), Some("rope_freqs.weight"));
        assert_eq!(RopeFactors::None.tensor(1 << 20), None);
    }
}
