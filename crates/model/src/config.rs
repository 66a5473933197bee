//! `ModelConfig`: the hyper-parameters of a decoder model, read from the GGUF metadata
//! keys of its architecture (`llama.*`, `qwen3moe.*`, ...), with what its `Family`
//! says the file does not (norms, activation, RoPE pairing, expert routing).

use crate::error::{ModelError, Result};
use crate::family::{self, ExpertRules, Family, FfnLayout, Layout, LocalRope};
use crate::gguf::GgufFile;
use crate::rope::{RopeFactors, RopeOverride, RopeScaling};

pub use crate::family::{Activation, RopeStyle};

/// Sliding-window attention on the local layers (gemma3, gpt-oss).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// Each local layer's token attends to the last `window` positions (itself included).
    pub window: usize,
    /// Every `pattern`-th layer (the last of each group) is global, the rest local.
    pub pattern: usize,
    /// The RoPE base of the local layers.
    pub rope_theta: f32,
    /// The local layers' RoPE has the global layers' scaling (YaRN: gpt-oss), else none.
    pub rope_scaled: bool,
}

/// A mixture-of-experts feed-forward: its sizes from `{arch}.expert_*`, its routing
/// from the family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token runs (top-k).
    pub used: usize,
    /// Each expert's feed-forward width.
    pub ffn: usize,
    /// The shared expert's width (Qwen2-MoE).
    pub shared_ffn: Option<usize>,
    pub rules: ExpertRules,
    /// The chosen experts' weights are multiplied by this (`expert_weights_scale`; 1 if unset).
    pub weights_scale: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    /// What the architecture is (`crate::family`).
    pub family: &'static Family,
    pub name: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    /// The norms' epsilon: RMSNorm's in a decoder, LayerNorm's in an encoder.
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    /// Dimensions of each head that RoPE turns (`rope.dimension_count`; the head size
    /// unless the file says fewer: Phi-4-mini 96 of 128).
    pub rope_dims: usize,
    /// The per-dimension frequency factors RoPE reads (Llama 3, LongRoPE).
    pub rope_factors: RopeFactors,
    /// q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// The output projection reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`: qwen3, gemma3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and MLP outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`: gemma3).
    pub post_norms: bool,
    pub activation: Activation,
    /// Token embeddings are multiplied by this (gemma3: sqrt(hidden)).
    pub embed_scale: Option<f32>,
    /// Attention scores are multiplied by this (default 1/sqrt(head_dim)).
    pub attn_scale: f32,
    /// RoPE scaling of the global layers (linear, YaRN; the file's or the command line's).
    pub rope_scaling: RopeScaling,
    pub sliding_window: Option<SlidingWindow>,
    /// The feed-forward's experts, when it has them.
    pub moe: Option<MoeConfig>,
    /// `{arch}.pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 CLS, 3 last,
    /// 4 rank), when the file says: how an embedding is pooled.
    pub pooling_type: Option<u32>,
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        Self::from_gguf_with(f, &RopeOverride::default())
    }

    /// `from_gguf`, with the command line's RoPE scaling over the file's.
    pub fn from_gguf_with(f: &GgufFile, rope: &RopeOverride) -> Result<Self> {
        let arch = f.get_str("general.architecture")?;
        let fam = family::family(&arch).ok_or_else(|| ModelError::UnsupportedArchitecture {
            path: f.path.clone(),
            arch: arch.clone(),
            supported: family::supported_list(),
        })?;
        let k = |name: &str| format!("{arch}.{name}");
        let hidden_size = f.get_usize(&k("embedding_length"))?;
        let num_heads = f.get_usize(&k("attention.head_count"))?;
        let num_kv_heads = match f.get_usize(&k("attention.head_count_kv")) {
            Ok(n) => n,
            Err(ModelError::MissingMetadata { .. }) => num_heads,
            Err(e) => return Err(e),
        };
        let bad = |key: &str, reason: String| ModelError::BadMetadata {
            path: f.path.clone(),
            key: key.to_string(),
            reason,
        };
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(bad(
                &k("attention.head_count_kv"),
                format!("{num_heads} heads cannot be grouped over {num_kv_heads} KV heads"),
            ));
        }
        let head_dim = match f.get_usize(&k("attention.key_length")) {
            Ok(n) => n,
            Err(_) => hidden_size / num_heads,
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(
                &k("attention.key_length"),
                format!("head size {head_dim} must be even"),
            ));
        }
        let rope_dims = match f.get_usize(&k("rope.dimension_count")) {
            Ok(n) => n,
            Err(ModelError::MissingMetadata { .. }) => head_dim,
            Err(e) => return Err(e),
        };
        if rope_dims == 0 || !rope_dims.is_multiple_of(2) || rope_dims > head_dim {
            return Err(bad(
                &k("rope.dimension_count"),
                format!("{rope_dims} rotated dimensions: must be even, from 2 to the head size {head_dim}"),
            ));
        }
        let vocab_size = match f.tensor_info("token_embd.weight") {
            Some(info) if info.shape.elem_count() > 0 => info.shape.dims()[0],
            Some(info) => {
                return Err(ModelError::BadTensor {
                    path: f.path.clone(),
                    tensor: "token_embd.weight".into(),
                    reason: format!("zero-sized embedding {:?}", info.shape.dims()),
                })
            }
            None => {
                return Err(ModelError::MissingTensor {
                    path: f.path.clone(),
                    tensor: "token_embd.weight".into(),
                })
            }
        };
        let rope_theta = f.get_f32(&k("rope.freq_base")).unwrap_or(10_000.0);
        let num_layers = f.get_usize(&k("block_count"))?;
        let gemma3 = arch == "gemma3";
        let attn_scale = match f.get_f32(&k("attention.scale")) {
            Ok(s) => s,
            // llama.cpp: Gemma 3 27B (62 layers) scales by hidden / heads, the others by head size.
            Err(_) if gemma3 && num_layers == 62 => 1.0 / ((hidden_size / num_heads) as f32).sqrt(),
            Err(_) => 1.0 / (head_dim as f32).sqrt(),
        };
        let sliding_window = match (fam.sliding, f.get_usize(&k("attention.sliding_window"))) {
            (Some(p), Ok(window)) if window > 0 => {
                let key = k("attention.sliding_window_pattern");
                let pattern = match f.get_usize(&key) {
                    Ok(0) => return Err(bad(&key, "a period of 0 layers".into())),
                    Ok(n) => n,
                    Err(ModelError::MissingMetadata { .. }) => p.every,
                    Err(e) => return Err(e),
                };
                let (rope_theta, rope_scaled) = match p.local_rope {
                    LocalRope::Plain { theta } => (theta, false),
                    LocalRope::Scaled => (
                        f.get_f32(&k("rope.freq_base_swa")).unwrap_or(rope_theta),
                        true,
                    ),
                };
                Some(SlidingWindow {
                    window,
                    pattern,
                    rope_theta,
                    rope_scaled,
                })
            }
            _ => None,
        };
        let context_length = f.get_usize(&k("context_length")).unwrap_or(2048);
        let rope_factors = if fam.rope_freqs && f.has_tensor("rope_freqs.weight") {
            RopeFactors::Freqs
        } else if fam.long_rope
            && (f.has_tensor("rope_factors_long.weight")
                || f.has_tensor("rope_factors_short.weight"))
        {
            // llama.cpp's `hparams.n_ctx_orig_yarn`: the file's, not `--yarn-orig-ctx`.
            RopeFactors::LongShort {
                orig_ctx: f
                    .get_usize(&k("rope.scaling.original_context_length"))
                    .unwrap_or(context_length),
            }
        } else {
            RopeFactors::None
        };
        let moe = Self::read_moe(f, fam, &arch)?;
        let intermediate_size = match (moe, f.get_usize(&k("feed_forward_length"))) {
            (_, Ok(n)) => n,
            (Some(_), Err(_)) => 0,
            (None, Err(e)) => return Err(e),
        };
        let c = ModelConfig {
            name: f.get_str("general.name").ok(),
            family: fam,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length,
            rms_norm_eps: match fam.layout {
                Layout::Decoder => f.get_f32(&k("attention.layer_norm_rms_epsilon"))?,
                Layout::Encoder => f.get_f32(&k("attention.layer_norm_epsilon"))?,
            },
            rope_theta,
            rope_style: fam.rope_style,
            rope_dims,
            rope_factors,
            qkv_bias: f.has_tensor("blk.0.attn_q.bias") || f.has_tensor("blk.0.attn_qkv.bias"),
            tied_embeddings: !f.has_tensor("output.weight"),
            qk_norm: fam.qk_norm,
            post_norms: fam.post_norms,
            activation: fam.activation,
            embed_scale: fam
                .embed_scale_sqrt_hidden
                .then(|| (hidden_size as f32).sqrt()),
            attn_scale,
            rope_scaling: RopeScaling::from_gguf(f, &arch, context_length, rope)?,
            sliding_window,
            moe,
            pooling_type: f.get_usize(&k("pooling_type")).ok().map(|p| p as u32),
            architecture: arch,
        };
        c.check_sizes()
            .map_err(|(key, reason)| bad(&format!("{}.{key}", c.architecture), reason))?;
        Ok(c)
    }

    /// The experts, where the family has them (or may, and the file says so).
    fn read_moe(f: &GgufFile, fam: &Family, arch: &str) -> Result<Option<MoeConfig>> {
        let k = |name: &str| format!("{arch}.{name}");
        let experts = f.get_usize(&k("expert_count")).unwrap_or(0);
        let rules = match fam.ffn {
            FfnLayout::Dense => return Ok(None),
            FfnLayout::DenseOrExperts(_) if experts == 0 => return Ok(None),
            FfnLayout::DenseOrExperts(r) | FfnLayout::Experts(r) => r,
        };
        let bad = |key: &str, reason: String| ModelError::BadMetadata {
            path: f.path.clone(),
            key: k(key),
            reason,
        };
        let used = f.get_usize(&k("expert_used_count"))?;
        if experts == 0 || used == 0 || used > experts {
            return Err(bad(
                "expert_used_count",
                format!("{used} experts used of {experts}: need 1 <= used <= count"),
            ));
        }
        let most = crate::decoder::MAX_EXPERTS_USED;
        if rules.gating == family::Gating::SoftmaxChosen && used > most {
            return Err(bad(
                "expert_used_count",
                format!("{used} experts used: this family's routing takes at most {most}"),
            ));
        }
        // llama.cpp: without the expert width, the dense width (llama) or that width
        // split over the used experts (the Qwen MoEs).
        let ffn = match f.get_usize(&k("expert_feed_forward_length")) {
            Ok(n) => n,
            Err(_) if rules.expert_width_is_dense => f.get_usize(&k("feed_forward_length"))?,
            Err(_) => f.get_usize(&k("feed_forward_length"))? / used,
        };
        // llama.cpp: the shared expert is as wide as the dense width unless the file says.
        let shared_ffn = match rules.shared_expert {
            true => Some(
                f.get_usize(&k("expert_shared_feed_forward_length"))
                    .or_else(|_| f.get_usize(&k("feed_forward_length")))?,
            ),
            false => None,
        };
        let weights_scale = f
            .get_f32(&k("expert_weights_scale"))
            .ok()
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0);
        Ok(Some(MoeConfig {
            experts,
            used,
            ffn,
            shared_ffn,
            rules,
            weights_scale,
        }))
    }

    /// The products the loader and the forward pass compute (tensor shapes, KV bytes
    /// per token, multiply-adds per token) must not overflow: a hostile file could
    /// otherwise wrap them. Errors name the metadata key (without the arch prefix).
    fn check_sizes(&self) -> std::result::Result<(), (&'static str, String)> {
        let mul = |key: &'static str, xs: &[usize]| {
            xs.iter()
                .try_fold(1usize, |a, &x| a.checked_mul(x))
                .ok_or_else(|| (key, format!("the product {xs:?} overflows")))
        };
        if self.hidden_size == 0 {
            return Err(("embedding_length", "must not be 0".into()));
        }
        let q = mul("attention.head_count", &[self.num_heads, self.head_dim])?;
        let kv = mul(
            "attention.head_count_kv",
            &[self.num_kv_heads, self.head_dim],
        )?;
        mul("block_count", &[2, self.num_layers, kv, 4])?;
        let h = self.hidden_size;
        let per_layer = [
            mul("attention.head_count", &[h, q, 2])?,
            mul("attention.head_count_kv", &[h, kv, 2])?,
            mul("feed_forward_length", &[h, self.ffn_width_stored(), 3])?,
        ];
        let layer = per_layer
            .iter()
            .try_fold(0usize, |a, &x| a.checked_add(x))
            .ok_or((
                "feed_forward_length",
                "the per-layer size overflows".to_string(),
            ))?;
        mul("block_count", &[self.num_layers, layer])?
            .checked_add(mul("embedding_length", &[self.vocab_size, h])?)
            .ok_or(("block_count", "the per-token size overflows".to_string()))?;
        Ok(())
    }

    /// Whether `layer` attends over a sliding window (and which).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let sw = self.sliding_window?;
        (layer % sw.pattern < sw.pattern - 1).then_some(sw.window)
    }

    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The feed-forward widths a layer stores, summed: every expert's (and the shared
    /// one's) with experts, else the dense width.
    fn ffn_width_stored(&self) -> usize {
        match self.moe {
            None => self.intermediate_size,
            Some(m) => m
                .experts
                .saturating_mul(m.ffn)
                .saturating_add(m.shared_ffn.unwrap_or(0)),
        }
    }

    /// The feed-forward width one token runs through: the used experts' (and the
    /// shared one's) with experts, else the dense width.
    pub fn ffn_width_active(&self) -> usize {
        match self.moe {
            None => self.intermediate_size,
            Some(m) => m.used * m.ffn + m.shared_ffn.unwrap_or(0),
        }
    }

    /// Multiply-adds of the weight matrices per token (every layer and the output
    /// projection, which an encoder has not; attention over the context comes on
    /// top). With experts, only the ones a token runs (and the router); an
    /// encoder's feed-forward has two matrices, not three.
    pub fn matmul_macs_per_token(&self) -> usize {
        let (h, q, kv, f) = (
            self.hidden_size,
            self.q_size(),
            self.kv_size(),
            self.ffn_width_active(),
        );
        let router = self.moe.map_or(0, |m| h * m.experts);
        let (ffn_mats, output) = match self.family.layout {
            Layout::Decoder => (3, self.vocab_size * h),
            Layout::Encoder => (2, 0),
        };
        self.num_layers * (h * q + 2 * h * kv + q * h + ffn_mats * h * f + router) + output
    }

    /// Bytes of KV cache per token, all layers, keys and values, at `elem` bytes per value.
    pub fn kv_bytes_per_token(&self, elem: usize) -> usize {
        2 * self.num_layers * self.kv_size() * elem
    }

    /// Bytes of KV cache per token, all layers, keys and values, held as `dtype`.
    pub fn kv_bytes_per_token_as(&self, dtype: crate::kv_cache::KvDtype) -> usize {
        2 * self.num_layers * dtype.row_bytes(self.kv_size())
    }
}
