//! `Decoder`: the shared decoder-only transformer every family runs on (llama, qwen2,
//! qwen3, gemma3, and the mixtures of experts qwen2moe, qwen3moe, Mixtral-style llama,
//! gpt-oss),
//! read from GGUF tensors named as llama.cpp names them, with a forward pass over a
//! flat batch: embed, the blocks in turn, final norm, logits. What differs by
//! architecture is described once in `crate::family` and read through `ModelConfig`.

mod attention;
mod block;
mod fused;
mod mlp;
mod moe;
mod moe_panels;

use sloserve_engine::{Batch, Logits};

pub(crate) use self::moe::MAX_USED as MAX_EXPERTS_USED;

use self::block::{Block, BlockScratch};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::norm::rms_norm;
use crate::kv_cache::KvCache;
use crate::linear::{HeldBytes, Linear, Tokens};
use crate::rope::Rope;
use crate::weights::{Precision, WeightData};

/// Reusable activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub struct Scratch {
    token_seq: Vec<u32>,
    x: Vec<f32>,
    block: BlockScratch,
    last: Vec<f32>,
    last_norm: Vec<f32>,
}

pub(crate) fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// What every layer reads in one forward step.
struct Step<'a> {
    batch: &'a Batch,
    /// Each token's sequence (its index in `batch.seqs`).
    token_seq: &'a [u32],
    /// The global layers' RoPE, then (with sliding windows) the local layers'.
    ropes: &'a [Rope],
    /// Tokens in the batch, and whether a prompt is among them.
    tokens: Tokens,
}

pub struct Decoder {
    pub config: ModelConfig,
    /// The token embedding, read by row in the file's form; `None` when it is the
    /// output matrix (tied), held once there.
    token_embd: Option<WeightData>,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    output: Linear,
    ropes: Vec<Rope>,
    held: HeldBytes,
}

/// A one-line progress bar on stderr while the layers load, when it is a terminal.
struct Progress {
    layers: usize,
    tty: bool,
}

impl Progress {
    fn new(layers: usize) -> Self {
        use std::io::IsTerminal;
        Progress {
            layers,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn show(&self, done: usize, held: usize) {
        if self.tty {
            let width = 30;
            let filled = width * done / self.layers.max(1);
            eprint!(
                "\rloading [{}{}] {done}/{} layers, {:.0} MB",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.layers,
                held as f64 / 1e6
            );
        }
    }

    fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// The file's blocks read at a time for a matrix built by rows (`Loader::matrix`):
/// what a load holds beside the panels already built, instead of the whole matrix.
const LOAD_CHUNK_BYTES: usize = 8 << 20;

/// Loads named tensors, checking their shapes against the config.
pub(crate) struct Loader<'a> {
    pub(crate) file: &'a mut GgufFile,
    pub(crate) precision: Precision,
    /// What the layers loaded so far hold, by form.
    pub(crate) held: HeldBytes,
}

impl Loader<'_> {
    pub(crate) fn tensor(&mut self, name: &str, expect: &[usize]) -> Result<WeightData> {
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

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.tensor(name, &[len])?.to_f32();
        self.held.f32 += v.len() * 4;
        Ok(v)
    }

    /// `[n, len]` tensor `name` as its `n` rows (e.g. each expert's bias).
    fn stacked_vectors(&mut self, name: &str, n: usize, len: usize) -> Result<Vec<Vec<f32>>> {
        let v = self.tensor(name, &[n, len])?.to_f32();
        self.held.f32 += v.len() * 4;
        Ok(v.chunks_exact(len.max(1)).map(<[f32]>::to_vec).collect())
    }

    /// A layer from loaded weights (its bias already counted by `vector`).
    fn new_linear(&mut self, w: WeightData, n: usize, k: usize, b: Option<Vec<f32>>) -> Linear {
        let bias_bytes = b.as_ref().map_or(0, |b| b.len() * 4);
        let l = Linear::new(w, n, k, b, self.precision);
        let mut held = l.held_bytes();
        held.f32 -= bias_bytes;
        self.held.add(held);
        l
    }

    pub(crate) fn linear(
        &mut self,
        name: &str,
        n_out: usize,
        k: usize,
        bias: bool,
    ) -> Result<Linear> {
        let b = if bias {
            Some(self.vector(&format!("{name}.bias"), n_out)?)
        } else {
            None
        };
        self.matrix(&format!("{name}.weight"), n_out, k, b)
    }

    /// Matrix `name` of shape `[n_out, k]` as a layer: read by rows, `LOAD_CHUNK_BYTES`
    /// at a time, where it becomes panels (`Linear::from_rows`), else whole.
    fn matrix(
        &mut self,
        name: &str,
        n_out: usize,
        k: usize,
        b: Option<Vec<f32>>,
    ) -> Result<Linear> {
        if let Some(m) = self.file.matrix_rows(name) {
            if m.dims == [n_out, k] {
                let (dtype, chunk) = (m.dtype, (LOAD_CHUNK_BYTES / m.row_bytes.max(1)).max(1));
                let file = &mut *self.file;
                let read = |rows, buf: &mut Vec<u8>| file.read_rows(name, rows, buf);
                if let Some(mut l) =
                    Linear::from_rows(dtype, (n_out, k), self.precision, chunk, read)?
                {
                    self.held.add(l.held_bytes());
                    l.bias = b;
                    return Ok(l);
                }
            }
        }
        let w = self.tensor(name, &[n_out, k])?;
        Ok(self.new_linear(w, n_out, k, b))
    }

    /// Expert `e`'s `[n_out, k]` matrix out of the stacked `[experts, n_out, k]`
    /// tensor `name`, in the file's blocks (only its rows are read).
    fn expert(
        &mut self,
        name: &str,
        e: usize,
        experts: usize,
        n_out: usize,
        k: usize,
    ) -> Result<WeightData> {
        let path = self.file.path.clone();
        let bad = |reason: String| ModelError::BadTensor {
            path: path.clone(),
            tensor: name.to_string(),
            reason,
        };
        let Some(m) = self.file.stacked_rows(name) else {
            return Err(match self.file.has_tensor(name) {
                true => bad("not a stack of matrices readable by rows".into()),
                false => ModelError::MissingTensor {
                    path: path.clone(),
                    tensor: name.to_string(),
                },
            });
        };
        if m.dims != [experts * n_out, k] {
            return Err(bad(format!(
                "shape {:?}, expected [{experts}, {n_out}, {k}]",
                self.file.tensor_info(name).map(|i| i.shape.dims().to_vec())
            )));
        }
        let mut buf = Vec::new();
        self.file
            .read_stacked_rows(name, e * n_out..(e + 1) * n_out, &mut buf)?;
        let w = WeightData::from_bytes(m.dtype, &buf).ok_or_else(|| {
            ModelError::UnsupportedTensorType {
                path: path.clone(),
                tensor: name.to_string(),
                dtype: format!("{:?}", m.dtype),
                supported: crate::gguf::supported_dtypes_list(),
            }
        })?;
        let dims = [experts, n_out, k];
        Ok(
            match self
                .file
                .quantize()
                .and_then(|ty| crate::requantize::target(&self.file.content, ty, name, &dims))
            {
                Some(to) => crate::requantize::requantize(w, to),
                None => w,
            },
        )
    }
}

impl Decoder {
    /// Loads the weights; the RoPE table covers positions `0..max_positions` (the
    /// served context, not the file's `context_length`).
    pub fn load(file: &mut GgufFile, precision: Precision, max_positions: usize) -> Result<Self> {
        let c = ModelConfig::from_gguf(file)?;
        Self::load_config(file, c, precision, max_positions, max_positions)
    }

