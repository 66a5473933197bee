//! sloserve's model core: GGUF loading, tokenizer, chat template, and the Llama /
//! Qwen2 forward pass over a paged KV cache on the CPU (`LlamaRunner`, the
//! `ModelRunner`), with its hand-written kernels in `kernels`.

pub mod chat_template;
pub mod config;
pub mod detokenizer;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod inspect;
pub mod kernels;
pub mod kv_cache;
pub mod llama;
pub mod loaded;
pub mod rope;
pub mod runner;
pub mod tokenizer;
pub mod weights;

/// The default model file, relative to the repository root (`make model` fetches it).
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

pub use config::ModelConfig;
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use loaded::LoadedModel;
pub use runner::{LlamaRunner, RunnerOptions};
pub use weights::Precision;
