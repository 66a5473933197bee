#!/usr/bin/env bash
# Where one forward-bench case spends its time, per operation: `perf record` of the
# case (its timed runs; loading and setup skipped by a start delay), grouped by
# scripts/perf_ops.py. Usage:
#   scripts/profile-ops.sh CASE [BENCH_BINARY] [-- extra forward-bench flags]
# CASE: decode_bN or prefill_512. BENCH_BINARY defaults to this tree's forward bench
# (pass an older build's for a before/after); DELAY_MS (default 8000) is how long
# after the start recording begins. docs/profile-batches.md has figures.
set -euo pipefail
cd "$(dirname "$0")/.."
case=$1; shift
bin=${1:-}; [ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
[ -n "$bin" ] || bin=$(scripts/forward-bench-bin.sh)
out=$(realpath -m "${OUT:-target/profile/$case}.perf")
mkdir -p "$(dirname "$out")"
(cd crates/model && perf record -q -F 999 --delay="${DELAY_MS:-8000}" -o "$out" \
  "$bin" --fast-only --only "$case" "$@" 2>&1 | grep -E '^(fast|int8) ')
python3 scripts/perf_ops.py "$out"
