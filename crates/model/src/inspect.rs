//! `inspect`: a human-readable summary of a GGUF model file: architecture, sizes,
//! tensor types, tokenizer, context length, special tokens, chat template, tool-call and reasoning formats, and whether
//! sloserve can serve it (if not, why, with the supported architectures, tokenizers
//! and tensor types); or the tokenizer exported as a Hugging Face tokenizer folder.

use std::collections::BTreeMap;
use std::fmt::Write;

use candle_core::quantized::gguf_file::Value;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::reasoning::ReasoningFormat;
use crate::requantize::WeightPlan;
use crate::rope::RopeFactors;
use crate::tokenizer::hf_export::HfTokenizer;
use crate::tokenizer::{Tokenizer, SUPPORTED_TOKENIZERS};
use crate::tool_format::ToolCallFormat;

/// The summary; a file sloserve cannot serve is described too, ending in
/// `supported: no` and the reasons.
pub fn inspect(file: &GgufFile) -> Result<String> {
    let mut problems = Vec::new();
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "file:            {}", file.path.display());
    let _ = writeln!(
        w,
        "name:            {}",
        file.get_str("general.name").unwrap_or_else(|_| "-".into())
    );
    match ModelConfig::from_gguf(file) {
        Ok(c) => describe_config(w, &c),
        Err(e) => {
            let arch = file.get_str("general.architecture");
            let _ = writeln!(w, "architecture:    {}", arch.as_deref().unwrap_or("-"));
            problems.push(e.to_string());
        }
    }
    describe_tensors(w, file);
    describe_tokenizer(w, file);
    if let Err(e) = Tokenizer::from_gguf(&file.content) {
        problems.push(e.to_string());
    }
    if let Err(e) = file.check_dtypes() {
        problems.push(e.to_string());
    }
    match file.get_str("tokenizer.chat_template") {
        Ok(t) => {
            let _ = writeln!(w, "chat template:\n{t}");
        }
        Err(_) => {
            let _ = writeln!(w, "chat template:   none (completions only)");
        }
    }
    let template = file.get_str("tokenizer.chat_template").ok();
    let family = file
        .get_str("general.architecture")
        .ok()
        .and_then(|a| crate::family::family(&a));
    let tools = ToolCallFormat::for_model(family, template.as_deref());
    let reasoning = ReasoningFormat::detect(template.as_deref().unwrap_or(""));
    let _ = writeln!(w, "tool calls:      {}", tools.name());
    let _ = writeln!(w, "reasoning:       {}", reasoning.name());
    if problems.is_empty() {
        let _ = writeln!(w, "supported:       yes");
    } else {
        let _ = writeln!(w, "supported:       no");
        for p in &problems {
            let _ = writeln!(w, "  - {p}");
        }
    }
    Ok(s)
}

/// Writes `file`'s tokenizer into `dir` as a Hugging Face tokenizer folder
/// (`tokenizer::hf_export`); returns what was written and where the export may encode
/// differently from sloserve.
pub fn export_tokenizer(file: &GgufFile, dir: &std::path::Path) -> Result<String> {
    let hf = HfTokenizer::from_gguf(file)?;
    let written = hf.write(dir)?;
    let mut s = String::new();
    let w = &mut s;
    for path in &written {
        let _ = writeln!(w, "wrote {}", path.display());
    }
    for note in &hf.notes {
        let _ = writeln!(w, "note: {note}");
    }
    Ok(s)
}

