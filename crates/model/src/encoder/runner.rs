//! `EncoderRunner`: the `ModelRunner` of an encoder (`crate::encoder::Encoder`) on
//! CPU. It tells the engine it is one (`RunnerInfo::encoder`: pooled requests
//! only, each prompt whole in one step) and holds no KV cache: its block pool is
//! bookkeeping only (`kv_bytes_per_token` 0), as large as any step can use.

use sloserve_engine::{Batch, Logits, ModelRunner, RunnerError, RunnerInfo};

use super::{Encoder, EncoderScratch};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::runner::RunnerOptions;

/// Blocks of the engine's (memory-less) pool: room for every sequence the
/// engine can run at once at the longest context.
const BLOCKS: usize = 1 << 16;

pub struct EncoderRunner {
    model: Encoder,
    scratch: EncoderScratch,
    info: RunnerInfo,
}

impl EncoderRunner {
    pub fn from_gguf(file: &mut GgufFile, opts: &RunnerOptions) -> Result<Self> {
        let c = ModelConfig::from_gguf_with(file, &opts.rope)?;
        file.set_quantize(opts.quantize);
        let model = Encoder::load(file, c.clone(), opts.precision)?;
        let max_model_len = opts
            .max_model_len
            .map_or(c.context_length, |m| m.min(c.context_length))
            .min(model.max_positions());
        let held = model.held_bytes();
        let mb = |b: usize| format!("{:.1} MB", b as f64 / 1e6);
        tracing::info!(
            half = %mb(held.half),
            f32 = %mb(held.f32),
            total = %mb(held.total()),
            max_model_len,
            "encoder weights held (no KV cache: pooled requests only, each prompt in one step)"
        );
        let info = RunnerInfo {
            block_size: opts.block_size.max(1),
            num_kv_blocks: BLOCKS,
            vocab_size: c.vocab_size,
            max_model_len,
            kv_bytes_per_token: 0,
            small_batch_max_tokens: 0,
            experts: None,
            encoder: true,
        };
        Ok(EncoderRunner {
            model,
            scratch: EncoderScratch::default(),
            info,
        })
    }

    /// The model.
    pub fn model(&self) -> &Encoder {
        &self.model
    }

    /// Rejects a batch an encoder cannot run: a sequence that is not a whole
    /// pooled prompt from position 0, past the context, or a token outside the
    /// vocabulary.
    pub fn validate(&self, batch: &Batch) -> std::result::Result<(), RunnerError> {
        let err = |m: String| Err(RunnerError(m));
        if batch.seqs.iter().map(|s| s.num_tokens).sum::<usize>() != batch.tokens.len() {
            return err("batch: sequence token counts do not add up to the batch".into());
        }
        let mut next = 0;
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.token_start != next || s.num_tokens == 0 {
                return err(format!("batch: sequence {i} has a bad token range"));
            }
            next += s.num_tokens;
            if !s.hidden {
                return err(format!(
                    "batch: sequence {i} asks for logits; an encoder only pools (hidden states)"
                ));
            }
            if s.num_cached != 0 {
                return err(format!(
                    "batch: sequence {i} starts at position {}; an encoder runs each prompt whole",
                    s.num_cached
                ));
            }
            if s.num_tokens > self.info.max_model_len {
                return err(format!(
                    "batch: sequence {i} has {} tokens, past the context length {}",
                    s.num_tokens, self.info.max_model_len
                ));
            }
            if s.num_logits > s.num_tokens {
                return err(format!(
                    "batch: sequence {i} wants {} rows of {} tokens",
                    s.num_logits, s.num_tokens
                ));
            }
        }
        if let Some(t) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.info.vocab_size)
        {
            return err(format!(
                "batch: token id {t} is outside the vocabulary ({})",
                self.info.vocab_size
            ));
        }
        Ok(())
    }
}

impl ModelRunner for EncoderRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> std::result::Result<(), RunnerError> {
        self.validate(batch)?;
        out.data.clear();
        out.hidden.clear();
        out.vocab_size = self.info.vocab_size;
        if batch.is_empty() {
            return Ok(());
        }
        self.model.forward(batch, &mut self.scratch, out);
        Ok(())
    }
}
