#!/usr/bin/env python3
"""Which instruction sets a test run's kernel tests exercised, from the ledger they
wrote (`SLOSERVE_ISA_LEDGER=DIR`, crates/model/src/kernels/isa_ledger.rs).

Prints one line per kernel test (which routes ran, which were skipped because the
CPU lacks them) and the ISAs exercised; exits 1 when a route this machine has (and
`SLOSERVE_ISA` allows) was skipped, or a kernel test of the list below never
reported (it did not run, or lost its ledger call).

    python3 scripts/isa_report.py target/isa-ledger
"""
import os
import sys

# Kernel test -> the routes it covers. "each": every listed ISA the machine has must
# have run; "best": the first listed that the machine has must have run (the kernel
# dispatches to one route only). The names are the ones the Rust tests pass to
# `isa_ledger::route`.
KERNELS = {
    "int8_gemm": ("each", ["avx512-vnni", "avx2"]),
    "int8_gemm_batch_invariance": ("each", ["avx512-vnni", "avx2"]),
    "packed_gemm": ("each", ["avx2"]),
    "packed_gemm_batch_invariance": ("each", ["avx2"]),
    "exact_blocks": ("each", ["avx2"]),
    "attention_f16": ("best", ["avx512-bf16", "avx2"]),
    "attention_paired_bf16": ("each", ["avx512-bf16"]),
    "attention_quant": ("each", ["avx2"]),
}


def machine_isas():
    """The ISAs the kernels may use here, as `kernels/cpu.rs` decides."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    have = set()
    if {"avx2", "fma", "f16c"} <= flags:
        have.add("avx2")
        capped = os.environ.get("SLOSERVE_ISA", "").strip() == "avx2" or "avx2" in os.environ.get(
            "SLOSERVE_DENSE", ""
        ).split(",")
        if not capped and {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
            have.add("avx512-vnni")
            if "avx512_bf16" in flags:
                have.add("avx512-bf16")
    return have


def read_ledger(folder):
    runs = {}
    if not os.path.isdir(folder):
        return runs
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 3:
                    continue
                kernel, isa, outcome = parts
                runs.setdefault(kernel, {}).setdefault(isa, set()).add(outcome)
    return runs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    have = machine_isas()
    runs = read_ledger(sys.argv[1])
    problems, exercised = [], set()
    print(f"ISA report: this machine's kernels may use {', '.join(sorted(have)) or 'none (portable only)'}")
    for kernel, (rule, isas) in KERNELS.items():
        seen = runs.get(kernel, {})
        ran = sorted(i for i, o in seen.items() if "ran" in o)
        skipped = sorted(i for i, o in seen.items() if "ran" not in o)
        exercised.update(ran)
        print(f"  {kernel:30} ran {', '.join(ran) or '-':24} skipped {', '.join(skipped) or '-'}")
        if not seen:
            problems.append(f"{kernel}: no ledger entry (the test did not run)")
            continue
        want = [i for i in isas if i in have]
        if rule == "best":
            want = want[:1]
        for isa in want:
            if isa not in ran:
                problems.append(f"{kernel}: this machine has {isa} but the test did not run it")
    for kernel in sorted(set(runs) - set(KERNELS)):
        problems.append(f"{kernel}: reported by a test but missing from scripts/isa_report.py's list")
    print(f"ISAs exercised by the kernel tests: {', '.join(sorted(exercised)) or 'none'}")
    if problems:
        print("ISA report: FAILED\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