fn describe_config(w: &mut String, c: &ModelConfig) {
    let _ = writeln!(w, "architecture:    {}", c.architecture);
    let _ = match c.family.layout {
        crate::family::Layout::Decoder => writeln!(
            w,
            "family:          {}: a causal decoder (generation; pooling with --pooling)",
            c.family.arch
        ),
        crate::family::Layout::Encoder => writeln!(
            w,
            "family:          {}: a bidirectional encoder (serves /v1/embeddings, /v1/rerank and /score only)",
            c.family.arch
        ),
    };
    let _ = writeln!(w, "layers:          {}", c.num_layers);
    let _ = writeln!(w, "hidden size:     {}", c.hidden_size);
    let _ = writeln!(w, "ffn size:        {}", c.intermediate_size);
    let _ = writeln!(
        w,
        "heads:           {} query, {} key/value (head size {})",
        c.num_heads, c.num_kv_heads, c.head_dim
    );
    let _ = writeln!(w, "vocabulary:      {}", c.vocab_size);
    let _ = writeln!(w, "context length:  {}", c.context_length);
    if let Some(p) = c.pooling_type {
        let name = ["none", "mean", "cls", "last", "rank"].get(p as usize);
        let _ = writeln!(
            w,
            "pooling:         {} (the file's pooling_type {p})",
            name.unwrap_or(&"unknown")
        );
    }
    if c.family.layout == crate::family::Layout::Encoder {
        let _ = writeln!(
            w,
            "positions:       learned (position_embd), token type 0 added"
        );
        let _ = writeln!(w, "layer norm eps:  {}", c.rms_norm_eps);
        let _ = writeln!(w, "activation:      {:?} (ungated)", c.activation);
        let _ = writeln!(
            w,
            "KV per token:    none (no KV cache: each input runs whole)"
        );
        return;
    }
    let _ = writeln!(
        w,
        "rope:            theta {}, {:?} pairs",
        c.rope_theta, c.rope_style
    );
    let r = &c.rope_scaling;
    let _ = match r.kind {
        crate::rope::ScalingKind::None => writeln!(w, "rope scaling:    none"),
        _ if r.freq_scale == 1.0 && r.ext_factor == 0.0 => writeln!(w, "rope scaling:    none"),
        crate::rope::ScalingKind::Linear => {
            writeln!(w, "rope scaling:    linear, factor {}", 1.0 / r.freq_scale)
        }
        crate::rope::ScalingKind::Yarn => writeln!(
            w,
            "rope scaling:    yarn, factor {}, original context {}",
            1.0 / r.freq_scale,
            r.orig_ctx
        ),
    };
    if c.rope_dims != c.head_dim {
        let _ = writeln!(
            w,
            "rope dims:       {} of each head's {} (partial rotary)",
            c.rope_dims, c.head_dim
        );
    }
    let _ = match c.rope_factors {
        RopeFactors::None => Ok(()),
        RopeFactors::Freqs => writeln!(
            w,
            "rope freqs:      per-dimension factors (rope_freqs.weight, Llama 3)"
        ),
        RopeFactors::LongShort { orig_ctx } => writeln!(
            w,
            "rope freqs:      LongRoPE: rope_factors_long.weight when the served context is \
             over {orig_ctx} (by default the file's {}), else rope_factors_short.weight; \
             attention factor {}",
            c.context_length, r.attn_factor
        ),
    };
    if let Some(m) = c.moe {
        let _ = writeln!(
            w,
            "experts:         {} of {} per token, {} wide{}; {:?} router{}",
            m.used,
            m.experts,
            m.ffn,
            m.shared_ffn
                .map_or(String::new(), |s| format!(", shared expert {s} wide")),
            m.rules.gating,
            if m.rules.norm_weights {
                ", weights renormalised"
            } else {
                ""
            }
        );
    }
    if let Some(sw) = c.sliding_window {
        let _ = writeln!(
            w,
            "sliding window:  {} tokens on local layers (every {}th layer global), local rope theta {}{}",
            sw.window,
            sw.pattern,
            sw.rope_theta,
            if sw.rope_scaled { ", scaled" } else { "" }
        );
    }
    let _ = writeln!(w, "rms norm eps:    {}", c.rms_norm_eps);
    let _ = writeln!(w, "qkv bias:        {}", c.qkv_bias);
    let _ = writeln!(w, "q/k norm:        {}", c.qk_norm);
    let _ = writeln!(w, "activation:      {:?}", c.activation);
    let _ = writeln!(w, "tied output:     {}", c.tied_embeddings);
    let _ = writeln!(
        w,
        "KV per token:    {} bytes (f16, fast), {} bytes (f32, exact)",
        c.kv_bytes_per_token(2),
        c.kv_bytes_per_token(4)
    );
}

fn describe_tensors(w: &mut String, file: &GgufFile) {
    let mut mix: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut params = 0usize;
    for info in file.content.tensor_infos.values() {
        let n = info.shape.elem_count();
        params += n;
        let e = mix.entry(format!("{:?}", info.ggml_dtype)).or_default();
        e.0 += 1;
        e.1 += n;
    }
    for t in file.mxfp4.values() {
        let n: usize = t.dims.iter().product();
        params += n;
        let e = mix.entry("MXFP4".into()).or_default();
        e.0 += 1;
        e.1 += n;
    }
    let _ = writeln!(
        w,
        "parameters:      {:.1} M in {} tensors",
        params as f64 / 1e6,
        file.content.tensor_infos.len() + file.mxfp4.len()
    );
    for (dtype, (count, n)) in &mix {
        let _ = writeln!(
            w,
            "  {dtype:<6} {count:>4} tensors, {:>5.1}% of parameters",
            100.0 * *n as f64 / params.max(1) as f64
        );
    }
    let _ = writeln!(
        w,
        "weights:         {}",
        WeightPlan::new(&file.content, None).summary()
    );
    if let Some(ty) = file.quantize() {
        let _ = writeln!(
            w,
            "--quantize {ty:<5} {}",
            WeightPlan::new(&file.content, Some(ty)).summary()
        );
    }
}

fn describe_tokenizer(w: &mut String, file: &GgufFile) {
    let tokens: Vec<String> = match file.meta("tokenizer.ggml.tokens") {
        Some(Value::Array(v)) => v
            .iter()
            .map(|t| t.to_string().cloned().unwrap_or_default())
            .collect(),
        _ => Vec::new(),
    };
    let model = file
        .get_str("tokenizer.ggml.model")
        .unwrap_or_else(|_| "-".into());
    let kind = SUPPORTED_TOKENIZERS
        .iter()
        .find(|(m, _)| *m == model)
        .map_or("unsupported", |(_, kind)| kind);
    let _ = writeln!(
        w,
        "tokenizer:       {model} ({kind}, pre-tokenizer {}, {} tokens)",
        file.get_str("tokenizer.ggml.pre")
            .unwrap_or_else(|_| "-".into()),
        tokens.len()
    );
    for key in ["bos", "eos", "padding", "unknown"] {
        if let Ok(id) = file.get_usize(&format!("tokenizer.ggml.{key}_token_id")) {
            let _ = writeln!(
                w,
                "  {key:<8} token {id} {:?}",
                tokens.get(id).map(String::as_str).unwrap_or("?")
            );
        }
    }
}
