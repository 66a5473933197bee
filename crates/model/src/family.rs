//! `Family`: what one GGUF architecture is, described once: how its RoPE pairs
//! dimensions, its norms, activation, embedding scale, sliding-window pattern, where
//! its feed-forward's experts are and how tokens are routed to them. The decoder
//! (`crate::decoder`) and `ModelConfig` read these facts; adding an architecture is
//! one entry in `FAMILIES` plus its tests. llama.cpp's `src/models/*.cpp` is the
//! reference for each entry.

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's "normal" mode, for `llama`
    /// GGUFs whose Q/K rows were permuted at conversion.
    Interleaved,
    /// Half-split pairs (x[i], x[i + d/2]): "neox" mode, for `qwen2` and the rest.
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

/// How a router's logits become expert probabilities (`expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// Where a family's feed-forward weights are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnLayout {
    /// `ffn_gate`, `ffn_up`, `ffn_down` in every layer.
    Dense,
    /// Dense, unless the file has `{arch}.expert_count` > 0: then `ffn_gate_inp` and
    /// `ffn_{gate,up,down}_exps` (Mixtral-style `llama`).
    DenseOrExperts(ExpertRules),
    /// Always experts (`qwen2moe`, `qwen3moe`).
    Experts(ExpertRules),
}

/// How a family routes each token to its experts, as llama.cpp's graph for it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRules {
    /// The router's probabilities of the chosen experts are divided by their sum
    /// (Mixtral and Qwen3-MoE yes, Qwen2-MoE no).
    pub norm_weights: bool,
    pub gating: Gating,
    /// A shared expert beside the routed ones (`ffn_{gate,up,down}_shexp`), scaled by
    /// `sigmoid(ffn_gate_inp_shexp · x)` (Qwen2-MoE).
    pub shared_expert: bool,
    /// Without `expert_feed_forward_length`, each expert is `feed_forward_length` wide
    /// (Mixtral), else that width split over the used experts (the Qwen MoEs).
    pub expert_width_is_dense: bool,
}

/// Sliding-window attention on the local layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingPattern {
    /// Every `every`-th layer (the last of each group) is global, the rest local.
    pub every: usize,
    /// The RoPE base of the local layers.
    pub local_rope_theta: f32,
}

/// One architecture, as `general.architecture` names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    pub arch: &'static str,
    pub rope_style: RopeStyle,
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and MLP outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    pub activation: Activation,
    /// Token embeddings are multiplied by sqrt(hidden size).
    pub embed_scale_sqrt_hidden: bool,
    /// With `attention.sliding_window` in the file: which layers are local.
    pub sliding: Option<SlidingPattern>,
    /// Reads Llama 3's RoPE frequency factors (`rope_freqs.weight`) when present.
    pub rope_freqs: bool,
    pub ffn: FfnLayout,
}

const MIXTRAL: ExpertRules = ExpertRules {
    norm_weights: true,
    gating: Gating::Softmax,
    shared_expert: false,
    expert_width_is_dense: true,
};

const QWEN3_MOE: ExpertRules = ExpertRules {
    expert_width_is_dense: false,
    ..MIXTRAL
};

const DENSE: Family = Family {
    arch: "",
    rope_style: RopeStyle::HalfSplit,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    embed_scale_sqrt_hidden: false,
    sliding: None,
    rope_freqs: false,
    ffn: FfnLayout::Dense,
};

/// Every architecture sloserve runs.
pub const FAMILIES: &[Family] = &[
    Family {
        arch: "llama",
        rope_style: RopeStyle::Interleaved,
        rope_freqs: true,
        ffn: FfnLayout::DenseOrExperts(MIXTRAL),
        ..DENSE
    },
    Family {
        arch: "qwen2",
        ..DENSE
    },
    Family {
        arch: "qwen3",
        qk_norm: true,
        ..DENSE
    },
    Family {
        arch: "qwen2moe",
        ffn: FfnLayout::Experts(ExpertRules {
            norm_weights: false,
            shared_expert: true,
            ..QWEN3_MOE
        }),
        ..DENSE
    },
    Family {
        arch: "qwen3moe",
        qk_norm: true,
        ffn: FfnLayout::Experts(QWEN3_MOE),
        ..DENSE
    },
    Family {
        arch: "gemma3",
        qk_norm: true,
        post_norms: true,
        activation: Activation::GeluTanh,
        embed_scale_sqrt_hidden: true,
        // llama.cpp: every sixth layer global, local layers on RoPE base 10000.
        sliding: Some(SlidingPattern {
            every: 6,
            local_rope_theta: 10_000.0,
        }),
        ..DENSE
    },
];

/// The family of `arch`, if sloserve runs it.
pub fn family(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.arch == arch)
}

/// The architectures sloserve runs, comma-separated (for error messages).
pub fn supported_list() -> String {
    FAMILIES
        .iter()
        .map(|f| f.arch)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_its_name_once() {
        for f in FAMILIES {
            assert_eq!(family(f.arch), Some(f));
            assert_eq!(FAMILIES.iter().filter(|g| g.arch == f.arch).count(), 1);
        }
        assert_eq!(family("phi2"), None);
        assert!(supported_list().contains("qwen3moe"));
    }
}
