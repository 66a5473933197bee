//! sloserve's model core: GGUF loading, tokenizer, chat template, and the Llama /
//! Qwen2 forward pass over a paged KV cache (the candle `ModelRunner`).

pub mod chat_template;
pub mod detokenizer;
pub mod error;
pub mod tokenizer;

pub use error::{ModelError, Result};
