//! `LlamaRunner`: the `ModelRunner` for GGUF decoder models (every `crate::family`) on CPU: owns the
//! model weights and the paged KV cache, validates and runs flat batches.

use std::path::Path;

use sloserve_engine::{Batch, KvCacheType, Logits, ModelRunner, RunnerError, RunnerInfo};

use crate::config::ModelConfig;
use crate::decoder::{Decoder, Scratch};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::kv_cache::{KvCache, KvDtype};
use crate::memory_plan::MemoryPlan;
use crate::requantize::{WeightPlan, WeightType};
use crate::rope::RopeOverride;
use crate::weights::Precision;

/// How to load a runner.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub precision: Precision,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes of KV cache to allocate (all layers, keys and values); `None`: the
    /// default rule of `memory_plan` (from the machine's available memory).
    pub kv_cache_memory: Option<usize>,
    /// What the KV cache holds (`--kv-cache-type`; `f16` is f32 in exact precision).
    pub kv_cache_type: KvCacheType,
    /// Cap on the context length (defaults to the model's own).
    pub max_model_len: Option<usize>,
    /// Re-quantize the weight matrices to this type at load (`--quantize`).
    pub quantize: Option<WeightType>,
    /// RoPE scaling over the file's (`--rope-scaling`, `--rope-scale`, `--yarn-orig-ctx`).
    pub rope: RopeOverride,
    /// A test's override of the KV cache's element type (`None`: from
    /// `kv_cache_type` and the precision).
    pub kv_dtype: Option<KvDtype>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            precision: Precision::Fast,
            block_size: 16,
            kv_cache_memory: Some(512 << 20),
            kv_cache_type: KvCacheType::F16,
            max_model_len: None,
            quantize: None,
            rope: RopeOverride::default(),
            kv_dtype: None,
        }
    }
}

pub struct LlamaRunner {
    model: Decoder,
    cache: KvCache,
    scratch: Scratch,
    info: RunnerInfo,
    kv_identity: Option<u64>,
}

/// What this runner's KV blocks mean, as one hash (`ModelRunner::kv_identity`):
/// SHA-256 over the GGUF file's header bytes (its metadata, the tokenizer among
/// them, and its tensor table) and size, the KV element type, the precision,
/// the block size, `--quantize` and the RoPE override. `None` if the header
/// cannot be read back.
fn kv_identity(file: &GgufFile, dtype: KvDtype, opts: &RunnerOptions) -> Option<u64> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let f = std::fs::File::open(&file.path).ok()?;
    let size = f.metadata().ok()?.len();
    let header_len = file.content.tensor_data_offset.min(size);
    let mut header = Vec::with_capacity(header_len as usize);
    f.take(header_len).read_to_end(&mut header).ok()?;
    let what = format!(
        "sloserve kv v1\0{size}\0{dtype:?}\0{:?}\0{}\0{:?}\0{:?}",
        opts.precision, opts.block_size, opts.quantize, opts.rope
    );
    let d = Sha256::new()
        .chain_update(what.as_bytes())
        .chain_update(&header)
        .finalize();
    Some(u64::from_le_bytes(d[..8].try_into().expect("8 bytes")))
}

impl LlamaRunner {
    pub fn load(path: impl AsRef<Path>, opts: &RunnerOptions) -> Result<Self> {
        let mut file = GgufFile::open(path)?;
        Self::from_gguf(&mut file, opts)
    }

    pub fn from_gguf(file: &mut GgufFile, opts: &RunnerOptions) -> Result<Self> {
        let c = &ModelConfig::from_gguf_with(file, &opts.rope)?;
        if c.family.layout == crate::family::Layout::Encoder {
            return Err(crate::error::ModelError::Runtime(format!(
                "{}: `{}` is an encoder (it only pools): load it with `EncoderRunner` (or `LoadedModel`)",
                file.path.display(),
                c.architecture
            )));
        }
        let plan = MemoryPlan::new(file, opts.precision, opts.kv_cache_memory)?;
        let block_size = opts.block_size.max(1);
        let dtype = match (opts.kv_dtype, opts.kv_cache_type, opts.precision) {
            // A test's override (the f32 cache in fast precision, say).
            (Some(d), _, _) => d,
            (None, KvCacheType::F16, Precision::Exact) => KvDtype::F32,
            (None, KvCacheType::F16, Precision::Fast) => KvDtype::F16,
            (None, KvCacheType::Q8_0, _) => KvDtype::Q8_0,
            (None, KvCacheType::Q4_0, _) => KvDtype::Q4_0,
        };
        if dtype.is_quantized() && !c.head_dim.is_multiple_of(crate::kv_quant::QK) {
            return Err(crate::error::ModelError::Runtime(format!(
                "--kv-cache-type {}: the head dimension {} is not a multiple of {}",
                opts.kv_cache_type.name(),
                c.head_dim,
                crate::kv_quant::QK
            )));
        }
        let kv_bytes_per_token = c.kv_bytes_per_token_as(dtype);
        let num_blocks =
            KvCache::blocks_for_budget(plan.kv as usize, kv_bytes_per_token, block_size).max(1);
        let max_model_len = opts
            .max_model_len
            .map_or(c.context_length, |m| m.min(c.context_length));
        // No sequence outgrows the KV pool (its blocks are distinct), so RoPE never
        // needs more positions than the served context or the pool holds.
        let max_positions = max_model_len.min(num_blocks.saturating_mul(block_size));
        // The weights first: they prove the layer count and sizes before the cache is
        // allocated from them.
        file.set_quantize(opts.quantize);
        let model = Decoder::load_config(
            file,
            c.clone(),
            opts.precision,
            max_positions,
            max_model_len,
        )?;
        tracing::info!(
            quantize = opts.quantize.map_or("none (the file's types)", |t| t.name()),
            weights = %WeightPlan::new(&file.content, opts.quantize).summary(),
            "effective weight types"
        );
        let held = model.held_bytes();
        let mb = |b: usize| format!("{:.1} MB", b as f64 / 1e6);
        tracing::info!(
            panels = %mb(held.panels),
            file_blocks = %mb(held.quantized),
            half = %mb(held.half),
            f32 = %mb(held.f32),
            total = %mb(held.total()),
            kv_cache = %mb(num_blocks * block_size * kv_bytes_per_token),
            kv_cache_type = opts.kv_cache_type.name(),
            kv_budget = ?plan.kv_source,
            available = %plan.available.map_or("unknown".into(), |a| mb(a as usize)),
            "weights held"
        );
        let cache = KvCache::new(c.num_layers, c.kv_size(), block_size, num_blocks, dtype);
        let info = RunnerInfo {
            block_size,
            num_kv_blocks: num_blocks,
            vocab_size: c.vocab_size,
            max_model_len,
            kv_bytes_per_token,
            // Only f16/bf16 weights switch kernels with the batch (a step's cost
            // jumps there); quantized and f32 weights never do.
            small_batch_max_tokens: model.small_batch_max_tokens().unwrap_or(0),
            encoder: false,
            experts: c.moe.map(|m| sloserve_engine::ExpertRouting {
                count: m.experts,
                used: m.used,
            }),
        };
        Ok(LlamaRunner {
            kv_identity: kv_identity(file, dtype, opts),
            model,
            cache,
            scratch: Scratch::default(),
            info,
        })
    }

