//! `LoadedModel`: everything one GGUF file provides (config, tokenizer, chat
//! template, runner), loaded from a single open of the file.

use std::path::Path;

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::runner::{LlamaRunner, RunnerOptions};
use crate::tokenizer::Tokenizer;

pub struct LoadedModel {
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub runner: LlamaRunner,
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
        let runner = LlamaRunner::from_gguf(&mut file, opts)?;
        Ok(LoadedModel {
            config: runner.model().config.clone(),
            tokenizer,
            chat_template,
            runner,
        })
    }
}
