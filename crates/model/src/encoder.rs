//! `Encoder`: the bidirectional transformer of `Layout::Encoder` families (bert:
//! BERT, MiniLM, BGE), as llama.cpp's `bert.cpp` builds it, read from the same GGUF
//! tensor names: token + token type 0 + learned position embeddings, LayerNorm, then
//! post-norm layers (attention over every position of the sequence, residual,
//! LayerNorm; feed-forward up, GELU, down, residual, LayerNorm). Its output is each
//! asked position's last hidden state, for pooling: an encoder has no output head
//! and no KV cache, and each sequence of a batch is its whole prompt (positions
//! from 0). `EncoderRunner` (`runner.rs`) serves it to the engine.

mod attention;
mod runner;

pub use runner::EncoderRunner;

use sloserve_engine::{Batch, Logits};

use crate::config::ModelConfig;
use crate::decoder::{sized, Loader};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::activation::gelu;
use crate::kernels::norm::layer_norm_in_place;
use crate::linear::{HeldBytes, Linear, Tokens};
use crate::weights::{Precision, WeightData};

/// A LayerNorm's weight and bias.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn load(ld: &mut Loader, name: &str, h: usize) -> Result<Self> {
        Ok(Norm {
            w: ld.vector(&format!("{name}.weight"), h)?,
            b: ld.vector(&format!("{name}.bias"), h)?,
        })
    }

    fn apply(&self, x: &mut [f32], eps: f32) {
        layer_norm_in_place(x, &self.w, &self.b, eps);
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// Reusable activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub struct EncoderScratch {
    token_seq: Vec<u32>,
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    ctx: Vec<f32>,
    tmp: Vec<f32>,
    ffn: Vec<f32>,
}

pub struct Encoder {
    pub config: ModelConfig,
    token_embd: WeightData,
    /// Token type 0's embedding (llama.cpp hard-codes type 0: "sentence A").
    token_type0: Vec<f32>,
    /// `[positions, hidden]`.
    position_embd: Vec<f32>,
    positions: usize,
    embd_norm: Norm,
    layers: Vec<Layer>,
    held: HeldBytes,
}

