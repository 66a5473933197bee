#!/usr/bin/env bash
# Per-operation instruction counts of one batch-1 decode run (32 tokens) of the forward
# bench under callgrind, on one compute thread (so every kernel runs on the calling
# thread): stable on a busy machine, unlike timings. Usage:
#   scripts/profile-decode.sh [OUT_PREFIX]     (default target/profile/decode)
# Prints the table from scripts/callgrind_ops.py; docs/profile-decode.md has the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/profile/decode}
mkdir -p "$(dirname "$out")"
out=$(realpath "$out")
bin=$(scripts/forward-bench-bin.sh)
rm -f "$out".callgrind*
# --dump-before/after split the profile at each decode_once call (warm-up, run 1, run 2).
(cd crates/model && RAYON_NUM_THREADS=1 valgrind --tool=callgrind \
  --dump-before='*decode_once*' --dump-after='*decode_once*' \
  --callgrind-out-file="$out.callgrind" "$bin" --quick --fast-only --only decode_b1 >/dev/null)
# Dump 1 ends before the first call, 2 is the warm-up run, 3 the first timed run.
python3 scripts/callgrind_ops.py "$out.callgrind.3" 32
