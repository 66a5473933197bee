//! `Llama`: the Llama-family transformer (llama, qwen2) read from GGUF tensors named
//! as the checkpoint names them, with a forward pass over a flat batch.

use sloserve_engine::{Batch, Logits};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::activation::silu_mul;
use crate::kernels::attention::{paged_attention, AttnShape};
use crate::kernels::norm::rms_norm;
use crate::kv_cache::KvCache;
use crate::rope::Rope;
use crate::weights::{Linear, Precision, WeightData};

/// Reusable activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub struct Scratch {
    token_seq: Vec<u32>,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    last: Vec<f32>,
}

fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

pub struct Block {
    attn_norm: Vec<f32>,
    attn_q: Linear,
    attn_k: Linear,
    attn_v: Linear,
    attn_output: Linear,
    ffn_norm: Vec<f32>,
    ffn_gate: Linear,
    ffn_up: Linear,
    ffn_down: Linear,
}

pub struct Llama {
    pub config: ModelConfig,
    token_embd: WeightData,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    output: Linear,
    rope: Rope,
}

/// Loads named tensors, checking their shapes against the config.
struct Loader<'a> {
    file: &'a mut GgufFile,
    precision: Precision,
}

impl Loader<'_> {
    fn tensor(&mut self, name: &str, expect: &[usize]) -> Result<WeightData> {
        let (data, dims) = self.file.read_tensor(name)?;
        if dims != expect {
            return Err(ModelError::BadTensor {
                path: self.file.path.clone(),
                tensor: name.to_string(),
                reason: format!("shape {dims:?}, expected {expect:?}"),
            });
        }
        Ok(data)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.tensor(name, &[len])?.to_f32())
    }

    fn linear(&mut self, name: &str, n_out: usize, k: usize, bias: bool) -> Result<Linear> {
        let w = self.tensor(&format!("{name}.weight"), &[n_out, k])?;
        let b = if bias {
            Some(self.vector(&format!("{name}.bias"), n_out)?)
        } else {
            None
        };
        Ok(Linear::new(w, n_out, k, b, self.precision))
    }
}

impl Llama {
    pub fn load(file: &mut GgufFile, precision: Precision) -> Result<Self> {
        file.check_dtypes()?;
        let c = ModelConfig::from_gguf(file)?;
        let mut ld = Loader { file, precision };
        let (h, q, kv, ffn) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let token_embd = ld.tensor("token_embd.weight", &[c.vocab_size, h])?;
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("blk.{i}");
            blocks.push(Block {
                attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), h)?,
                attn_q: ld.linear(&format!("{p}.attn_q"), q, h, c.qkv_bias)?,
                attn_k: ld.linear(&format!("{p}.attn_k"), kv, h, c.qkv_bias)?,
                attn_v: ld.linear(&format!("{p}.attn_v"), kv, h, c.qkv_bias)?,
                attn_output: ld.linear(&format!("{p}.attn_output"), h, q, false)?,
                ffn_norm: ld.vector(&format!("{p}.ffn_norm.weight"), h)?,
                ffn_gate: ld.linear(&format!("{p}.ffn_gate"), ffn, h, false)?,
                ffn_up: ld.linear(&format!("{p}.ffn_up"), ffn, h, false)?,
                ffn_down: ld.linear(&format!("{p}.ffn_down"), h, ffn, false)?,
            });
        }
        let output_norm = ld.vector("output_norm.weight", h)?;
        let output = if c.tied_embeddings {
            Linear::new(token_embd.clone(), c.vocab_size, h, None, precision)
        } else {
            ld.linear("output", c.vocab_size, h, false)?
        };
        let rope = Rope::new(c.rope_style, c.head_dim, c.rope_theta, c.context_length);
        Ok(Llama {
            config: c,
            token_embd,
            blocks,
            output_norm,
            output,
            rope,
        })
    }

    /// Runs one flat batch: writes new keys/values into `cache` and fills `logits`
    /// with one row per sequence that wants logits. The batch must be valid (see
    /// `runner::validate`).
    pub fn forward(
        &self,
        batch: &Batch,
        cache: &mut KvCache,
        s: &mut Scratch,
        logits: &mut Logits,
    ) {
        let c = &self.config;
        let (h, qn, kvn, ffn) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let t = batch.num_tokens();
        s.token_seq.clear();
        for (i, seq) in batch.seqs.iter().enumerate() {
            s.token_seq
                .extend(std::iter::repeat_n(i as u32, seq.num_tokens));
        }
        let x = sized(&mut s.x, t * h);
        for (row, &tok) in x.chunks_exact_mut(h).zip(&batch.tokens) {
            self.token_embd.dequantize_rows(tok as usize, h, row);
        }
        let shape = AttnShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        for (li, b) in self.blocks.iter().enumerate() {
            let xn = sized(&mut s.xn, t * h);
            rms_norm(x, &b.attn_norm, c.rms_norm_eps, xn);
            let q = sized(&mut s.q, t * qn);
            let k = sized(&mut s.k, t * kvn);
            let v = sized(&mut s.v, t * kvn);
            b.attn_q.forward(xn, t, q);
            b.attn_k.forward(xn, t, k);
            b.attn_v.forward(xn, t, v);
            for seq in &batch.seqs {
                let table = batch.block_table(seq);
                for i in 0..seq.num_tokens {
                    let (ti, pos) = (seq.token_start + i, seq.position(i));
                    self.rope.apply(&mut q[ti * qn..(ti + 1) * qn], pos);
                    let kt = &mut k[ti * kvn..(ti + 1) * kvn];
                    self.rope.apply(kt, pos);
                    let slot = cache.slot(table, pos);
                    cache.write(li, slot, kt, &v[ti * kvn..(ti + 1) * kvn]);
                }
            }
            let attn = sized(&mut s.attn, t * qn);
            paged_attention(batch, &s.token_seq, q, cache, li, shape, attn);
            let proj = sized(&mut s.proj, t * h);
            b.attn_output.forward(attn, t, proj);
            add_in_place(x, proj);
            let xn = sized(&mut s.xn, t * h);
            rms_norm(x, &b.ffn_norm, c.rms_norm_eps, xn);
            let gate = sized(&mut s.gate, t * ffn);
            let up = sized(&mut s.up, t * ffn);
            b.ffn_gate.forward(xn, t, gate);
            b.ffn_up.forward(xn, t, up);
            silu_mul(gate, up);
            let proj = sized(&mut s.proj, t * h);
            b.ffn_down.forward(gate, t, proj);
            add_in_place(x, proj);
        }
        // Final norm and output projection only for the rows that need logits.
        let rows: Vec<usize> = batch
            .seqs
            .iter()
            .filter(|q| q.want_logits)
            .map(|q| q.token_start + q.num_tokens - 1)
            .collect();
        let r = rows.len();
        let last = sized(&mut s.last, r * h);
        for (dst, &row) in last.chunks_exact_mut(h).zip(&rows) {
            dst.copy_from_slice(&x[row * h..(row + 1) * h]);
        }
        let xn = sized(&mut s.xn, r * h);
        rms_norm(last, &self.output_norm, c.rms_norm_eps, xn);
        logits.vocab_size = c.vocab_size;
        logits.data.resize(r * c.vocab_size, 0.0);
        self.output.forward(xn, r, &mut logits.data);
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
