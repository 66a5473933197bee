#!/usr/bin/env bash
# The `--quantize` table for the default model (README "Quantization as a lever"): per
# weight type (the file's own Q4_1, then q8_0, q4_0, q4_1, f16 re-quantized at load),
# decode tok/s at batch 1 and 32 and prefill-512 tok/s (the forward bench, fast
# precision, 2 threads, median of its runs), the weights' bytes in their effective
# types, and accuracy against llama.cpp's exact reference (the quant_accuracy bench:
# step-0 argmax agreement, mean max step-0 top-5 logprob error, greedy agreement).
# Prints a markdown table and writes it to target/bench/quant-table.md.
#
# usage: scripts/quant_table.sh [--quick] [--accuracy-only | --speed-only]
#   --quick          forward bench --quick (2 runs: a smoke run, not for the README)
#   --accuracy-only  skip the speed columns (deterministic: fine on a busy machine)
#   --speed-only     skip the accuracy columns (needs a quiet machine)
# env:   BENCH_PROFILE  cargo profile for the benches (default bench; `dev` reuses a
#                       test build for a smoke run: the model crate is opt-level 3 there)
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="" ACC=1 SPEED=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK=--quick ;;
    --accuracy-only) SPEED="" ;;
    --speed-only) ACC="" ;;
    *) echo "usage: $0 [--quick] [--accuracy-only | --speed-only]" >&2; exit 2 ;;
  esac
done
TYPES=(file q8_0 q4_0 q4_1 f16)
OUTDIR=${CARGO_TARGET_DIR:-target}/bench
PROFILE=(--profile "${BENCH_PROFILE:-bench}")
mkdir -p "$OUTDIR"
if [ -n "$ACC" ]; then
  echo "== accuracy (quant_accuracy bench)" >&2
  cargo bench "${PROFILE[@]}" -p sloserve-model --bench quant_accuracy >&2
fi
if [ -n "$SPEED" ]; then
  for t in "${TYPES[@]}"; do
    echo "== speed: ${t} (forward bench, fast precision, 2 threads)" >&2
    q=(); [ "$t" = file ] || q=(--quantize "$t")
    RAYON_NUM_THREADS=2 cargo bench "${PROFILE[@]}" -p sloserve-model --bench forward -- --fast-only $QUICK "${q[@]}" >&2
  done
fi
python3 - "$OUTDIR" "$QUICK" "$ACC" "$SPEED" "${TYPES[@]}" <<'EOF' | tee "$OUTDIR/quant-table.md"
import json, os, sys
out, quick, acc, speed, types = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
accuracy = {}
a = load("quant-accuracy.json") if acc else None
for r in (a or {}).get("results", []):
    accuracy[r["quantize"] or "file"] = r
print("| weights | decode b1 tok/s | decode b32 tok/s | prefill 512 tok/s | weight bytes | step-0 argmax = ref | mean max top-5 logprob err | greedy tokens = ref |")
print("|---|---|---|---|---|---|---|---|")
for t in types:
    f = load("forward" + ("" if t == "file" else "-" + t) + ("-quick" if quick else "") + ".json") if speed else None
    med = {c["case"]: c["median_tok_s"] for c in (f or {}).get("results", []) if c["precision"] == "fast"}
    s = lambda case: f"{med[case]:.1f}" if case in med else "-"
    r = accuracy.get(t)
    label = "Q4_1 (the file)" if t == "file" else f"`--quantize {t}`"
    cols = [label, s("decode_b1"), s("decode_b32"), s("prefill_512")]
    if r:
        cols += [f'{r["weight_bytes"]:,}', f'{r["argmax_equal"]}/{r["prompts"]}',
                 f'{r["mean_max_top5_error"]:.4f}',
                 f'{r["greedy_equal_tokens"]}/{r["greedy_reference_tokens"]} ({r["greedy_whole"]}/{r["prompts"]} whole)']
    else:
        cols += ["-"] * 4
    print("| " + " | ".join(cols) + " |")
if f and speed:
    print(f"\nforward bench: load {f.get('load_avg_before')} -> {f.get('load_avg_after')}{', --quick' if quick else ''}")
EOF
