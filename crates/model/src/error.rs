//! `ModelError`: every way loading or running a model can fail, each naming the file
//! or the thing at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: cannot open model file: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file ({kind}); a model is a GGUF file")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("{path}: not a valid GGUF file: {reason}")]
    NotGguf { path: PathBuf, reason: String },
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    #[error("{path}: tensor '{tensor}' has unsupported type {dtype} (supported: {supported})")]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        dtype: String,
        supported: String,
    },
    #[error("{path}: missing metadata key '{key}'")]
    MissingMetadata { path: PathBuf, key: String },
    #[error("{path}: bad metadata key '{key}': {reason}")]
    BadMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{path}: missing tensor '{tensor}'")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor '{tensor}': {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error(
        "{path}: does not fit in memory: the weights need about {weights_mb} MB ({precision}) and the KV cache {kv}, but the machine has {available_mb} MB available; lower --kv-cache-memory (at most about {fit_mb} MB would fit) or free memory"
    )]
    DoesNotFit {
        path: PathBuf,
        precision: String,
        weights_mb: u64,
        /// "asked for N MB", or the default rule's floor.
        kv: String,
        available_mb: u64,
        fit_mb: u64,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("{0}")]
    Runtime(String),
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Runtime(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;