    /// `load` with the config already read (and the command line's overrides in it);
    /// `served_ctx` is the context each sequence is served with (`--max-model-len`, else
    /// the file's), which picks LongRoPE's factors, as llama.cpp's per-sequence context
    /// does; the RoPE table covers `0..max_positions` (no more than that).
    pub fn load_config(
        file: &mut GgufFile,
        c: ModelConfig,
        precision: Precision,
        max_positions: usize,
        served_ctx: usize,
    ) -> Result<Self> {
        file.check_dtypes()?;
        let mut ld = Loader {
            file,
            precision,
            held: HeldBytes::default(),
        };
        let h = c.hidden_size;
        // Tied, it is the output matrix: read last, by rows, as that layer.
        let token_embd = match c.tied_embeddings {
            true => None,
            false => Some(ld.tensor("token_embd.weight", &[c.vocab_size, h])?),
        };
        let progress = Progress::new(c.num_layers);
        let blocks = (0..c.num_layers)
            .map(|i| {
                let b = Block::new(&mut ld, i, &c);
                progress.show(i + 1, ld.held.total());
                b
            })
            .collect::<Result<Vec<_>>>()?;
        progress.done();
        let output_norm = ld.vector("output_norm.weight", h)?;
        let output = match &token_embd {
            None => ld.matrix("token_embd.weight", c.vocab_size, h, None)?,
            Some(t) => {
                ld.held.quantized += t.as_bytes().len();
                ld.linear("output", c.vocab_size, h, false)?
            }
        };
        let max_pos = max_positions.min(c.context_length);
        // Per-pair frequency factors shared by every layer: Llama 3's, or LongRoPE's
        // pair for the served context (`RopeFactors`).
        let freq_factors = match c.rope_factors.tensor(served_ctx) {
            Some(name) if ld.file.has_tensor(name) => {
                if let crate::rope::RopeFactors::LongShort { orig_ctx } = c.rope_factors {
                    tracing::info!(
                        factors = name,
                        served_context = served_ctx,
                        original_context = orig_ctx,
                        "LongRoPE: the long factors past the original context, else the short"
                    );
                }
                Some(ld.vector(name, c.rope_dims / 2)?)
            }
            _ => None,
        };
        let (style, hd, n_rot) = (c.rope_style, c.head_dim, c.rope_dims);
        let mut ropes = vec![Rope::scaled(
            style,
            hd,
            n_rot,
            c.rope_theta,
            &c.rope_scaling,
            freq_factors.as_deref(),
            max_pos,
        )];
        if let Some(sw) = c.sliding_window {
            ropes.push(match sw.rope_scaled {
                true => Rope::scaled(
                    style,
                    hd,
                    n_rot,
                    sw.rope_theta,
                    &c.rope_scaling,
                    None,
                    max_pos,
                ),
                false => Rope::new(style, hd, n_rot, sw.rope_theta, max_pos),
            });
        }
        Ok(Decoder {
            held: ld.held,
            config: c,
            token_embd,
            blocks,
            output_norm,
            output,
            ropes,
        })
    }

