//! `sloserve generate`: one prompt through the model, streamed to stdout, then a
//! line of timings.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use sloserve_engine::SamplingParams;
use sloserve_model::chat_template::ChatMessage;
use sloserve_model::detokenizer::StreamDecoder;
use sloserve_model::generate::{generate, GenerateOptions};
use sloserve_model::{LoadedModel, Precision, RunnerOptions, WeightType};

#[derive(Args)]
pub struct GenerateArgs {
    /// GGUF model file.
    #[arg(long, default_value = crate::DEFAULT_MODEL)]
    model: PathBuf,
    /// Raw prompt text (special tokens such as <|im_start|> are recognised).
    #[arg(long, conflicts_with = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// System message for --chat (default: the template's own).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// fast (quantized weights; 8-bit activations in decode steps, f32 products for
    /// prompts), int8 (8-bit activations throughout, as llama.cpp: faster prefill,
    /// llama.cpp's accuracy) or exact (f32 on dequantized weights).
    #[arg(long, default_value = "fast")]
    precision: Precision,
    /// Re-quantize the weight matrices at load to q8_0, q4_0, q4_1 or f16 (default:
    /// the file's own types).
    #[arg(long)]
    quantize: Option<WeightType>,
    /// Prefill the prompt in chunks of this many tokens (0: one piece).
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    /// Compute threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    sloserve_model::set_compute_threads(a.threads);
    let opts = RunnerOptions {
        precision: a.precision,
        quantize: a.quantize,
        ..Default::default()
    };
    let mut m = LoadedModel::load(&a.model, &opts)?;
    if m.config.family.layout == sloserve_model::family::Layout::Encoder {
        bail!(
            "{}: `{}` is an encoder: it embeds (sloserve serve: /v1/embeddings), it cannot generate",
            a.model.display(),
            m.config.architecture
        );
    }
    let prompt = match (&a.prompt, &a.chat) {
        (Some(p), None) => m.tokenizer.encode_prompt(p)?,
        (None, Some(c)) => {
            let Some(t) = &m.chat_template else {
                bail!(
                    "{}: the model has no chat template; use --prompt",
                    a.model.display()
                );
            };
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::new("system", s.clone()));
            }
            msgs.push(ChatMessage::new("user", c.clone()));
            t.encode(&m.tokenizer, &msgs, true, true)?
        }
        _ => bail!("give --prompt TEXT or --chat MESSAGE"),
    };
    let gen = GenerateOptions {
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            seed: a.seed,
            presence_penalty: a.presence_penalty,
            frequency_penalty: a.frequency_penalty,
            logprobs: None,
            ..SamplingParams::default()
        },
        max_tokens: a.max_tokens,
        stop_token_ids: if a.ignore_eos {
            Vec::new()
        } else {
            m.tokenizer.stop_token_ids()
        },
        prefill_chunk: a.prefill_chunk,
    };
    let stop_ids = gen.stop_token_ids.clone();
    let tokenizer = &m.tokenizer;
    let mut decoder = StreamDecoder::new(true);
    let mut stdout = std::io::stdout().lock();
    let stats = generate(&mut m.runner, &prompt, &gen, |tok| {
        if !stop_ids.contains(&tok.id) {
            let piece = decoder.push(tokenizer, tok.id);
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })
    .context("generation failed")?;
    let rest = decoder.flush();
    let _ = writeln!(stdout, "{rest}");
    drop(stdout);
    eprintln!(
        "prompt tokens {} | prefill {:.1} tok/s | TTFT {:.1} ms | generated {} | decode {:.1} tok/s",
        stats.prompt_tokens,
        stats.prefill_tok_s(),
        stats.ttft.as_secs_f64() * 1e3,
        stats.generated_tokens,
        stats.decode_tok_s()
    );
    Ok(())
}
