#!/usr/bin/env python3
"""Per-operation instruction counts from one callgrind dump of the forward bench
(scripts/profile-decode.sh, scripts/profile-ops.sh). Usage: callgrind_ops.py DUMP
[TOKENS [MARKER]]: MARKER (default decode_once) is the function whose inclusive count
is the total (e.g. `LlamaRunner::execute` for one prefill).

Each operation's count is the inclusive count of the functions that implement it (the
largest entry per function name, callgrind listing inlined code per source file);
"other" is what the step costs beyond them. The first column is per token."""
import re
import subprocess
import sys

# (operation, function-name patterns[, part]): the old paths' functions and the new
# ones'. A `part` row is inside the row above it: shown, not subtracted from "other".
OPS = [
    ("weight matmuls (Linear::forward)", [r"linear::Linear::forward$"]),
    ("  of which quantized dot products / GEMVs", [
        r"quant_dot::q4_1_q8_1_avx2$", r"quant_dot::q5_0_q8_0_avx2$", r"avx::vec_dot_q8_0_q8_0$",
        r"q4_1_rows::dot$", r"q8_0_rows::dot$"], True),
    ("  of which 8-bit GEMM tiles", [r"int8_gemm::tile_vnni_nibbles$", r"int8_gemm::tile_vnni$",
                                     r"int8_gemm::tile_avx2$"], True),
    ("  of which f32 GEMM", [r"packed_gemm::kernel$"], True),
    ("  of which activation quantization", [
        r"BlockQ8_1 as .*GgmlType>::from_float$", r"BlockQ8_0 as .*GgmlType>::from_float$",
        r"act_quant::QuantActs::quantize$"], True),
    ("attention (paged, f16 KV)", [r"kernels::attention::paged_attention$"]),
    ("RMS norm", [r"kernels::norm::rms_norm$", r"kernels::norm::rms_norm_in_place$"]),
    ("RoPE", [r"rope::Rope::apply$"]),
    ("SiLU x up", [r"kernels::activation::silu_mul$"]),
    ("KV cache write", [r"kv_cache::KvCache::write$"]),
    ("embedding row", [r"llama::Llama::embed$"]),
]


def main():
    dump, tokens = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32
    marker = sys.argv[3] if len(sys.argv) > 3 else "decode_once"
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
        capture_output=True, text=True, check=True).stdout
    incl = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*?):(.+?)(\s+\[.*\])?$", line)
        if not m:
            continue
        n, fn = int(m.group(1).replace(",", "")), m.group(3).strip()
        incl[fn] = max(incl.get(fn, 0), n)
    total = max((n for fn, n in incl.items() if fn.endswith(marker)), default=0)
    if total == 0:
        sys.exit(f"{dump}: no {marker} in this dump")
    print(f"{'operation':<40} {'Ir/token':>12} {'share':>7}")
    rest = total
    for name, pats, *part in OPS:
        fns = {fn for fn in incl for p in pats if re.search(p, fn)}
        n = sum(incl[fn] for fn in fns)
        if not part:
            rest -= n
        print(f"{name:<40} {n / tokens:>12,.0f} {100 * n / total:>6.1f}%")
    print(f"{'other (pool/rayon, glue, bench argmax)':<40} {rest / tokens:>12,.0f} {100 * rest / total:>6.1f}%")
    print(f"{'total':<40} {total / tokens:>12,.0f} {100.0:>6.1f}%")


if __name__ == "__main__":
    main()
