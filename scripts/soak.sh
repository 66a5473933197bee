#!/usr/bin/env bash
# Overload soak (loopback only): starts `sloserve serve` on 127.0.0.1, calibrates
# its capacity, offers twice that for DURATION seconds with mixed classes, dropped
# streams and stalled readers (scripts/soak.py), then checks the pass criteria of
# issue 13 and stops the server. Figures go to stdout and $OUT (JSON).
#
#   scripts/soak.sh                      # the full soak: 5 minutes
#   DURATION=30 CALIBRATE=10 scripts/soak.sh   # a smoke run
#   HOSTILE=1 scripts/soak.sh            # issue 55's hostile soak (below)
#
# HOSTILE=1: serves MODEL (default: Qwen2.5-Coder 0.5B) with two API keys and a
# Batch API quota (QUOTA bytes, 262144), then scripts/soak_hostile.py offers twice
# the capacity from key A (normal chats) while key B loops every hostile shape of
# issue 55 (scripts/soak_shapes.py); OUT defaults to soak-hostile.json.
#
# Env: SLOSERVE_BIN (default target/release/sloserve, built if missing), MODEL,
# PORT (8093), DURATION (300), CALIBRATE (30), OVERLOAD (2.0), TTFT_SLO_MS (2000),
# MAX_TOKENS (64), OUT (soak.json), SERVE_ARGS (extra flags for serve),
# MAX_QUEUE_WAIT (30: the soak's clients give up after 120 s, so queue waits are
# bounded well below that; serve's default is 60).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLOSERVE_BIN:-target/release/sloserve}
HOSTILE=${HOSTILE:-}
if [ -n "$HOSTILE" ]; then
  MODEL=${MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
  QUOTA=${QUOTA:-262144}
  KEY_A=sk-soak-a-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  KEY_B=sk-soak-b-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  DATA=$(mktemp -d /tmp/sloserve-soak-data.XXXXXX)
  export SLOSERVE_API_KEY="$KEY_A,$KEY_B"  # serve's --api-key, kept off the command line
  SERVE_ARGS="--batch-quota-bytes-per-key $QUOTA --data-dir $DATA ${SERVE_ARGS:-}"
  OUT=${OUT:-soak-hostile.json}
fi
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PORT=${PORT:-8093}
DURATION=${DURATION:-300}
CALIBRATE=${CALIBRATE:-30}
OUT=${OUT:-soak.json}
if [ ! -x "$BIN" ]; then
  cargo build --release --bin sloserve
fi
LOG=$(mktemp /tmp/sloserve-soak.XXXXXX.log)
"$BIN" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --default-ttft-slo-ms "${TTFT_SLO_MS:-2000}" --stream-write-timeout 3 \
  --max-queue-wait "${MAX_QUEUE_WAIT:-30}" \
  ${SERVE_ARGS:-} >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
  kill -0 $PID 2>/dev/null || { echo "server exited; log: $LOG"; tail -20 "$LOG"; exit 1; }
  sleep 0.5
done
set +e
COMMON=(--url "http://127.0.0.1:$PORT" --pid $PID --duration "$DURATION" --calibrate "$CALIBRATE"
  --overload "${OVERLOAD:-2.0}" --ttft-slo-ms "${TTFT_SLO_MS:-2000}" --max-tokens "${MAX_TOKENS:-64}" --json "$OUT")
if [ -n "$HOSTILE" ]; then
  python3 scripts/soak_hostile.py "${COMMON[@]}" --key-a "$KEY_A" --key-b "$KEY_B" --quota "$QUOTA"
else
  python3 scripts/soak.py "${COMMON[@]}"
fi
RC=$?
set -e
PANICS=$(grep -c 'panicked' "$LOG" || true)
echo "server log: $LOG ($(grep -c client_stalled "$LOG" || true) client_stalled, $PANICS panics)"
[ "$PANICS" = 0 ] || RC=1
kill -TERM $PID
wait $PID || true
[ -z "$HOSTILE" ] || rm -rf "$DATA"
exit $RC
