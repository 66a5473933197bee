#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-batched-bench and llama-server with AVX2 and FMA
# only (every AVX-512 and VNNI switch off), from the same llama-cpp-python source as
# ../shared/tools/build-llama-server.sh: the peer for sloserve's AVX2 route
# (`SLOSERVE_ISA=avx2`) on a machine that has AVX-512, i.e. what an AVX2-only EPYC runs.
# Prints the folder with the binaries. About 10 minutes on 2 cores; cached afterwards.
set -euo pipefail
VER=0.3.36
ROOT=${PEERS_DIR:-$HOME/.cache/sloserve-peers}
SRC=$ROOT/llama_cpp_python-$VER/vendor/llama.cpp
BIN=$SRC/build-avx2/bin
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-batched-bench" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$ROOT"; cd "$ROOT"
[ -x venv/bin/python ] || python3 -m venv venv
venv/bin/pip -q install scikit-build-core cmake ninja >&2
[ -f llama_cpp_python-$VER.tar.gz ] || venv/bin/pip download -q --no-deps --no-binary=:all: --no-build-isolation -d . llama-cpp-python==$VER >&2
[ -d llama_cpp_python-$VER ] || tar xzf llama_cpp_python-$VER.tar.gz
cd "$SRC"
OFF=""
for f in AVX512 AVX512_VNNI AVX512_BF16 AVX512_VBMI AVX_VNNI AMX_TILE AMX_INT8 AMX_BF16; do OFF="$OFF -DGGML_$f=OFF"; done
PATH=$ROOT/venv/bin:$PATH cmake -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $OFF >&2
PATH=$ROOT/venv/bin:$PATH ninja -C build-avx2 -j"$(nproc)" llama-server llama-bench llama-batched-bench >&2
echo "$BIN"
