#!/usr/bin/env python3
"""Records llama.cpp's embeddings for sloserve's pooled requests (`/v1/embeddings`):
llama-server --embedding (F32 KV cache, flash attention off, the given --pooling) embeds a few
texts, each tokenized by llama.cpp as its embedding path does (`/tokenize` with `add_special`:
BOS / EOS as the vocabulary says), and the record keeps those ids, the normalised vector and the
file's sha256. Writes crates/model/tests/data/llamacpp-embed-<name>.jsonl.

Two models: the generated Qwen3-Embedding-shaped file (`models/generated/qwen3-embed.gguf`,
`qwen3.pooling_type` 3, `--pooling last`) and SmolLM2-135M dequantized to F32 (`llama-quantize
--allow-requantize IN OUT F32`, not committed; `--pooling mean`).
Standard library only; talks to llama-server on 127.0.0.1 only.

Usage: make_embedding_reference.py --bin <llama.cpp build/bin> --name NAME --model FILE
           --pooling last|mean [--sha-of FILE]
(--sha-of: the file the records are checked against when --model is its F32 twin.)
"""

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from make_qwen_reference import post, start_server, tokenize  # noqa: E402

TEXTS = [
    ("short", "Hello"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("query", "What is the capital of France?"),
    ("passage", "Paris is the capital and most populous city of France. It is located on the Seine "
                "river, in the north of the country, and has been a major centre of finance, "
                "diplomacy, commerce, fashion and science for centuries."),
    ("code", "fn main() {\n    println!(\"{}\", (1..=10).map(|x| x * x).sum::<u32>());\n}"),
    ("unicode", "Größe — 大きさ — размер: 12,345.67 €"),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pooling", required=True)
    ap.add_argument("--sha-of")
    a = ap.parse_args()
    sha = sha256(a.sha_of or a.model)
    proc, port = start_server(a.bin, a.model, ["--embedding", "--pooling", a.pooling,
                                               "-ctk", "f32", "-ctv", "f32", "-fa", "off"])
    out = os.path.join(os.path.dirname(__file__), "..", "crates", "model", "tests", "data",
                       f"llamacpp-embed-{a.name}.jsonl")
    try:
        with open(out, "w") as f:
            for tid, text in TEXTS:
                ids = tokenize(port, text, True)
                # Token ids in, so the vector is of exactly these ids.
                r = post(port, "/embedding", {"content": ids})
                vec = r[0]["embedding"] if isinstance(r, list) else r["embedding"]
                if vec and isinstance(vec[0], list):  # its rows: one when pooled
                    if len(vec) != 1:
                        sys.exit("llama-server returned per-token embeddings; check --pooling")
                    vec = vec[0]
                f.write(json.dumps({"id": tid, "text": text, "pooling": a.pooling, "model_sha256": sha,
                                    "token_ids": ids, "embedding": vec}) + "\n")
                print(f"{a.name} {tid}: {len(ids)} tokens, {len(vec)} dims", file=sys.stderr)
    finally:
        proc.kill()
    print(out, file=sys.stderr)


if __name__ == "__main__":
    main()
