#!/usr/bin/env bash
# Property-based API testing: starts `sloserve serve` on 127.0.0.1 (short context so
# every generation is quick) and runs schemathesis (from PyPI, in its own venv under
# .venv-schemathesis) against its /openapi.json: no 5xx, responses conform to the
# schema (status codes, content types, bodies). Prints schemathesis' summary.
#
#   scripts/schemathesis.sh                 # default: 50 examples per operation
#   MAX_EXAMPLES=200 scripts/schemathesis.sh
#
# Env: SLOSERVE_BIN (default target/release/sloserve, built if missing), MODEL,
# PORT (8094), MAX_EXAMPLES (50), API_KEY (default: a random key the server requires).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLOSERVE_BIN:-target/release/sloserve}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PORT=${PORT:-8094}
KEY=${API_KEY:-sk-schemathesis-$RANDOM$RANDOM}
VENV=.venv-schemathesis
if [ ! -x "$VENV/bin/schemathesis" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'schemathesis>=4,<5'
fi
if [ ! -x "$BIN" ]; then
  cargo build --release --bin sloserve
fi
LOG=$(mktemp /tmp/sloserve-schemathesis.XXXXXX.log)
"$BIN" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len 64 \
  --api-key "$KEY" --request-timeout 20 >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
  kill -0 $PID 2>/dev/null || { echo "server exited; log: $LOG"; tail -20 "$LOG"; exit 1; }
  sleep 0.5
done
set +e
"$VENV/bin/schemathesis" run "http://127.0.0.1:$PORT/openapi.json" \
  --header "Authorization: Bearer $KEY" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "${MAX_EXAMPLES:-50}" --workers 2 --request-timeout 60 --no-color
RC=$?
set -e
echo "server log: $LOG ($(grep -c 'panicked' "$LOG" || true) panics)"
kill -TERM $PID
wait $PID || true
exit $RC
