#!/usr/bin/env python3
"""Writes small GGUF models of the architectures sloserve runs but has no weights for, each in
llama.cpp's exact layout (the tensor names, shapes, metadata keys and types its converter writes;
PyPI's `gguf` is llama.cpp's own writer), with seeded weights and the real vocabulary of
SmolLM2-135M (copied from the default model file). Deterministic: the same bytes on every machine
(numpy's PCG64 stream is stable across versions), so llama.cpp's records on a file made here hold
for the file a test makes (each record carries the file's sha256).

Families: `llama3` (Llama 3.1-style `rope_freqs`), `mixtral` (`llama` with experts), `qwen2-yarn`
(YaRN in the file's metadata), `qwen2moe` (shared expert), `qwen3moe`, `qwen3-embed` (Qwen3-Embedding's
shape: `qwen3`, `pooling_type` 3 = last token, `add_eos_token`), `gpt-oss` (gpt-oss's layout
as llama.cpp's converter writes it, `conversion/gpt_oss.py`: attention biases and sinks, alternating
sliding-window and full layers, YaRN, router and expert biases, MXFP4 experts) and `gpt-oss-f32`
(the same weights with the experts as F32, the values the MXFP4 blocks hold: what the converter
writes for an unquantized checkpoint, and what llama.cpp's F32 reference runs on), `phi3`
(Phi-3.5-mini's layout as `conversion/phi.py` writes it: fused `attn_qkv`, gate and up stacked in
`ffn_up`, LongRoPE's short and long factors with the attention factor the converter computes) and
`phi4-mini` (Phi-4-mini's: the same architecture with grouped KV heads, a partial rotary factor of
0.75 and the output tied to the embedding).

How the weights are scaled: embeddings N(0, 0.05^2) (small, so the layers rather than the input
token decide what comes next: with N(0, 1) every file just repeated its last token), matrices
N(0, 1/fan_in), norms 1 + N(0, 0.1^2) (the final norm times 10), the router 3x a matrix's scale so
routing is decisive; the output matrix is the embedding (tied; qwen2moe writes it again as
`output.weight`, which llama.cpp requires there), so logits have a standard deviation
near 5.7 over 49,152 tokens: a peaked next-token distribution, not a uniform one
(scripts/make_family_reference.py prints the top-1 probabilities of every step).

Usage: make_family_models.py --vocab models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/generated
"""

import argparse
import hashlib
import math
import os
import sys

import numpy as np
import gguf

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 128, 4, 2, 2, 256
EXPERTS, EXPERT_FFN = 8, 64
CTX = 4096
# Small embeddings, so the layers (not the input token) decide the next token, and a final-norm
# gain that puts the tied output's logits at a standard deviation near sqrt(hidden) * 0.05 * 10 = 5.7.
EMBED_STD, OUTPUT_GAIN = 0.05, 10.0
HEAD_DIM = HIDDEN // HEADS


