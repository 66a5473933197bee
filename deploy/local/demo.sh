#!/usr/bin/env bash
# `make gateway-demo`: the local gateway stack (deploy/local/gateway.py up), a few requests
# through Envoy with the replica the EPP picked for each, then Envoy's access log live
# until Ctrl-C, which stops every process by its PID.
# usage: deploy/local/demo.sh SLOSERVE_BIN [gateway.py up flags, e.g. --mode direct]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=$1; shift
RUN=${RUN_DIR:-out/gateway}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
python3 deploy/local/gateway.py up --bin "$BIN" --model "$MODEL" --run-dir "$RUN" "$@"
trap 'python3 deploy/local/gateway.py down --run-dir "$RUN"' EXIT
MODEL_NAME=$(basename "$MODEL" .gguf)
PORT=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ports']['envoy'])" "$RUN/stack.json")
echo
for q in "Name a colour." "Name a fruit." "Name a river."; do
  curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -H 'x-llm-d-slo-ttft-ms: 2000' \
    -d "{\"model\": \"$MODEL_NAME\", \"messages\": [{\"role\": \"user\", \"content\": \"$q\"}], \"max_tokens\": 12}" |
    python3 -c "import json,sys; r=json.load(sys.stdin); print('>', repr(r['choices'][0]['message']['content']))"
done
sleep 0.5
echo
echo "Envoy's access log (picked = the replica the EPP chose):"
tail -n 3 "$RUN/logs/envoy-access.log"
echo
python3 deploy/local/gateway.py status --run-dir "$RUN"
echo
echo "OpenAI API through the gateway: http://127.0.0.1:$PORT/v1   logs: $RUN/logs/"
echo "Ctrl-C stops the stack. Live access log:"
tail -n 0 -f "$RUN/logs/envoy-access.log" &
TAIL=$!
trap 'kill $TAIL 2>/dev/null; python3 deploy/local/gateway.py down --run-dir "$RUN"' EXIT
wait $TAIL || true
