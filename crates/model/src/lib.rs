//! sloserve's model core: GGUF loading, tokenizer, chat template, the decoder
//! forward pass over a paged KV cache on the CPU (`LlamaRunner`, the
//! `ModelRunner`), the encoder's (`EncoderRunner`: bert, pooling only), with
//! their hand-written kernels in `kernels`.

pub mod chat_message;
pub mod chat_prompt;
pub mod chat_template;
pub mod chat_tools;
pub mod config;
pub mod decoder;
pub mod detokenizer;
pub mod encoder;
pub mod error;
pub mod family;
pub mod generate;
pub mod gguf;
pub mod gguf_header;
pub mod harmony;
pub mod inspect;
pub mod kernels;
pub mod kv_cache;
pub mod kv_quant;
pub mod linear;
pub mod loaded;
pub mod memory_plan;
pub mod mxfp4;
pub mod reasoning;
pub mod requantize;
pub mod rope;
pub mod runner;
pub mod tokenizer;
pub mod tool_format;
pub mod weights;

/// The default model file, relative to the repository root (`make model` fetches it).
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Sizes the compute pool the kernels run on to `threads` workers (`None` or 0:
/// one per core). Call before loading a model; a pool that was already built
/// (e.g. by an earlier call in the same process) is kept, with a warning.
pub fn set_compute_threads(threads: Option<usize>) {
    let Some(n) = threads.filter(|&n| n > 0) else {
        return;
    };
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("sloserve-compute-{i}"))
        .build_global()
    {
        tracing::warn!(threads = n, error = %e, "compute pool already built; --threads ignored");
    }
}

pub use config::ModelConfig;
pub use encoder::EncoderRunner;
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use loaded::{LoadedModel, Runner};
pub use requantize::WeightType;
pub use runner::{LlamaRunner, RunnerOptions};
pub use weights::Precision;