    /// The bytes the weights are held in, by form.
    pub fn held_bytes(&self) -> HeldBytes {
        self.held
    }

    /// The largest batch (tokens) that every block multiplies on its quantized
    /// path: past it a step's cost jumps (`Linear::small_batch_max_rows`; `None`
    /// when no layer switches). The output layer only sees the rows that want
    /// logits, so the blocks decide.
    pub fn small_batch_max_tokens(&self) -> Option<usize> {
        self.blocks
            .iter()
            .map(Block::small_batch_max_rows)
            .fold(None, crate::linear::first_switch)
    }

    /// Layers with experts, and how many of them multiply the chosen experts in two
    /// jobs a step (`moe_panels`) rather than two an expert.
    pub fn expert_layers(&self) -> (usize, usize) {
        let jobs = self.blocks.iter().filter_map(Block::experts_in_two_jobs);
        jobs.fold((0, 0), |(n, two), j| (n + 1, two + j as usize))
    }

    /// Positions the RoPE table covers.
    pub fn rope_positions(&self) -> usize {
        self.ropes[0].max_pos()
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
        let t = batch.num_tokens();
        s.token_seq.clear();
        for (i, seq) in batch.seqs.iter().enumerate() {
            s.token_seq
                .extend(std::iter::repeat_n(i as u32, seq.num_tokens));
        }
        let x = sized(&mut s.x, t * self.config.hidden_size);
        self.embed(&batch.tokens, x);
        let step = Step {
            batch,
            token_seq: &s.token_seq,
            ropes: &self.ropes,
            tokens: Tokens {
                n: t,
                prompt: batch.seqs.iter().any(|q| q.num_tokens > 1),
            },
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            block.forward(x, &step, cache, layer, &mut s.block);
        }
        self.logits(x, &step, &mut s.last, &mut s.last_norm, logits);
    }

    /// Each token's embedding row into `x` (`[T, hidden]`).
    fn embed(&self, tokens: &[u32], x: &mut [f32]) {
        let h = self.config.hidden_size;
        for (row, &tok) in x.chunks_exact_mut(h).zip(tokens) {
            match &self.token_embd {
                Some(e) => e.dequantize_rows(tok as usize, h, row),
                None => self.output.weight_row(tok as usize, row),
            }
            if let Some(scale) = self.config.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    /// Final norm and output projection, only for the rows the batch wants logits
    /// of (each sequence's `logit_tokens`); a pooled sequence's rows
    /// (`BatchSeq::hidden`) stop after the norm, into `logits.hidden`.
    fn logits(
        &self,
        x: &[f32],
        step: &Step,
        last: &mut Vec<f32>,
        last_norm: &mut Vec<f32>,
        logits: &mut Logits,
    ) {
        let c = &self.config;
        let h = c.hidden_size;
        let seqs = &step.batch.seqs;
        let rows = seqs
            .iter()
            .filter(|q| !q.hidden)
            .flat_map(|q| q.logit_tokens());
        let hidden = seqs
            .iter()
            .filter(|q| q.hidden)
            .flat_map(|q| q.logit_tokens());
        logits.hidden_size = h;
        logits.hidden.clear();
        if hidden.clone().next().is_some() {
            let n = hidden.clone().count();
            logits.hidden.resize(n * h, 0.0);
            let raw = sized(last, n * h);
            for (dst, row) in raw.chunks_exact_mut(h).zip(hidden) {
                dst.copy_from_slice(&x[row * h..(row + 1) * h]);
            }
            rms_norm(raw, &self.output_norm, c.rms_norm_eps, &mut logits.hidden);
        }
        let r = rows.clone().count();
        let last = sized(last, r * h);
        for (dst, row) in last.chunks_exact_mut(h).zip(rows) {
            dst.copy_from_slice(&x[row * h..(row + 1) * h]);
        }
        let xn = sized(last_norm, r * h);
        rms_norm(last, &self.output_norm, c.rms_norm_eps, xn);
        logits.vocab_size = c.vocab_size;
        logits.data.resize(r * c.vocab_size, 0.0);
        if r == 0 {
            return;
        }
        let t = Tokens {
            n: r,
            ..step.tokens
        };
        self.output.forward(xn, t, &mut logits.data);
    }
}
