//! `Family`: what one GGUF architecture is, described once: a decoder or an encoder
//! (`Layout`), how its RoPE pairs
//! dimensions, its norms, activation, embedding scale, sliding-window pattern, where
//! its feed-forward's experts are and how tokens are routed to them. The decoder
//! (`crate::decoder`), the encoder (`crate::encoder`) and `ModelConfig` read these facts, the tool-call format
//! (`crate::tool_format`) starts from its default; adding an architecture is
//! one entry in `FAMILIES` plus its tests. llama.cpp's `src/models/*.cpp` is the
//! reference for each entry.

use crate::tool_format::ToolCallFormat;

/// What a model of the family is built as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A causal decoder (`crate::decoder`): pre-norm RMSNorm blocks, RoPE, a gated
    /// feed-forward, a KV cache; it generates (and pools).
    Decoder,
    /// A bidirectional encoder (`crate::encoder`, llama.cpp's `bert.cpp`): learned
    /// absolute positions (`position_embd`) and token type 0 (`token_types`) added to
    /// the token embedding, then LayerNorm (`token_embd_norm`); post-norm blocks
    /// (LayerNorm with a bias after each residual add: `attn_output_norm`,
    /// `layer_output_norm`), biases on q/k/v, the output and the feed-forward, whose
    /// activation is ungated (`ffn_up`, the activation, `ffn_down`); every position
    /// attends to every other; the norm epsilon is `attention.layer_norm_epsilon`.
    /// No KV cache and no output head: it only pools (embeddings, rerank, score),
    /// each prompt whole in one step.
    Encoder,
}

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
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (llama, qwen).
    Silu,
    /// The tanh GELU, computed as llama.cpp's CPU backend does: GEGLU in a decoder
    /// (gemma3), alone in an encoder's feed-forward (bert).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `g = min(gate, limit)` and
    /// `u = clamp(up, -limit, limit)`, `g · sigmoid(alpha · g) · (u + 1)`.
    SwigluOai { alpha: f32, limit: f32 },
}

/// How a router's logits become expert probabilities (`expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
    /// The top-k are chosen on the logits, and their weights are the softmax over
    /// the chosen logits only (llama.cpp's `SOFTMAX_WEIGHT`: gpt-oss).
    SoftmaxChosen,
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
    /// The router and every expert matrix carry biases (`ffn_gate_inp.bias`,
    /// `ffn_{gate,up,down}_exps.bias`: gpt-oss).
    pub biases: bool,
}

/// Sliding-window attention on the local layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingPattern {
    /// Every `every`-th layer (the last of each group) is global, the rest local
    /// (unless the file's `attention.sliding_window_pattern` says another period).
    pub every: usize,
    pub local_rope: LocalRope,
}

/// The RoPE of the local (sliding-window) layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalRope {
    /// Unscaled, on its own base (gemma3: 10000).
    Plain { theta: f32 },
    /// The global layers' scaling (YaRN), on `rope.freq_base_swa` where the file has
    /// it, else the global base (gpt-oss).
    Scaled,
}

/// One architecture, as `general.architecture` names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    pub arch: &'static str,
    pub layout: Layout,
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
    /// LongRoPE (Phi-3): per-dimension frequency factors `rope_factors_short.weight` and
    /// `rope_factors_long.weight` when present, one pair chosen for the served context
    /// (`crate::rope::RopeFactors`).
    pub long_rope: bool,
    /// `ffn_up` holds the gate's rows then the up projection's (`[2 * ffn, hidden]`),
    /// with no `ffn_gate` (phi3: llama.cpp's `ggml_swiglu` on the halves, gate first).
    pub ffn_up_holds_gate: bool,
    /// The attention's output projection has a bias (`attn_output.bias`: gpt-oss;
    /// q/k/v biases are read wherever the file has them).
    pub attn_output_bias: bool,
    /// A learned logit per head in each softmax's denominator (`attn_sinks`: gpt-oss).
    pub attn_sinks: bool,
    /// The norm before the feed-forward: `ffn_norm`, or `post_attention_norm` (gpt-oss
    /// names it so; it is not a post-norm there).
    pub ffn_norm: &'static str,
    pub ffn: FfnLayout,
    /// The tool-call format when the chat template shows none (`ToolCallFormat::for_model`).
    /// Formats of models that share an architecture come from their templates
    /// (`ToolCallFormat::detect`): the DeepSeek-R1 distills (`qwen2`, `llama` files) by
    /// `<｜tool▁calls▁begin｜>`, Phi-4-mini (`phi3`) by the `<|tool|>` its template offers
    /// tools in.
    pub tool_format: ToolCallFormat,
}