    /// The model.
    pub fn model(&self) -> &Decoder {
        &self.model
    }

    /// Rejects a batch that would read or write outside the cache or the vocabulary.
    pub fn validate(&self, batch: &Batch) -> std::result::Result<(), RunnerError> {
        let info = &self.info;
        let err = |m: String| Err(RunnerError(m));
        if batch.seqs.iter().map(|s| s.num_tokens).sum::<usize>() != batch.tokens.len() {
            return err("batch: sequence token counts do not add up to the batch".into());
        }
        let mut next = 0;
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.token_start != next || s.num_tokens == 0 {
                return err(format!("batch: sequence {i} has a bad token range"));
            }
            if s.num_logits > s.num_tokens {
                return err(format!(
                    "batch: sequence {i} wants {} logits rows of {} tokens",
                    s.num_logits, s.num_tokens
                ));
            }
            next += s.num_tokens;
            if s.context_len() > info.max_model_len || s.context_len() > self.model.rope_positions()
            {
                return err(format!(
                    "batch: sequence {i} reaches {} tokens, past the context length {} (or the KV pool's {} positions)",
                    s.context_len(),
                    info.max_model_len,
                    self.model.rope_positions()
                ));
            }
            if s.block_table_start + s.block_table_len > batch.block_tables.len()
                || s.block_table_len * info.block_size < s.context_len()
            {
                return err(format!(
                    "batch: sequence {i}'s block table does not cover its tokens"
                ));
            }
            if let Some(b) = batch
                .block_table(s)
                .iter()
                .find(|&&b| b as usize >= info.num_kv_blocks)
            {
                return err(format!(
                    "batch: sequence {i} names KV block {b} of {}",
                    info.num_kv_blocks
                ));
            }
        }
        if let Some(t) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= info.vocab_size)
        {
            return err(format!(
                "batch: token id {t} is outside the vocabulary ({})",
                info.vocab_size
            ));
        }
        Ok(())
    }
}

impl ModelRunner for LlamaRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn execute(&mut self, batch: &Batch, out: &mut Logits) -> std::result::Result<(), RunnerError> {
        self.validate(batch)?;
        out.data.clear();
        out.hidden.clear();
        if batch.is_empty() {
            out.vocab_size = self.info.vocab_size;
            return Ok(());
        }
        self.model
            .forward(batch, &mut self.cache, &mut self.scratch, out);
        Ok(())
    }

    fn kv_identity(&self) -> Option<u64> {
        self.kv_identity
    }

    fn kv_block_bytes(&self) -> usize {
        self.cache.block_bytes()
    }

    fn read_kv_block(&self, block: u32, out: &mut [u8]) -> std::result::Result<(), RunnerError> {
        self.check_block(block, out.len())?;
        self.cache.copy_block_out(block as usize, out);
        Ok(())
    }

    fn write_kv_block(&mut self, block: u32, data: &[u8]) -> std::result::Result<(), RunnerError> {
        self.check_block(block, data.len())?;
        self.cache.copy_block_in(block as usize, data);
        Ok(())
    }
}

impl LlamaRunner {
    /// A block id and byte count `read_kv_block` / `write_kv_block` can take.
    fn check_block(&self, block: u32, len: usize) -> std::result::Result<(), RunnerError> {
        if block as usize >= self.cache.num_blocks || len != self.cache.block_bytes() {
            return Err(RunnerError(format!(
                "KV block {block} of {} bytes: the cache has {} blocks of {} bytes",
                len,
                self.cache.num_blocks,
                self.cache.block_bytes()
            )));
        }
        Ok(())
    }
}
