#!/usr/bin/env bash
# Makes llama.cpp's reference records on Qwen2.5-Coder-0.5B-Instruct Q4_K_M into crates/model/tests/data/
# (described in its README.md): builds llama.cpp (../shared/tools/build-llama-server.sh), dequantizes the
# file to F32 (not committed; QWEN_F32, default /tmp), and runs scripts/make_qwen_reference.py, which serves
# each file on a loopback port and records /tokenize, the F32 greedy records and the Q4_K_M ones.
# Usage: scripts/make-qwen-reference.sh [path/to/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
Q4=${1:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
[ -f "$Q4" ] || ./scripts/fetch-model.sh qwen0.5b
F32=${QWEN_F32:-/tmp/qwen2.5-coder-0.5b-instruct-f32.gguf}
BUILD=${LLAMA_BUILD_SCRIPT:-../shared/tools/build-llama-server.sh}
BIN=$("$BUILD" | tail -n 1)
SRC=$(cd "$BIN/../.." && pwd)
if [ ! -s "$F32" ]; then
  LD_LIBRARY_PATH="$BIN" "$BIN/llama-quantize" --allow-requantize "$Q4" "$F32.tmp" F32 >&2
  mv "$F32.tmp" "$F32"
fi
echo "Q4_K_M sha256: $(sha256sum "$Q4" | cut -d' ' -f1)" >&2
echo "llama.cpp: $(LD_LIBRARY_PATH="$BIN" "$BIN/llama-server" --version 2>&1 | tr '\n' ' ')" >&2
python3 scripts/make_qwen_reference.py --bin "$BIN" --src "$SRC" --q4 "$Q4" --f32 "$F32" \
  --out crates/model/tests/data
