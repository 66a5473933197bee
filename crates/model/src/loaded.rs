//! `LoadedModel`: everything one GGUF file provides (config, tokenizer, chat
//! template, runner), loaded from a single open of the file; `Runner`: the
//! decoder's runner or the encoder's, as the family's `Layout` says.

use std::path::Path;

use sloserve_engine::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::encoder::EncoderRunner;
use crate::error::{ModelError, Result};
use crate::family::Layout;
use crate::gguf::GgufFile;
use crate::runner::{LlamaRunner, RunnerOptions};
use crate::tokenizer::Tokenizer;

pub struct LoadedModel {
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub runner: Runner,
}

/// The runner of a loaded model: a decoder's (KV cache, generation and pooling)
/// or an encoder's (pooling only).
pub enum Runner {
    Decoder(Box<LlamaRunner>),
    Encoder(Box<EncoderRunner>),
}

impl Runner {
    /// The runner `opts` loads for the file's family.
    pub fn from_gguf(file: &mut GgufFile, opts: &RunnerOptions) -> Result<Self> {
        match ModelConfig::from_gguf(file)?.family.layout {
            Layout::Decoder => Ok(Runner::Decoder(Box::new(LlamaRunner::from_gguf(
                file, opts,
            )?))),
            Layout::Encoder => Ok(Runner::Encoder(Box::new(EncoderRunner::from_gguf(
                file, opts,
            )?))),
        }
    }

    /// The model's config (with the command line's overrides).
    pub fn config(&self) -> &ModelConfig {
        match self {
            Runner::Decoder(r) => &r.model().config,
            Runner::Encoder(r) => &r.model().config,
        }
    }

    fn inner(&self) -> &dyn ModelRunner {
        match self {
            Runner::Decoder(r) => r.as_ref(),
            Runner::Encoder(r) => r.as_ref(),
        }
    }

    fn inner_mut(&mut self) -> &mut dyn ModelRunner {
        match self {
            Runner::Decoder(r) => r.as_mut(),
            Runner::Encoder(r) => r.as_mut(),
        }
    }
}

impl ModelRunner for Runner {
    fn info(&self) -> &RunnerInfo {
        self.inner().info()
    }

    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> std::result::Result<(), RunnerError> {
        self.inner_mut().execute(batch, out)
    }

    fn reset(&mut self) -> std::result::Result<(), RunnerError> {
        self.inner_mut().reset()
    }

    fn kv_identity(&self) -> Option<u64> {
        self.inner().kv_identity()
    }

    fn kv_block_bytes(&self) -> usize {
        self.inner().kv_block_bytes()
    }

    fn read_kv_block(&self, block: u32, out: &mut [u8]) -> std::result::Result<(), RunnerError> {
        self.inner().read_kv_block(block, out)
    }

    fn write_kv_block(&mut self, block: u32, data: &[u8]) -> std::result::Result<(), RunnerError> {
        self.inner_mut().write_kv_block(block, data)
    }
}

impl LoadedModel {
    pub fn load(path: impl AsRef<Path>, opts: &RunnerOptions) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file.content)?;
        // A token id past the embedding's rows would index outside it.
        let rows = ModelConfig::from_gguf(&file)?.vocab_size;
        if tokenizer.vocab_size() > rows {
            return Err(ModelError::BadTensor {
                path: file.path.clone(),
                tensor: "token_embd.weight".into(),
                reason: format!(
                    "the tokenizer has {} tokens but the embedding only {rows} rows; the file's tokenizer and weights do not belong together",
                    tokenizer.vocab_size()
                ),
            });
        }
        let chat_template = ChatTemplate::from_gguf(&file.content, &tokenizer)?;
        let runner = Runner::from_gguf(&mut file, opts)?;
        Ok(LoadedModel {
            config: runner.config().clone(),
            tokenizer,
            chat_template,
            runner,
        })
    }
}
