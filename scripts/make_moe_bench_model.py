#!/usr/bin/env python3
"""Writes a Qwen3-30B-A3B-shaped GGUF for speed benchmarks: the real model's tensor names, shapes and
Q4_K_M type mix (llama.cpp's quantizer: Q6_K for attn_v and ffn_down_exps in its `use_more_bits`
layers and for the output matrix, Q4_K elsewhere; norms and the router F32), with seeded random valid
blocks (finite small f16 scales, random quants) and Qwen2.5's real vocabulary. Speed does not depend
on the weights' values. `--layers N` keeps the first N of the 48 layers (a decode token's cost is
the per-layer cost times the layer count, so tok/s scales by 48/N for both engines alike): the full
file is ~18.6 GB, more than a 24 GB machine holds beside a second engine's page cache.

Usage: make_moe_bench_model.py --vocab models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
           --out /tmp/qwen3moe-30b-a3b-q4km-12l.gguf --layers 12
"""

import argparse
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(__file__))
from make_family_models import copy_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType
ARCH = "qwen3moe"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FULL_LAYERS = 2048, 32, 4, 128, 48
EXPERTS, USED, EXPERT_FFN, VOCAB = 128, 8, 768, 151936


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def blocks(rng, qtype, n_blocks):
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale = lambda v: np.frombuffer(np.full(n_blocks, v, dtype=np.float16).tobytes(), np.uint8).reshape(n_blocks, 2)
    if qtype == Q.Q4_K:
        b[:, 0:2], b[:, 2:4] = scale(0.004), scale(0.002)
    elif qtype == Q.Q6_K:
        b[:, 208:210] = scale(0.0005)
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=FULL_LAYERS)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(a.out, ARCH)
    w.add_name(f"Qwen3-30B-A3B-shaped Q4_K_M, {a.layers} of 48 layers, random weights")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    copy_tokenizer(w, a.vocab)
    k = lambda s: f"{ARCH}.{s}"
    for key, v in [("context_length", 40960), ("embedding_length", HIDDEN), ("block_count", a.layers),
                   ("feed_forward_length", 6144), ("attention.head_count", HEADS),
                   ("attention.head_count_kv", KV_HEADS), ("attention.key_length", HEAD_DIM),
                   ("attention.value_length", HEAD_DIM), ("expert_count", EXPERTS),
                   ("expert_used_count", USED), ("expert_feed_forward_length", EXPERT_FFN)]:
        w.add_uint32(k(key), v)
    w.add_float32(k("attention.layer_norm_rms_epsilon"), 1e-6)
    w.add_float32(k("rope.freq_base"), 1e6)

    # (name, shape rows-first, type); F32 tensors carry their values.
    plan = [("token_embd.weight", (VOCAB, HIDDEN), Q.Q4_K), ("output_norm.weight", (HIDDEN,), Q.F32),
            ("output.weight", (VOCAB, HIDDEN), Q.Q6_K)]
    for i in range(a.layers):
        p = f"blk.{i}."
        more = use_more_bits(i, FULL_LAYERS)
        plan += [(p + "attn_norm.weight", (HIDDEN,), Q.F32),
                 (p + "attn_q.weight", (HEADS * HEAD_DIM, HIDDEN), Q.Q4_K),
                 (p + "attn_k.weight", (KV_HEADS * HEAD_DIM, HIDDEN), Q.Q4_K),
                 (p + "attn_v.weight", (KV_HEADS * HEAD_DIM, HIDDEN), Q.Q6_K if more else Q.Q4_K),
                 (p + "attn_q_norm.weight", (HEAD_DIM,), Q.F32), (p + "attn_k_norm.weight", (HEAD_DIM,), Q.F32),
                 (p + "attn_output.weight", (HIDDEN, HEADS * HEAD_DIM), Q.Q4_K),
                 (p + "ffn_norm.weight", (HIDDEN,), Q.F32),
                 (p + "ffn_gate_inp.weight", (EXPERTS, HIDDEN), Q.F32),
                 (p + "ffn_gate_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), Q.Q4_K),
                 (p + "ffn_up_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), Q.Q4_K),
                 (p + "ffn_down_exps.weight", (EXPERTS, HIDDEN, EXPERT_FFN), Q.Q6_K if more else Q.Q4_K)]
    for name, shape, qt in plan:
        if qt == Q.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            bs, ts = gguf.GGML_QUANT_SIZES[qt]
            byte_shape = (*shape[:-1], shape[-1] // bs * ts)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for n, (name, shape, qt) in enumerate(plan):
        if qt == Q.F32:
            scale = 0.02 if "gate_inp" in name else 0.0
            t = (1.0 + scale * rng.standard_normal(shape, dtype=np.float32)) if scale == 0.0 else \
                (scale * rng.standard_normal(shape, dtype=np.float32))
            t = t.astype(np.float32)
        else:
            bs, _ = gguf.GGML_QUANT_SIZES[qt]
            t = blocks(rng, qt, int(np.prod(shape)) // bs)
        w.write_tensor_data(t)
        total += t.nbytes
        print(f"\r{n + 1}/{len(plan)} tensors, {total / 1e9:.2f} GB", end="", file=sys.stderr)
    w.close()
    print(f"\nwrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
