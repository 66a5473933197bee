//! `ModelConfig`: the hyper-parameters of a Llama-family model, read from the GGUF
//! metadata keys of its architecture (`llama.*`, `qwen2.*`, `qwen3.*`, `gemma3.*`),
//! with the per-architecture rules llama.cpp applies where the file says nothing.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3"];

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's "normal" mode, for `llama`
    /// GGUFs whose Q/K rows were permuted at conversion.
    Interleaved,
    /// Half-split pairs (x[i], x[i + d/2]): "neox" mode, for `qwen2`.
    HalfSplit,
}

/// The feed-forward's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (llama, qwen).
    Silu,
    /// GEGLU with the tanh GELU, computed as llama.cpp's CPU backend does (gemma3).
    GeluTanh,
}

/// Sliding-window attention on the local layers (gemma3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// Each local layer's token attends to the last `window` positions (itself included).
    pub window: usize,
    /// Every `pattern`-th layer (the last of each group) is global, the rest local.
    pub pattern: usize,
    /// The RoPE base of the local layers.
    pub rope_theta: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub name: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
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
    /// RoPE position scale of the global layers (`rope.scaling.factor` of linear scaling).
    pub rope_freq_scale: f32,
    pub sliding_window: Option<SlidingWindow>,
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f.get_str("general.architecture")?;
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(ModelError::UnsupportedArchitecture {
                path: f.path.clone(),
                arch,
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            });
        }
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
        let sliding_window = match f.get_usize(&k("attention.sliding_window")) {
            // llama.cpp: every sixth layer global, local layers on RoPE base 10000.
            Ok(window) if gemma3 && window > 0 => Some(SlidingWindow {
                window,
                pattern: 6,
                rope_theta: 10_000.0,
            }),
            _ => None,
        };
        let rope_freq_scale = match f.get_str(&k("rope.scaling.type")).as_deref() {
            Ok("linear") => match f.get_f32(&k("rope.scaling.factor")) {
                Ok(factor) if factor > 0.0 => 1.0 / factor,
                _ => 1.0,
            },
            _ => 1.0,
        };
        let c = ModelConfig {
            name: f.get_str("general.name").ok(),
            hidden_size,
            intermediate_size: f.get_usize(&k("feed_forward_length"))?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length: f.get_usize(&k("context_length")).unwrap_or(2048),
            rms_norm_eps: f.get_f32(&k("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            rope_style: if arch == "llama" {
                RopeStyle::Interleaved
            } else {
                RopeStyle::HalfSplit
            },
            qkv_bias: f.has_tensor("blk.0.attn_q.bias"),
            tied_embeddings: !f.has_tensor("output.weight"),
            qk_norm: arch == "qwen3" || gemma3,
            post_norms: gemma3,
            activation: if gemma3 {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            embed_scale: gemma3.then(|| (hidden_size as f32).sqrt()),
            attn_scale,
            rope_freq_scale,
            sliding_window,
            architecture: arch,
        };
        c.check_sizes()
            .map_err(|(key, reason)| bad(&format!("{}.{key}", c.architecture), reason))?;
        Ok(c)
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
            mul("feed_forward_length", &[h, self.intermediate_size, 3])?,
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

    /// Multiply-adds of the weight matrices per token (every layer and the output
    /// projection; attention over the context comes on top).
    pub fn matmul_macs_per_token(&self) -> usize {
        let (h, q, kv, f) = (
            self.hidden_size,
            self.q_size(),
            self.kv_size(),
            self.intermediate_size,
        );
        self.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * f) + self.vocab_size * h
    }

    /// Bytes of KV cache per token, all layers, keys and values, at `elem` bytes per value.
    pub fn kv_bytes_per_token(&self, elem: usize) -> usize {
        2 * self.num_layers * self.kv_size() * elem
    }
}
