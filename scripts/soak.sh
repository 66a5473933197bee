#!/usr/bin/env bash
# Overload soak (loopback only): starts `sloserve serve` on 127.0.0.1, calibrates
# its capacity, offers twice that for DURATION seconds with mixed classes, dropped
# streams and stalled readers (scripts/soak.py), then checks the pass criteria of
# issue 13 and stops the server. Figures go to stdout and $OUT (JSON).
#
#   scripts/soak.sh                      # the full soak: 5 minutes
#   DURATION=30 CALIBRATE=10 scripts/soak.sh   # a smoke run
#
# Env: SLOSERVE_BIN (default target/release/sloserve, built if missing), MODEL,
# PORT (8093), DURATION (300), CALIBRATE (30), OVERLOAD (2.0), TTFT_SLO_MS (2000),
# MAX_TOKENS (64), OUT (soak.json), SERVE_ARGS (extra flags for serve),
# MAX_QUEUE_WAIT (30: the soak's clients give up after 120 s, so queue waits are
# bounded well below that; serve's default is 60).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLOSERVE_BIN:-target/release/sloserve}
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
python3 scripts/soak.py --url "http://127.0.0.1:$PORT" --pid $PID \
  --duration "$DURATION" --calibrate "$CALIBRATE" --overload "${OVERLOAD:-2.0}" \
  --ttft-slo-ms "${TTFT_SLO_MS:-2000}" --max-tokens "${MAX_TOKENS:-64}" --json "$OUT"
RC=$?
set -e
echo "server log: $LOG ($(grep -c client_stalled "$LOG" || true) client_stalled, $(grep -c 'panicked' "$LOG" || true) panics)"
kill -TERM $PID
wait $PID || true
exit $RC
