//! `LoadedModel`: everything one GGUF file provides (config, tokenizer, chat
//! template, runner), loaded from a single open of the file.

use std::path::Path;

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::Result;
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
