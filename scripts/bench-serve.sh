#!/usr/bin/env bash
# Runs ../shared/tools/slo_probe.py against `sloserve serve` (release build) for the
# README's workloads, RUNS times each, and prints the median TTFT p50/p95 and tok/s.
# usage: scripts/bench-serve.sh [RUNS] [extra serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}; shift || true
PROBE=${PROBE:-../shared/tools/slo_probe.py}
PORT=${PORT:-8077}
BIN=${BIN:-target/release/sloserve}
OUT=${OUT:-out/bench-serve}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
"$BIN" serve --port "$PORT" "$@" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.2; done
WORKLOADS=(
  "c1|--concurrency 1 --requests 8 --prompt-words 200 --max-tokens 64 --ignore-eos"
  "c16|--concurrency 16 --requests 48 --prompt-words 200 --max-tokens 64 --ignore-eos"
  "prefix|--concurrency 8 --requests 32 --prompt-words 40 --shared-prefix-words 400 --max-tokens 32 --ignore-eos"
)
: > "$OUT/results.jsonl"
for w in "${WORKLOADS[@]}"; do
  name=${w%%|*}; flags=${w#*|}
  for chat in "" "--chat"; do
    for r in $(seq "$RUNS"); do
      res=$(python3 "$PROBE" --url "http://127.0.0.1:$PORT" $flags $chat)
      echo "{\"workload\": \"$name${chat:+-chat}\", \"run\": $r, \"result\": $res}" | tee -a "$OUT/results.jsonl"
    done
  done
done
python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["workload"], []).append(r["result"])
print("| workload | runs | failed | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | output tok/s |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for w, rs in by.items():
    med = lambda f: statistics.median(f(x) for x in rs)
    print(f"| {w} | {len(rs)} | {sum(x['failed'] for x in rs)} | {med(lambda x: x['ttft_ms']['p50']):.0f} | "
          f"{med(lambda x: x['ttft_ms']['p95']):.0f} | {med(lambda x: x['tpot_ms']['p50']):.1f} | "
          f"{med(lambda x: x['output_tok_per_s']):.0f} |")
PY
