#!/usr/bin/env bash
# Gemma 3 270M Q4_K_M speed, sloserve beside llama.cpp on the same file in one sitting,
# 2 threads: sloserve's forward bench (prefill 512, decode at batch 1, 8 and 32, fast
# precision), then llama-bench (pp512, tg128) and llama-batched-bench (128+64 at B=1
# and 32) when llama.cpp's binaries are found, then (unless NO_SERVE=1) the servers
# under ../shared/tools/slo_probe.py at concurrency 1 and 16 (scripts/bench-serve.sh;
# completions only: the model has no chat template).
#
# usage: scripts/bench-gemma3.sh [RUNS]     (RUNS for bench-serve.sh, default 3)
# env:   LLAMA_BIN  as for bench-serve.sh;  QUICK=1  a smoke run (forward bench --quick)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/gemma-3-270m-q4_k_m.gguf
LLAMA_BIN=${LLAMA_BIN:-$HOME/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
./scripts/fetch-model.sh gemma3-270m
echo "== sloserve forward bench ($MODEL, 2 threads)"
RAYON_NUM_THREADS=2 cargo bench -p sloserve-model --bench forward -- --fast-only \
  --model "$MODEL" ${QUICK:+--quick}
if [ -x "$LLAMA_BIN/llama-bench" ]; then
  echo "== llama-bench"
  LD_LIBRARY_PATH="$LLAMA_BIN" "$LLAMA_BIN/llama-bench" -m "$MODEL" -t 2 -p 512 -n 128
  echo "== llama-batched-bench"
  LD_LIBRARY_PATH="$LLAMA_BIN" "$LLAMA_BIN/llama-batched-bench" -m "$MODEL" -t 2 -c 16384 \
    -npp 128 -ntg 64 -npl 1,32
else
  echo "no llama-bench in $LLAMA_BIN (../shared/tools/build-llama-server.sh builds it): sloserve only" >&2
fi
if [ -z "${NO_SERVE:-}" ]; then
  MODEL=$MODEL ONLY='^(c1|c16)$' OUT=out/bench-gemma3 ./scripts/bench-serve.sh "${1:-3}" --threads 2
fi
