#!/usr/bin/env bash
# Runs each cargo-fuzz target in fuzz/ for a bounded time and prints a summary.
# Usage: scripts/fuzz.sh SECONDS TARGET...   (make fuzz FUZZ_SECS=60 runs all of them)
# cargo-fuzz drives libFuzzer, which needs nightly-only rustc flags (-Cpasses=sancov,
# -Zsanitizer); on a stable toolchain RUSTC_BOOTSTRAP=1 unlocks them. Crashes land in
# fuzz/artifacts/TARGET/ (reproduce: cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...).
set -euo pipefail
secs=${1:?usage: scripts/fuzz.sh SECONDS TARGET...}
shift
cd "$(dirname "$0")/.."
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 2
fi
export RUSTC_BOOTSTRAP=1
mkdir -p fuzz/logs
cargo fuzz build -s none --fuzz-dir fuzz
status=0
printf '%-22s %8s %8s %10s  %s\n' target seconds runs corpus result
for t in "$@"; do
    log=fuzz/logs/$t.log
    mkdir -p "fuzz/corpus/$t"
    start=$(date +%s)
    if cargo fuzz run -s none --fuzz-dir fuzz "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 >"$log" 2>&1; then
        result="no crash"
    else
        result="FAILED (see $log and fuzz/artifacts/$t/)"
        status=1
    fi
    took=$(( $(date +%s) - start ))
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    corpus=$(ls "fuzz/corpus/$t" | wc -l)
    printf '%-22s %8s %8s %10s  %s\n' "$t" "$took" "${runs:-?}" "$corpus" "$result"
done
exit $status