const MIXTRAL: ExpertRules = ExpertRules {
    norm_weights: true,
    gating: Gating::Softmax,
    shared_expert: false,
    expert_width_is_dense: true,
    biases: false,
};

const QWEN3_MOE: ExpertRules = ExpertRules {
    expert_width_is_dense: false,
    ..MIXTRAL
};

const DENSE: Family = Family {
    arch: "",
    layout: Layout::Decoder,
    rope_style: RopeStyle::HalfSplit,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    embed_scale_sqrt_hidden: false,
    sliding: None,
    rope_freqs: false,
    long_rope: false,
    ffn_up_holds_gate: false,
    attn_output_bias: false,
    attn_sinks: false,
    ffn_norm: "ffn_norm",
    ffn: FfnLayout::Dense,
    tool_format: ToolCallFormat::Hermes,
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
            local_rope: LocalRope::Plain { theta: 10_000.0 },
        }),
        ..DENSE
    },
    // llama.cpp's `openai-moe.cpp`: sliding-window and full layers alternate (the even
    // ones local), both on the file's YaRN; softmax over the chosen experts' biased
    // logits, no renormalisation; clamped SwiGLU with alpha 1.702 and limit 7.
    Family {
        arch: "gpt-oss",
        attn_output_bias: true,
        attn_sinks: true,
        ffn_norm: "post_attention_norm",
        activation: Activation::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        },
        tool_format: ToolCallFormat::Harmony,
        sliding: Some(SlidingPattern {
            every: 2,
            local_rope: LocalRope::Scaled,
        }),
        ffn: FfnLayout::Experts(ExpertRules {
            norm_weights: false,
            gating: Gating::SoftmaxChosen,
            biases: true,
            ..QWEN3_MOE
        }),
        ..DENSE
    },
    // llama.cpp's `phi3.cpp` (Phi-3, Phi-3.5, Phi-4-mini): q/k/v fused in `attn_qkv` (read
    // for any family whose file has it), gate and up stacked in `ffn_up`, LongRoPE factors;
    // its `attention.sliding_window` is ignored, as llama.cpp does ("Phi SWA is currently
    // disabled"): every layer attends to the whole context; no output bias (llama.cpp's
    // phi3 reads none); `output.weight` or, absent (Phi-4-mini), the embedding.
    Family {
        arch: "phi3",
        long_rope: true,
        ffn_up_holds_gate: true,
        ..DENSE
    },
    // llama.cpp's `bert.cpp` (BERT, MiniLM, BGE): an encoder (`Layout::Encoder`) with
    // the tanh GELU (ggml's `ggml_gelu`; Hugging Face's is erf's, within the bar).
    Family {
        arch: "bert",
        layout: Layout::Encoder,
        activation: Activation::GeluTanh,
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
        assert!(family("phi3").is_some_and(|f| f.long_rope && f.sliding.is_none()));
        assert!(supported_list().contains("qwen3moe"));
        assert!(supported_list().contains("gpt-oss"));
        let encoders: Vec<_> = FAMILIES
            .iter()
            .filter(|f| f.layout == Layout::Encoder)
            .map(|f| f.arch)
            .collect();
        assert_eq!(encoders, ["bert"]);
    }
}
