//! `generate`: runs one sequence straight through a `ModelRunner` (no scheduler):
//! chunked prefill, then decode with a `Sampler`, reporting each token as it comes.
//! Used by `sloserve generate` and by the reference tests.

use std::time::{Duration, Instant};

use sloserve_engine::{
    Batch, Logits, ModelRunner, RunnerError, SampledToken, Sampler, SamplingParams,
};

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Generation stops after emitting one of these (the token is reported).
    pub stop_token_ids: Vec<u32>,
    /// Prefill the prompt in chunks of at most this many tokens (0: one piece).
    pub prefill_chunk: usize,
}

#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prefill of the whole prompt (through the first logits).
    pub prefill_time: Duration,
    /// Time to first token: prefill + sampling of the first token.
    pub ttft: Duration,
    /// Time after the first token.
    pub decode_time: Duration,
}

impl GenerateStats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Generates from `prompt`. `on_token` gets each sampled token and returns false to stop.
pub fn generate(
    runner: &mut dyn ModelRunner,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(&SampledToken) -> bool,
) -> Result<GenerateStats, RunnerError> {
    let info = runner.info().clone();
    if prompt.is_empty() {
        return Err(RunnerError("the prompt is empty".into()));
    }
    let total = (prompt.len() + opts.max_tokens).min(info.max_model_len);
    if prompt.len() >= total {
        return Err(RunnerError(format!(
            "the prompt has {} tokens; the context length is {}",
            prompt.len(),
            info.max_model_len
        )));
    }
    let blocks_needed = total.div_ceil(info.block_size);
    if blocks_needed > info.num_kv_blocks {
        return Err(RunnerError(format!(
            "{total} tokens need {blocks_needed} KV blocks; the cache has {}",
            info.num_kv_blocks
        )));
    }
    let table: Vec<u32> = (0..blocks_needed as u32).collect();
    let mut sampler = Sampler::new(opts.sampling.clone(), info.vocab_size);
    let mut batch = Batch::default();
    let mut logits = Logits::default();
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let start = Instant::now();
    let chunk = if opts.prefill_chunk == 0 {
        prompt.len()
    } else {
        opts.prefill_chunk
    };
    let mut done = 0;
    while done < prompt.len() {
        let n = chunk.min(prompt.len() - done);
        let last = done + n == prompt.len();
        batch.clear();
        batch.push(
            &prompt[done..done + n],
            done,
            &table[..(done + n).div_ceil(info.block_size)],
            last,
        );
        runner.execute(&batch, &mut logits)?;
        done += n;
    }
    stats.prefill_time = start.elapsed();
    let mut ctx = prompt.len();
    loop {
        let tok = sampler.sample(logits.row(0));
        stats.generated_tokens += 1;
        if stats.generated_tokens == 1 {
            stats.ttft = start.elapsed();
        }
        let keep_going = on_token(&tok);
        if !keep_going
            || opts.stop_token_ids.contains(&tok.id)
            || stats.generated_tokens >= opts.max_tokens
            || ctx + 1 > total
            || ctx + 1 >= info.max_model_len
        {
            break;
        }
        batch.clear();
        batch.push(
            &[tok.id],
            ctx,
            &table[..(ctx + 1).div_ceil(info.block_size)],
            true,
        );
        runner.execute(&batch, &mut logits)?;
        ctx += 1;
    }
    stats.decode_time = start.elapsed() - stats.ttft;
    Ok(stats)
}