impl Encoder {
    /// Loads the weights of an encoder-layout file.
    pub fn load(file: &mut GgufFile, c: ModelConfig, precision: Precision) -> Result<Self> {
        file.check_dtypes()?;
        let (h, q, kv, ffn) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let positions = c.context_length;
        let mut ld = Loader {
            file,
            precision,
            held: HeldBytes::default(),
        };
        let token_embd = ld.tensor("token_embd.weight", &[c.vocab_size, h])?;
        let bytes = token_embd.as_bytes().len();
        match token_embd {
            WeightData::F16(_) | WeightData::BF16(_) => ld.held.half += bytes,
            WeightData::F32(_) => ld.held.f32 += bytes,
            _ => ld.held.quantized += bytes,
        }
        let types = ld
            .file
            .tensor_info("token_types.weight")
            .map(|i| i.shape.dims().to_vec());
        let token_type0 = match types.as_deref() {
            // llama.cpp reads it when present and adds row 0.
            Some([n, w]) if *n >= 1 && *w == h => {
                let all = ld.tensor("token_types.weight", &[*n, h])?.to_f32();
                ld.held.f32 += h * 4;
                all[..h].to_vec()
            }
            Some(dims) => {
                return Err(ModelError::BadTensor {
                    path: ld.file.path.clone(),
                    tensor: "token_types.weight".into(),
                    reason: format!("shape {dims:?}, expected [types, {h}]"),
                })
            }
            None => vec![0.0; h],
        };
        let position_embd = ld.tensor("position_embd.weight", &[positions, h])?.to_f32();
        ld.held.f32 += position_embd.len() * 4;
        let embd_norm = Norm::load(&mut ld, "token_embd_norm", h)?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = |n: &str| format!("blk.{i}.{n}");
                Ok(Layer {
                    q: ld.linear(&p("attn_q"), q, h, true)?,
                    k: ld.linear(&p("attn_k"), kv, h, true)?,
                    v: ld.linear(&p("attn_v"), kv, h, true)?,
                    o: ld.linear(&p("attn_output"), h, q, true)?,
                    attn_norm: Norm::load(&mut ld, &p("attn_output_norm"), h)?,
                    up: ld.linear(&p("ffn_up"), ffn, h, true)?,
                    down: ld.linear(&p("ffn_down"), h, ffn, true)?,
                    out_norm: Norm::load(&mut ld, &p("layer_output_norm"), h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoder {
            held: ld.held,
            config: c,
            token_embd,
            token_type0,
            position_embd,
            positions,
            embd_norm,
            layers,
        })
    }

    /// The bytes the weights are held in, by form.
    pub fn held_bytes(&self) -> HeldBytes {
        self.held
    }

    /// Positions the learned position embedding covers.
    pub fn max_positions(&self) -> usize {
        self.positions
    }

    /// Runs one flat batch of whole prompts (each sequence's positions from 0: the
    /// batch must be valid, see `EncoderRunner::validate`) and puts the last hidden
    /// state of each sequence's asked rows (`BatchSeq::logit_tokens`) in
    /// `out.hidden`, in order.
    pub fn forward(&self, batch: &Batch, s: &mut EncoderScratch, out: &mut Logits) {
        let c = &self.config;
        let (t, h, eps) = (batch.num_tokens(), c.hidden_size, c.rms_norm_eps);
        let (q_len, kv_len, ffn) = (c.q_size(), c.kv_size(), c.intermediate_size);
        s.token_seq.clear();
        for (i, seq) in batch.seqs.iter().enumerate() {
            s.token_seq
                .extend(std::iter::repeat_n(i as u32, seq.num_tokens));
        }
        let x = sized(&mut s.x, t * h);
        self.embed(batch, x);
        self.embd_norm.apply(x, eps);
        let tokens = Tokens { n: t, prompt: true };
        for l in &self.layers {
            let q = sized(&mut s.q, t * q_len);
            l.q.forward(x, tokens, q);
            let k = sized(&mut s.k, t * kv_len);
            l.k.forward(x, tokens, k);
            let v = sized(&mut s.v, t * kv_len);
            l.v.forward(x, tokens, v);
            let ctx = sized(&mut s.ctx, t * q_len);
            attention::bidirectional(c, batch, &s.token_seq, q, k, v, ctx);
            let tmp = sized(&mut s.tmp, t * h);
            l.o.forward(ctx, tokens, tmp);
            add_into(x, tmp);
            l.attn_norm.apply(x, eps);
            let up = sized(&mut s.ffn, t * ffn);
            l.up.forward(x, tokens, up);
            gelu(up);
            l.down.forward(up, tokens, tmp);
            add_into(x, tmp);
            l.out_norm.apply(x, eps);
        }
        out.hidden_size = h;
        out.hidden.clear();
        for seq in &batch.seqs {
            let rows = seq.logit_tokens();
            out.hidden
                .extend_from_slice(&x[rows.start * h..rows.end * h]);
        }
        out.vocab_size = c.vocab_size;
        out.data.clear();
    }

    /// Each token's embedding, token type 0's and its position's, into `x`
    /// (`[T, hidden]`), added in llama.cpp's order.
    fn embed(&self, batch: &Batch, x: &mut [f32]) {
        let h = self.config.hidden_size;
        for seq in &batch.seqs {
            let toks = batch.seq_tokens(seq);
            let rows =
                x[seq.token_start * h..(seq.token_start + seq.num_tokens) * h].chunks_exact_mut(h);
            for (i, (row, &tok)) in rows.zip(toks).enumerate() {
                self.token_embd.dequantize_rows(tok as usize, h, row);
                let pos = &self.position_embd[seq.position(i) * h..][..h];
                for ((v, t), p) in row.iter_mut().zip(&self.token_type0).zip(pos) {
                    *v = p + (*v + t);
                }
            }
        }
    }
}

/// `x += r` (the residual add: llama.cpp's `cur + inpL`).
fn add_into(x: &mut [f32], r: &[f32]) {
    for (a, b) in x.iter_mut().zip(r) {
        *a += *b;
    }
}
