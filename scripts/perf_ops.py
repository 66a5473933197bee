#!/usr/bin/env python3
"""Where a forward-bench case spends its time, per operation, from a `perf record`
of it (scripts/profile-ops.sh). Usage: perf_ops.py PERF_DATA.

Self time per symbol (`perf report --no-children --sort symbol`), summed per
operation by name pattern; the rest is listed as "other". Percentages of all
samples after the recording's start delay (which skips loading and setup)."""
import re
import subprocess
import sys

OPS = [
    ("weight matmul: 8-bit GEMM", [r"int8_gemm::tile"]),
    ("weight matmul: f32 GEMM", [r"packed_gemm::kernel", r"gemm_f32", r"gemm::"]),
    ("weight matmul: decode GEMV / dot products",
     [r"q4_1_rows::dot", r"q8_0_rows::dot", r"quant_dot::", r"vec_dot", r"q4_1_rows::Q4_1Rows::matmul",
      r"q8_0_rows::Q8_0Rows::matmul", r"act_quant::gemv"]),
    ("activation quantization", [r"act_quant::", r"from_float", r"roundf"]),
    # libm's expf: the SiLU's, and before the f16 attention had its own vector exp, attention's.
    ("attention (paged, f16 KV)", [r"kernels::attention"]),
    ("RMS norm", [r"kernels::norm::"]),
    ("RoPE", [r"rope::"]),
    ("SiLU x up (and libm expf)", [r"kernels::activation::", r"expf"]),
    ("pool: waiting and hand-off", [r"kernels::pool::"]),
    ("kernel (page faults, scheduling)", [r"^\[k\]"]),
]


def main():
    text = subprocess.run(
        ["perf", "report", "-i", sys.argv[1], "--no-children", "--sort", "symbol",
         "--stdio", "--percent-limit", "0"],
        capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\[.\])\s+(.*)$", line)
        if m:
            rows.append((float(m.group(1)), f"{m.group(2)} {m.group(3).strip()}"))
    total = sum(p for p, _ in rows)
    if total == 0:
        sys.exit(f"{sys.argv[1]}: no samples (the run ended before DELAY_MS?)")
    print(f"{'operation':<44} {'share':>7}")
    used = set()
    for name, pats in OPS:
        share = 0.0
        for i, (p, sym) in enumerate(rows):
            if i not in used and any(re.search(pt, sym.split(' ', 1)[1] if not pt.startswith('^') else sym) for pt in pats):
                used.add(i)
                share += p
        print(f"{name:<44} {100 * share / total:>6.1f}%")
    rest = sum(p for i, (p, _) in enumerate(rows) if i not in used)
    print(f"{'other':<44} {100 * rest / total:>6.1f}%")
    top = sorted(((p, s) for i, (p, s) in enumerate(rows) if i not in used), reverse=True)[:3]
    print("  largest in other: " + "; ".join(f"{s[:60]} {100 * p / total:.1f}%" for p, s in top))


if __name__ == "__main__":
    main()
