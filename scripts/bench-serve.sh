#!/usr/bin/env bash
# Runs ../shared/tools/slo_probe.py against `sloserve serve` (release build) and, when
# llama.cpp's llama-server is found, against llama-server with 16 slots on the same
# model in the same sitting: for each run, each workload (plain and --chat), one probe
# per server back to back, so machine drift hits both alike; run r sends the probe's
# prompts of seed r, new to both servers (their prompt caches only help within a run). Prints per workload the
# median over RUNS of TTFT p50/p95, per-stream tok/s (1000 / TPOT p50) and total
# output tok/s for each server, and the ratios sloserve : llama-server.
#
# usage: scripts/bench-serve.sh [RUNS] [extra `sloserve serve` flags...]
# env:   LLAMA_BIN  folder holding llama-server and its libraries (default: the one
#                   ../shared/tools/build-llama-server.sh builds; unset/missing = sloserve only)
#        ONLY       a regex of workload names to run (default: c1, c16, prefix; also the real-model
#                   issue's q-c1, q-c8, q-long: 200-word prompts with 48 tokens out at
#                   concurrency 1 and 8, and one 2,000-token prompt at a time (slo_probe's words are
#                   about a token each); each also -chat)
#        OUT        output folder (default out/bench-serve): results.jsonl, table.md, logs
#        MODEL      the GGUF file both servers load (default: the 135M default model)
#        LLAMA_CTX  llama-server's -c, shared by its 16 slots (default 16384; q-long needs
#                   2,100 tokens a slot: 40960)
# e.g.   MODEL=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf LLAMA_CTX=40960 \
#          ONLY='^q-' scripts/bench-serve.sh 3
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}; shift || true
PROBE=${PROBE:-../shared/tools/slo_probe.py}
BIN=${BIN:-target/release/sloserve}
OUT=${OUT:-out/bench-serve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
LLAMA_CTX=${LLAMA_CTX:-16384}
LLAMA_BIN=${LLAMA_BIN:-$HOME/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
ONLY=${ONLY:-'^(c1|c16|prefix)(-chat)?$'}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
wait_ready() { # url path
  for _ in $(seq 900); do curl -sf "$1$2" >/dev/null && return 0; sleep 0.2; done
  echo "server at $1 never became ready" >&2; exit 1
}

SERVERS=("sloserve|http://127.0.0.1:8077")
"$BIN" serve --model "$MODEL" --port 8077 "$@" > "$OUT/sloserve.log" 2>&1 &
PIDS+=($!)
wait_ready http://127.0.0.1:8077 /ready
if [ -x "$LLAMA_BIN/llama-server" ]; then
  LD_LIBRARY_PATH="$LLAMA_BIN" "$LLAMA_BIN/llama-server" -m "$MODEL" --port 8078 -np 16 -c "$LLAMA_CTX" -t 2 \
    > "$OUT/llama-server.log" 2>&1 &
  PIDS+=($!)
  wait_ready http://127.0.0.1:8078 /health
  SERVERS+=("llama-server|http://127.0.0.1:8078")
else
  echo "no llama-server in $LLAMA_BIN: measuring sloserve only" >&2
fi

WORKLOADS=(
  "c1|--concurrency 1 --requests 8 --prompt-words 200 --max-tokens 64 --ignore-eos"
  "c16|--concurrency 16 --requests 48 --prompt-words 200 --max-tokens 64 --ignore-eos"
  "prefix|--concurrency 8 --requests 32 --prompt-words 40 --shared-prefix-words 400 --max-tokens 32 --ignore-eos"
  "q-c1|--concurrency 1 --requests 6 --prompt-words 200 --max-tokens 48 --ignore-eos"
  "q-c8|--concurrency 8 --requests 16 --prompt-words 200 --max-tokens 48 --ignore-eos"
  "q-long|--concurrency 1 --requests 3 --prompt-words 2000 --max-tokens 16 --ignore-eos"
)
: > "$OUT/results.jsonl"
for r in $(seq "$RUNS"); do
  for w in "${WORKLOADS[@]}"; do
    name=${w%%|*}; flags=${w#*|}
    for chat in "" "--chat"; do
      wl="$name${chat:+-chat}"
      [[ "$wl" =~ $ONLY ]] || continue
      for s in "${SERVERS[@]}"; do
        server=${s%%|*}; url=${s#*|}
        echo "run $r/$RUNS  $wl  $server  (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        # A fresh seed per run: every run's prompts are new to both servers' caches.
        res=$(python3 "$PROBE" --url "$url" $flags $chat --seed "$r")
        echo "{\"server\": \"$server\", \"workload\": \"$wl\", \"run\": $r, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"result\": $res}" >> "$OUT/results.jsonl"
      done
    done
  done
done
python3 - "$OUT/results.jsonl" "$RUNS" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["workload"], {}).setdefault(r["server"], []).append(r["result"])
def med(rs, f):
    v = [f(x) for x in rs if f(x) is not None]
    return statistics.median(v) if v else float("nan")
metrics = [
    ("TTFT p50 ms", lambda x: x["ttft_ms"]["p50"], "lower"),
    ("TTFT p95 ms", lambda x: x["ttft_ms"]["p95"], "lower"),
    ("per-stream tok/s", lambda x: 1000 / x["tpot_ms"]["p50"] if x["tpot_ms"]["p50"] else None, "higher"),
    ("total out tok/s", lambda x: x["output_tok_per_s"], "higher"),
]
servers = sorted({r["server"] for r in rows}, key=lambda s: s != "sloserve")
print(f"Median of {sys.argv[2]} runs per cell; failed requests: " + ", ".join(
    f"{s} {sum(x['failed'] for w in by.values() for x in w.get(s, []))}" for s in servers))
print()
head = "| workload | " + " | ".join(f"{m} ({s})" for m, _, _ in metrics for s in servers)
if len(servers) == 2:
    head += " | " + " | ".join(f"{m} ×" for m, _, _ in metrics)
print(head + " |")
print("|" + " --- |" * (head.count("|")))
for w, per in by.items():
    cells = []
    vals = {}
    for m, f, _ in metrics:
        for s in servers:
            vals[(m, s)] = med(per.get(s, []), f)
            cells.append(f"{vals[(m, s)]:.0f}" if vals[(m, s)] >= 10 else f"{vals[(m, s)]:.1f}")
    if len(servers) == 2:
        for m, _, better in metrics:
            a, b = vals[(m, servers[0])], vals[(m, servers[1])]
            # "×" = how many times better sloserve is (>1 = sloserve better)
            cells.append(f"{(b / a if better == 'lower' else a / b):.2f}")
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
