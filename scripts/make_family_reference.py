#!/usr/bin/env python3
"""Records llama.cpp's exact answers on the generated family models (scripts/make_family_models.py):
for each file, llama-server (F32 weights as written, F32 KV cache, flash attention off) runs
greedy decoding of 32 tokens (EOS ignored; one request a token, the prompt cached) from seeded
prompts given as token ids, one of them over
2,000 tokens, with the top-5 logprobs of every step. Writes
crates/model/tests/data/llamacpp-f32-family-<name>.jsonl, each record with the file's sha256.
`gpt-oss`'s experts are MXFP4, which llama.cpp multiplies with activations rounded to Q8_0 (its
record is the bar for fast precision); `gpt-oss-f32` holds the same values as F32, all in F32 (the
exact reference).
`phi3` (LongRoPE) is recorded twice: at a context of 4,096 (llama-server's `-c 4096`, over the file's
original context of 1,024: llama.cpp takes the long factors, `n_ctx_seq > n_ctx_orig_yarn`) with the
five prompts, and as `phi3-short` at `-c 1024` (the short factors) with the four prompts that fit;
`phi4-mini` (partial rotary, tied output) at 4,096; `phi3-q8_0` on the phi3 file quantized to Q8_0 by
llama-quantize (the bar for fast precision with `--quantize q8_0`).
Standard library only; talks to llama-server on 127.0.0.1 only.

Usage: make_family_reference.py --bin <llama.cpp build/bin> --models models/generated [names...]
"""

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from make_qwen_reference import post, start_server  # noqa: E402

VOCAB_LO, VOCAB_HI = 200, 49000
PROMPTS = [("p1", 6), ("p2", 17), ("p3", 64), ("p4", 300), ("long", 2100)]
# A record set made on another set's file with other llama-server flags, or on that file quantized
# by llama-quantize (the record carries the generated file's sha256, which a test re-quantizes with
# `--quantize`): name -> (file, flags, prompts, llama-quantize type or None).
VARIANTS = {
    "phi3-short": ("phi3", ["-c", "1024"], PROMPTS[:4], None),
    "phi3-q8_0": ("phi3", [], PROMPTS, "Q8_0"),
}


def prompt_ids(name, pid, n):
    # A twin with its experts in F32 (`gpt-oss-f32`) gets its model's prompts, a variant its file's.
    rng = random.Random(f"{VARIANTS.get(name, (name,))[0].removesuffix('-f32')}/{pid}")
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record(port, name, pid, n, sha):
    """One token a request (the prompt cached between them): llama-server leaves out of
    `completion_probabilities` a token whose text is not whole UTF-8, so one request of 32 tokens
    loses steps. Such a step keeps its id (`tokens`) with an empty top-5."""
    ids = prompt_ids(name, pid, n)
    probs = []
    for _ in range(32):
        gen = [p["id"] for p in probs]
        out = post(port, "/completion", {
            "prompt": ids + gen, "n_predict": 1, "temperature": 0, "n_probs": 5, "ignore_eos": True,
            "post_sampling_probs": False, "cache_prompt": True, "seed": 0, "return_tokens": True,
        })
        step = out.get("completion_probabilities") or [{"id": out["tokens"][0], "top_logprobs": []}]
        assert len(step) == 1 and out["tokens"] == [step[0]["id"]], (pid, out["tokens"], len(step))
        probs.append(step[0])
    top1 = [round(2.718281828 ** p["top_logprobs"][0]["logprob"], 3) for p in probs if p["top_logprobs"]]
    print(f"{name} {pid}: {len(ids)} prompt tokens, top-1 probabilities {top1[:8]}...", file=sys.stderr)
    return {
        "id": pid, "kind": "ids", "model_sha256": sha, "prompt_token_ids": ids,
        "greedy_token_ids": [p["id"] for p in probs],
        "top5_logprobs_per_step": [
            [{"id": t["id"], "logprob": t["logprob"]} for t in p["top_logprobs"]] for p in probs
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", default="crates/model/tests/data")
    ap.add_argument("names", nargs="*", default=[
        "llama3", "mixtral", "qwen2-yarn", "qwen2moe", "qwen3moe", "gpt-oss", "gpt-oss-f32", "phi3",
        "phi3-short", "phi3-q8_0", "phi4-mini"])
    a = ap.parse_args()
    for name in a.names:
        file, flags, prompts, qtype = VARIANTS.get(name, (name, [], PROMPTS, None))
        path = os.path.join(a.models, f"{file}.gguf")
        sha = sha256(path)
        if qtype:
            quantized = os.path.join(tempfile.mkdtemp(), f"{file}-{qtype}.gguf")
            env = dict(os.environ, LD_LIBRARY_PATH=a.bin)
            subprocess.run([os.path.join(a.bin, "llama-quantize"), path, quantized, qtype], env=env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            path = quantized
        extra = ["-ctk", "f32", "-ctv", "f32", "-fa", "off"] + flags
        if name.startswith("gpt-oss"):
            # The sliding-window layers' cache kept whole, so the cached prompt is reused as is.
            extra.append("--swa-full")
        proc, port = start_server(a.bin, path, extra)
        try:
            recs = [record(port, name, pid, n, sha) for pid, n in prompts]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        out = os.path.join(a.out, f"llamacpp-f32-family-{name}.jsonl")
        with open(out, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
