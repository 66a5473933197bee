#!/usr/bin/env bash
# Cross-checks `sloserve bench` against the independent ../shared/tools/slo_probe.py on
# the same workload and server (a release `sloserve serve`): RUNS alternations of one
# probe run and one bench run, then the medians of TTFT p50 and output tok/s side by
# side (each run's prompts are new to the server: seeds differ per run and client). Then, when llama.cpp's llama-server is found, `sloserve bench` drives it (16
# slots, same model) with the same workload, showing bench works against a peer.
#
# usage: scripts/cross-check.sh [RUNS]
# env:   LLAMA_BIN (as in scripts/bench-serve.sh), OUT (default out/cross-check),
#        CONC (4), REQS (24), WORDS (200), MAXTOK (64)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
PROBE=${PROBE:-../shared/tools/slo_probe.py}
BIN=${BIN:-target/release/sloserve}
OUT=${OUT:-out/cross-check}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
LLAMA_BIN=${LLAMA_BIN:-$HOME/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
CONC=${CONC:-4}; REQS=${REQS:-24}; WORDS=${WORDS:-200}; MAXTOK=${MAXTOK:-64}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
wait_ready() { for _ in $(seq 900); do curl -sf "$1$2" >/dev/null && return 0; sleep 0.2; done; exit 1; }

"$BIN" serve --model "$MODEL" --port 8077 > "$OUT/sloserve.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:8077 /ready
URL=http://127.0.0.1:8077
: > "$OUT/probe.jsonl"
INPUT_LEN=""
for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS: slo_probe (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  python3 "$PROBE" --url "$URL" --concurrency "$CONC" --requests "$REQS" --prompt-words "$WORDS" \
    --max-tokens "$MAXTOK" --ignore-eos --seed "$r" >> "$OUT/probe.jsonl"
  # The same prompt length in tokens as the probe's prompts (the server's usage).
  [ -n "$INPUT_LEN" ] || INPUT_LEN=$(python3 -c "import json,sys; print(round(json.loads(open(sys.argv[1]).readline())['prompt_tokens_mean']))" "$OUT/probe.jsonl")
  echo "run $r/$RUNS: sloserve bench --input-len $INPUT_LEN (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "$BIN" bench --url "$URL" --concurrency "$CONC" --num-requests "$REQS" --input-len "$INPUT_LEN" \
    --output-len "$MAXTOK" --seed "$((100 + r))" --quiet --out "$OUT/bench-$r" > /dev/null
done
python3 - "$OUT" "$RUNS" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
probe = [json.loads(l) for l in open(f"{out}/probe.jsonl")]
bench = [json.load(open(f"{out}/bench-{r}/results.json"))["points"][0]["summary"] for r in range(1, runs + 1)]
p_ttft = statistics.median(p["ttft_ms"]["p50"] for p in probe)
p_tok = statistics.median(p["output_tok_per_s"] for p in probe)
b_ttft = statistics.median(b["ttft_ms"]["median"] for b in bench)
b_tok = statistics.median(b["output_throughput"] for b in bench)
print(f"| client (median of {runs} runs) | TTFT p50 ms | output tok/s |")
print("| --- | --- | --- |")
print(f"| slo_probe.py | {p_ttft:.0f} | {p_tok:.1f} |")
print(f"| sloserve bench | {b_ttft:.0f} | {b_tok:.1f} |")
print(f"| bench / probe | {b_ttft / p_ttft:.3f} | {b_tok / p_tok:.3f} |")
PY
if [ -x "$LLAMA_BIN/llama-server" ]; then
  LD_LIBRARY_PATH="$LLAMA_BIN" "$LLAMA_BIN/llama-server" -m "$MODEL" --port 8078 -np 16 -c 16384 -t 2 \
    > "$OUT/llama-server.log" 2>&1 &
  PIDS+=($!)
  wait_ready http://127.0.0.1:8078 /health
  echo "sloserve bench against llama-server (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "$BIN" bench --url http://127.0.0.1:8078 --concurrency "$CONC" --num-requests "$REQS" \
    --input-len "$INPUT_LEN" --output-len "$MAXTOK" --out "$OUT/bench-llama-server" | tee "$OUT/bench-llama-server.txt"
fi