def llama31_rope_freqs(head_dim, base, factor=8.0, low=1.0, high=4.0, orig=8192):
    """Llama 3.1's frequency factors, as llama.cpp's converter computes them."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = orig / low, orig / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


class Weights:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def matrix(self, rows, cols, gain=1.0):
        return (self.rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(gain / math.sqrt(cols)))

    def stack(self, n, rows, cols, gain=1.0):
        return (self.rng.standard_normal((n, rows, cols), dtype=np.float32) * np.float32(gain / math.sqrt(cols)))

    def norm(self, n):
        return (1.0 + 0.1 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def vector(self, n, scale):
        return (scale * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def copy_tokenizer(w, vocab_path, skip=()):
    r = gguf.GGUFReader(vocab_path)
    vocab = 0
    for f in r.fields.values():
        if not f.name.startswith("tokenizer.") or f.name in skip:
            continue
        if f.name == "tokenizer.chat_template":
            w.add_chat_template(f.contents())
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, f.contents())
            if f.name == "tokenizer.ggml.tokens":
                vocab = len(f.contents())
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(f.name, f.contents())
        else:
            w.add_key_value(f.name, f.contents(), vt)
    return vocab


FAMILIES = {
    # name: (architecture, options)
    "llama3": ("llama", dict(rope_freqs=True, theta=500000.0)),
    "mixtral": ("llama", dict(experts=True, theta=1e6)),
    "qwen2-yarn": ("qwen2", dict(qkv_bias=True, theta=1e6, yarn=(4.0, 1024))),
    "qwen2moe": ("qwen2moe", dict(qkv_bias=True, experts=True, shared=True, theta=1e6, untied=True)),
    "qwen3moe": ("qwen3moe", dict(qk_norm=True, experts=True, theta=1e6, used=4)),
    # Qwen3-Embedding's shape: dense qwen3, last-token pooling, EOS appended to every input.
    "qwen3-embed": ("qwen3", dict(qk_norm=True, theta=1e6, pooling=3, add_eos=True)),
    "gpt-oss": ("gpt-oss", dict(mxfp4=True)),
    "gpt-oss-f32": ("gpt-oss", dict(mxfp4=False)),
    "phi3": ("phi3", dict(name="Phi 3.5 layout", kv_heads=HEADS, rotary=1.0, tied=False)),
    "phi4-mini": ("phi3", dict(name="Phi 4 mini layout", kv_heads=KV_HEADS, rotary=0.75, tied=True)),
}

# gpt-oss: heads of 64 (q is 4 x 64 = 256 wide, not the hidden size, as in gpt-oss-20b's 64 x 64 vs
# 2880), the real sliding window, RoPE base and YaRN (factor 32 over 4,096 positions).
OSS_HEAD_DIM, OSS_WINDOW, OSS_THETA, OSS_YARN, OSS_CTX = 64, 128, 150000.0, (32.0, 4096), 131072


def make_gpt_oss(name, o, vocab_path, out_dir):
    """gpt-oss as llama.cpp's converter writes it: `post_attention_norm` before the experts (no
    `ffn_norm`), q/k/v/o biases, `attn_sinks` (one logit per head), the router's bias, each expert's
    gate/up/down biases, and the experts' weights as MXFP4 (gpt-oss ships them so) or, for the F32
    twin, as the F32 values those blocks hold. The expert gate and up matrices are 4x a matrix's
    scale, so that the clamped SwiGLU's limits (7) are reached."""
    from gguf.quants import quantize, dequantize
    arch = "gpt-oss"
    path = os.path.join(out_dir, f"{name}.gguf")
    w = gguf.GGUFWriter(path + ".tmp", arch)
    # Both files hold the same weights: one seed.
    rng = Weights(seed=int(hashlib.sha256(b"gpt-oss").hexdigest()[:8], 16))
    w.add_name(f"sloserve generated {name}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if o["mxfp4"] else gguf.LlamaFileType.ALL_F32)
    eos_key = "tokenizer.ggml.add_eos_token"
    vocab = copy_tokenizer(w, vocab_path, skip=(eos_key,) if o.get("add_eos") else ())
    if o.get("add_eos"):
        w.add_bool(eos_key, True)
    k = lambda s: f"{arch}.{s}"
    if "pooling" in o:
        w.add_uint32(k("pooling_type"), o["pooling"])
    hd = OSS_HEAD_DIM
    w.add_uint32(k("context_length"), OSS_CTX)
    w.add_uint32(k("embedding_length"), HIDDEN)
    w.add_uint32(k("block_count"), LAYERS)
    w.add_uint32(k("feed_forward_length"), EXPERT_FFN)
    w.add_uint32(k("attention.head_count"), HEADS)
    w.add_uint32(k("attention.head_count_kv"), KV_HEADS)
    w.add_float32(k("rope.freq_base"), OSS_THETA)
    w.add_float32(k("attention.layer_norm_rms_epsilon"), 1e-5)
    w.add_uint32(k("expert_count"), EXPERTS)
    w.add_uint32(k("expert_used_count"), 4)
    w.add_uint32(k("attention.key_length"), hd)
    w.add_uint32(k("attention.value_length"), hd)
    w.add_uint32(k("attention.sliding_window"), OSS_WINDOW)
    w.add_uint32(k("expert_feed_forward_length"), EXPERT_FFN)
    factor, orig = OSS_YARN
    w.add_string(k("rope.scaling.type"), "yarn")
    w.add_float32(k("rope.scaling.factor"), factor)
    w.add_uint32(k("rope.scaling.original_context_length"), orig)

    def experts(a):
        """MXFP4 blocks (or, for the twin, the F32 values they hold)."""
        q = quantize(a, gguf.GGMLQuantizationType.MXFP4)
        if o["mxfp4"]:
            return q, gguf.GGMLQuantizationType.MXFP4
        return dequantize(q, gguf.GGMLQuantizationType.MXFP4).astype(np.float32), None

    t = {}
    t["token_embd.weight"] = rng.rng.standard_normal((vocab, HIDDEN), dtype=np.float32) * np.float32(EMBED_STD)
    t["output_norm.weight"] = rng.norm(HIDDEN) * np.float32(OUTPUT_GAIN)
    # llama.cpp's gpt-oss requires `output.weight`: the embedding written again.
    t["output.weight"] = t["token_embd.weight"]
    q, kv, eff = HEADS * hd, KV_HEADS * hd, EXPERT_FFN
    for i in range(LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = rng.norm(HIDDEN)
        t[p + "attn_q.weight"] = rng.matrix(q, HIDDEN)
        t[p + "attn_q.bias"] = rng.vector(q, 0.1)
        t[p + "attn_k.weight"] = rng.matrix(kv, HIDDEN)
        t[p + "attn_k.bias"] = rng.vector(kv, 0.1)
        t[p + "attn_v.weight"] = rng.matrix(kv, HIDDEN)
        t[p + "attn_v.bias"] = rng.vector(kv, 0.1)
        t[p + "attn_output.weight"] = rng.matrix(HIDDEN, q)
        t[p + "attn_output.bias"] = rng.vector(HIDDEN, 0.1)
        t[p + "attn_sinks.weight"] = rng.vector(HEADS, 2.0)
        t[p + "post_attention_norm.weight"] = rng.norm(HIDDEN)
        t[p + "ffn_gate_inp.weight"] = rng.matrix(EXPERTS, HIDDEN, gain=3.0)
        t[p + "ffn_gate_inp.bias"] = rng.vector(EXPERTS, 0.5)
        t[p + "ffn_gate_exps.weight"] = experts(rng.stack(EXPERTS, eff, HIDDEN, gain=4.0))
        t[p + "ffn_gate_exps.bias"] = rng.vector(EXPERTS * eff, 0.5).reshape(EXPERTS, eff)
        t[p + "ffn_up_exps.weight"] = experts(rng.stack(EXPERTS, eff, HIDDEN, gain=4.0))
        t[p + "ffn_up_exps.bias"] = rng.vector(EXPERTS * eff, 0.5).reshape(EXPERTS, eff)
        t[p + "ffn_down_exps.weight"] = experts(rng.stack(EXPERTS, HIDDEN, eff))
        t[p + "ffn_down_exps.bias"] = rng.vector(EXPERTS * HIDDEN, 0.1).reshape(EXPERTS, HIDDEN)
    for n, a in t.items():
        if isinstance(a, tuple):
            a, raw = a
            if raw is not None:
                w.add_tensor(n, a, raw_dtype=raw)
                continue
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)
    return path


# phi3: Phi-3.5-mini's shape of context (131,072 trained on an original 4,096) scaled down to 4,096
# on an original 1,024, so that sloserve's default context (the file's) takes the long factors and
# a context of 1,024 the short ones; RoPE base 10,000, rms eps 1e-5, sliding window 262,144 (Phi-3.5's
# config; llama.cpp ignores it), as Phi-3.5-mini's file has them.
PHI_CTX, PHI_ORIG_CTX, PHI_WINDOW = 4096, 1024, 262144


def longrope_factors(n):
    """LongRoPE factors shaped like Phi-3.5-mini's (`rope_scaling.short_factor` rising from 1 to
    about 2 over the pairs, `long_factor` from about 1.1 to about 60, steepest on the slow pairs)."""
    x = np.arange(n, dtype=np.float64) / (n - 1)
    short = 1.0 + x ** 3
    long = 1.08 * np.exp(np.log(60.0 / 1.08) * x ** 2)
    return short.astype(np.float32), long.astype(np.float32)


def make_phi3(name, o, vocab_path, out_dir):
    """Phi-3.5-mini (or Phi-4-mini: `o`) as llama.cpp's converter (`conversion/phi.py`, `Phi3MiniModel`) writes it: the
    metadata keys in its order and types (`rope.scaling.original_context_length`,
    `attention.sliding_window`, `rope.scaling.attn_factor` = sqrt(1 + ln(ctx/orig) / ln(orig)),
    no `rope.scaling.type`), `rope_factors_long.weight` and `rope_factors_short.weight` (rope
    dims / 2 F32 values each) first, q/k/v fused in `attn_qkv` (q rows, then k, then v), `ffn_up`
    holding the gate's rows then the up projection's (2 x feed_forward_length), an untied
    `output.weight` (here the embedding written again, as qwen2moe's; Phi-4-mini ties it: none).
    Phi-3.5-mini has as many KV heads as query heads and turns whole heads; Phi-4-mini groups
    them (24 over 8) and turns 0.75 of the hidden size's share of each head (`rope.dimension_count`
    = int(0.75 x hidden) / heads: 96 of 128 there, 24 of 32 here)."""
    arch = "phi3"
    path = os.path.join(out_dir, f"{name}.gguf")
    w = gguf.GGUFWriter(path + ".tmp", arch)
    rng = Weights(seed=int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    # Not "phi3" nor "phi-3": llama.cpp's vocabulary loader gives a model so named Phi-3's own
    # special tokens (`</s>`, `<unk>`...) their attributes, and SmolLM2's vocabulary has none.
    w.add_name(f"sloserve generated {o['name']}")
    heads, kv_heads = HEADS, o["kv_heads"]
    head_dim = HIDDEN // heads
    rope_dims = int(o["rotary"] * HIDDEN) // heads
    w.add_context_length(PHI_CTX)
    w.add_rope_scaling_orig_ctx_len(PHI_ORIG_CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(PHI_WINDOW)
    scale = PHI_CTX / PHI_ORIG_CTX
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(PHI_ORIG_CTX)))
    vocab = copy_tokenizer(w, vocab_path)
    t = {}
    short, long = longrope_factors(rope_dims // 2)
    t["rope_factors_long.weight"] = long
    t["rope_factors_short.weight"] = short
    t["token_embd.weight"] = rng.rng.standard_normal((vocab, HIDDEN), dtype=np.float32) * np.float32(EMBED_STD)
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = rng.norm(HIDDEN)
        t[p + "attn_qkv.weight"] = rng.matrix(q + 2 * kv, HIDDEN)
        t[p + "attn_output.weight"] = rng.matrix(HIDDEN, q)
        t[p + "ffn_norm.weight"] = rng.norm(HIDDEN)
        t[p + "ffn_up.weight"] = rng.matrix(2 * FFN, HIDDEN)
        t[p + "ffn_down.weight"] = rng.matrix(HIDDEN, FFN)
    t["output_norm.weight"] = rng.norm(HIDDEN) * np.float32(OUTPUT_GAIN)
    if not o["tied"]:
        t["output.weight"] = t["token_embd.weight"]
    for n, a in t.items():
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)
    return path


def make(name, vocab_path, out_dir):
    arch, o = FAMILIES[name]
    if arch == "gpt-oss":
        return make_gpt_oss(name, o, vocab_path, out_dir)
    if arch == "phi3":
        return make_phi3(name, o, vocab_path, out_dir)
    path = os.path.join(out_dir, f"{name}.gguf")
    w = gguf.GGUFWriter(path + ".tmp", arch)
    rng = Weights(seed=int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    w.add_name(f"sloserve generated {name}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    eos_key = "tokenizer.ggml.add_eos_token"
    vocab = copy_tokenizer(w, vocab_path, skip=(eos_key,) if o.get("add_eos") else ())
    if o.get("add_eos"):
        w.add_bool(eos_key, True)
    k = lambda s: f"{arch}.{s}"
    if "pooling" in o:
        w.add_uint32(k("pooling_type"), o["pooling"])
    w.add_uint32(k("context_length"), CTX)
    w.add_uint32(k("embedding_length"), HIDDEN)
    w.add_uint32(k("block_count"), LAYERS)
    w.add_uint32(k("feed_forward_length"), FFN)
    w.add_uint32(k("attention.head_count"), HEADS)
    w.add_uint32(k("attention.head_count_kv"), KV_HEADS)
    w.add_float32(k("attention.layer_norm_rms_epsilon"), 1e-6)
    w.add_float32(k("rope.freq_base"), o["theta"])
    w.add_uint32(k("rope.dimension_count"), HEAD_DIM)
    used = o.get("used", 2)
    if o.get("experts"):
        w.add_uint32(k("expert_count"), EXPERTS)
        w.add_uint32(k("expert_used_count"), used)
        if arch != "llama":
            w.add_uint32(k("expert_feed_forward_length"), EXPERT_FFN)
        if o.get("shared"):
            w.add_uint32(k("expert_shared_feed_forward_length"), 2 * EXPERT_FFN)
    if "yarn" in o:
        factor, orig = o["yarn"]
        w.add_string(k("rope.scaling.type"), "yarn")
        w.add_float32(k("rope.scaling.factor"), factor)
        w.add_uint32(k("rope.scaling.original_context_length"), orig)

    t = {}
    t["token_embd.weight"] = rng.rng.standard_normal((vocab, HIDDEN), dtype=np.float32) * np.float32(EMBED_STD)
    t["output_norm.weight"] = rng.norm(HIDDEN) * np.float32(OUTPUT_GAIN)
    if o.get("untied"):
        # llama.cpp's qwen2moe requires `output.weight`: the embedding written again.
        t["output.weight"] = t["token_embd.weight"]
    if o.get("rope_freqs"):
        t["rope_freqs.weight"] = llama31_rope_freqs(HEAD_DIM, o["theta"])
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    # Mixtral's expert width is the dense width (llama has no expert_feed_forward_length).
    eff = FFN if arch == "llama" else EXPERT_FFN
    for i in range(LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = rng.norm(HIDDEN)
        t[p + "attn_q.weight"] = rng.matrix(q, HIDDEN)
        t[p + "attn_k.weight"] = rng.matrix(kv, HIDDEN)
        t[p + "attn_v.weight"] = rng.matrix(kv, HIDDEN)
        if o.get("qkv_bias"):
            t[p + "attn_q.bias"] = rng.vector(q, 0.1)
            t[p + "attn_k.bias"] = rng.vector(kv, 0.1)
            t[p + "attn_v.bias"] = rng.vector(kv, 0.1)
        if o.get("qk_norm"):
            t[p + "attn_q_norm.weight"] = rng.norm(HEAD_DIM)
            t[p + "attn_k_norm.weight"] = rng.norm(HEAD_DIM)
        t[p + "attn_output.weight"] = rng.matrix(HIDDEN, q)
        t[p + "ffn_norm.weight"] = rng.norm(HIDDEN)
        if o.get("experts"):
            t[p + "ffn_gate_inp.weight"] = rng.matrix(EXPERTS, HIDDEN, gain=3.0)
            t[p + "ffn_gate_exps.weight"] = rng.stack(EXPERTS, eff, HIDDEN)
            t[p + "ffn_up_exps.weight"] = rng.stack(EXPERTS, eff, HIDDEN)
            t[p + "ffn_down_exps.weight"] = rng.stack(EXPERTS, HIDDEN, eff)
            if o.get("shared"):
                s = 2 * EXPERT_FFN
                t[p + "ffn_gate_inp_shexp.weight"] = rng.vector(HIDDEN, 1.0 / math.sqrt(HIDDEN))
                t[p + "ffn_gate_shexp.weight"] = rng.matrix(s, HIDDEN)
                t[p + "ffn_up_shexp.weight"] = rng.matrix(s, HIDDEN)
                t[p + "ffn_down_shexp.weight"] = rng.matrix(HIDDEN, s)
        else:
            t[p + "ffn_gate.weight"] = rng.matrix(FFN, HIDDEN)
            t[p + "ffn_up.weight"] = rng.matrix(FFN, HIDDEN)
            t[p + "ffn_down.weight"] = rng.matrix(HIDDEN, FFN)
    for n, a in t.items():
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)
    return path


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True, help="a GGUF whose tokenizer the models take (SmolLM2-135M)")
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="*", default=list(FAMILIES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        path = make(name, a.vocab, a.out)
        print(f"{path} {sha256(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
