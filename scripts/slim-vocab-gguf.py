#!/usr/bin/env python3
"""Copies llama.cpp's tokenizer test vocabularies into crates/model/tests/data/vocab/.

For each name, reads `ggml-vocab-NAME.gguf` from llama.cpp's `models/` folder and writes
`ggml-vocab-NAME.gguf.gz`: a GGUF with no tensors and only the metadata a tokenizer reads
(`general.architecture`, `general.name` and the `tokenizer.ggml.*` keys; chat templates
are left out), each key/value copied byte for byte, gzip-compressed. The `.inp` / `.out`
test files are copied as they are.

Usage (the `gguf` package from PyPI, in a git-ignored venv):
    python3 -m venv .venv-gguf && .venv-gguf/bin/pip install gguf
    .venv-gguf/bin/python scripts/slim-vocab-gguf.py LLAMA_CPP_DIR NAME...
"""

import gzip
import shutil
import struct
import sys
from pathlib import Path

from gguf import GGUFReader

KEEP_GENERAL = {"general.architecture", "general.name"}
OUT = Path(__file__).resolve().parent.parent / "crates/model/tests/data/vocab"


def keep(key: str) -> bool:
    return key in KEEP_GENERAL or key.startswith("tokenizer.ggml.")


def slim(src: Path, dst: Path) -> None:
    reader = GGUFReader(src)
    if len(reader.tensors) != 0:
        print(f"{src.name}: {len(reader.tensors)} tensors left out")
    fields = [f for k, f in reader.fields.items() if not k.startswith("GGUF.") and keep(k)]
    version = int(reader.fields["GGUF.version"].parts[0][0])
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, 0, len(fields))
    for f in fields:
        # A field's parts are its raw bytes in the file: key, type, value(s).
        for part in f.parts:
            out += part.tobytes()
    with gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as z:
        z.write(bytes(out))
    print(f"{dst.name}: {len(fields)} keys, {len(out)} bytes, {dst.stat().st_size} gzipped")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    models = Path(sys.argv[1]) / "models"
    OUT.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:]:
        src = models / f"ggml-vocab-{name}.gguf"
        slim(src, OUT / f"ggml-vocab-{name}.gguf.gz")
        for ext in ("inp", "out"):
            shutil.copyfile(f"{src}.{ext}", OUT / f"ggml-vocab-{name}.gguf.{ext}")


if __name__ == "__main__":
    main()
