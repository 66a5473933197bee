#!/usr/bin/env bash
# Builds the model crate's forward bench (bench profile) and prints its executable's path:
# the profiling scripts run it directly, under perf or valgrind, not through cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p sloserve-model --bench forward --no-run --message-format=json 2>/dev/null |
  python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "forward" and m.get("executable"):
        print(m["executable"])'
