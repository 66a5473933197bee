#!/usr/bin/env python3
"""sloserve's model core beside llama.cpp on the same GGUF file, in one sitting.

Each round alternates, per case, sloserve's forward bench (`--fast-only --only CASE`,
median of its 7 runs; saved runs from before stop 19 also hold an `int8` column) with llama.cpp's own bench for it: `llama-bench -n 128`
(tg128) for decode batch 1, `llama-batched-bench -npp 128 -ntg 64 -npl 32` (S_TG) for batch 32
(the forward bench then runs the same shape, `--decode 128:64`),
`llama-bench -p 512` (pp512) for prefill. `cargo bench --bench peak` runs first on the same file
(`SLOSERVE_BENCH_MODEL`) and its ceilings go beside the figures they bound. The result is the median over rounds of
each figure, the ratio of the medians and the ratio per round, with the load average per round:
a table on stdout, JSON and a plot (matplotlib from scripts/requirements-plots.txt).

usage: scripts/bench_vs_llama.py [--rounds 5] [--model FILE] [--cases decode_b1,decode_b32,prefill_512]
         [--threads 2] [--llama-bin DIR] [--out target/bench/vs-llama.json] [--plot PNG]
       scripts/bench_vs_llama.py --from-json target/bench/vs-llama-<stem>.json [--plot PNG]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fleet_common import pyplot  # noqa: E402

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_BIN = os.path.expanduser("~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
PEER = {"decode_b1": "tg128", "decode_b32": "S_TG at B=32", "prefill_512": "pp512"}
SHAPES = {
    "decode_b1": "sloserve: 32 steps at contexts 64 -> 96; llama-bench -n 128: contexts 0 -> 128",
    "decode_b32": "both: 32 sequences, a 128-token prompt each, 64 steps (contexts 128 -> 192)",
    "prefill_512": "both: one 512-token prompt",
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run(cmd, cwd=ROOT, env=None):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def sloserve(fwd, model, case, threads):
    """{precision: median tok/s} of one forward-bench run of `case`."""
    # Batch 32 at llama-batched-bench's shape (contexts 128 -> 192); batch 1 at the forward
    # bench's own 64 -> 96, against tg128's 0 -> 128 (a longer average context for sloserve).
    shape = ["--decode", "128:64"] if case == "decode_b32" else []
    out = run([fwd, "--fast-only", "--only", case, "--model", model] + shape,
              cwd=os.path.join(ROOT, "crates/model"), env={"RAYON_NUM_THREADS": str(threads)})
    got = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "fast" and f[1] == case:
            got[f[0]] = float(f[3])
    if set(got) != {"fast"}:
        sys.exit(f"forward bench printed no figures for {case}:\n{out[-2000:]}")
    return got


def llama(bin_dir, model, case, threads):
    env = {"LD_LIBRARY_PATH": bin_dir}
    t = ["-t", str(threads)]
    if case == "decode_b32":
        out = run([f"{bin_dir}/llama-batched-bench", "-m", model, "-c", "8192", "-npp", "128", "-ntg", "64",
                   "-npl", "32", "--output-format", "jsonl"] + t, env=env)
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        return next(r["speed_tg"] for r in rows if r.get("pl") == 32)
    pp, tg = (512, 0) if case == "prefill_512" else (0, 128)
    out = run([f"{bin_dir}/llama-bench", "-m", model, "-p", str(pp), "-n", str(tg), "-r", "5", "-o", "json"] + t,
              env=env)
    return json.loads(out)[0]["avg_ts"]


def peak(threads, model):
    run(["cargo", "bench", "-p", "sloserve-model", "--bench", "peak"],
        env={"RAYON_NUM_THREADS": str(threads), "SLOSERVE_BENCH_MODEL": model})
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    with open(os.path.join(target, "bench", "peak.json")) as f:
        p = json.load(f)
    vnni = p.get("vnni_dot_gflops")
    return {
        "decode_b1": ("DRAM read", p["batch1_decode_ceiling_tok_s"]["dram"]),
        "f32": ("f32 FMA", p["decode_ceiling_tok_s"]["f32"]),
        "int8": ("VNNI dot", 1e9 * vnni["all"] / 2 / p["matmul_macs_per_token"]) if vnni else None,
        "raw": p,
    }


def ours(figures):
    """sloserve's columns in a case's figures: `fast`, and `int8` in runs before stop 19."""
    return [k for k in ("fast", "int8") if k in figures]


def summarize(rounds, cases):
    s = {}
    for c in cases:
        col = {k: [r[c][k] for r in rounds] for k in ours(rounds[0][c]) + ["llama"]}
        med = {k: statistics.median(v) for k, v in col.items()}
        s[c] = {
            "median": med,
            "range": {k: [min(v), max(v)] for k, v in col.items()},
            "ratio": {k: med[k] / med["llama"] for k in ours(med)},
            "ratio_per_round": {k: [r[c][k] / r[c]["llama"] for r in rounds] for k in ours(med)},
        }
    return s


def table(summary, ceilings):
    cols = ours(next(iter(summary.values()))["median"])
    print("| case | " + " | ".join(f"sloserve {k}" for k in cols) + " | llama.cpp | "
          + " | ".join(f"{k} : llama.cpp" for k in cols) + " | ceiling |")
    print("| --- " * (2 * len(cols) + 3) + "|")
    for c, s in summary.items():
        m, r, rr = s["median"], s["range"], s["ratio_per_round"]
        cell = lambda k: f"{m[k]:.1f} ({r[k][0]:.1f}-{r[k][1]:.1f})"
        ratio = lambda k: f"{s['ratio'][k]:.2f}x ({', '.join(f'{x:.2f}' for x in rr[k])})"
        ceil = ""
        if ceilings:
            keys = ["decode_b1"] if c == "decode_b1" else ["f32", "int8"]
            ceil = "; ".join(f"{ceilings[k][0]} {ceilings[k][1]:.0f} tok/s" for k in keys if ceilings.get(k))
        print(f"| {c} | " + " | ".join(cell(k) for k in cols) + f" | {cell('llama')} {PEER[c]} | "
              + " | ".join(ratio(k) for k in cols) + f" | {ceil} |")


def plot(summary, ceilings, title, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(summary), figsize=(4.2 * len(summary), 4.2))
    axes = axes if len(summary) > 1 else [axes]
    colors = {"fast": "#1f77b4", "int8": "#2ca02c", "llama": "#999999"}
    labels = {"fast": "sloserve fast", "int8": "sloserve int8", "llama": "llama.cpp"}
    for ax, (c, s) in zip(axes, summary.items()):
        keys = ours(s["median"]) + ["llama"]
        for i, k in enumerate(keys):
            m, (lo, hi) = s["median"][k], s["range"][k]
            ax.bar(i, m, color=colors[k], yerr=[[m - lo], [hi - m]], capsize=4)
            ax.text(i, hi, f"{m:.0f}" + (f"\n{s['ratio'][k]:.2f}x" if k != "llama" else ""),
                    ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(keys)), [labels[k] for k in keys], fontsize=8)
        ax.set_title(f"{c} (llama.cpp: {PEER[c]})", fontsize=10)
        ax.set_ylabel("tok/s (median of rounds; bars: range)")
        top = max(s["range"][k][1] for k in s["range"]) * 1.25
        if ceilings:
            keys, style = (["decode_b1"], "--") if c == "decode_b1" else (["f32", "int8"], ":")
            for k in keys:
                if ceilings.get(k) and ceilings[k][1] < 2.5 * top:
                    ax.axhline(ceilings[k][1], color="#d62728", linestyle=style, linewidth=1)
                    ax.text(2.45, ceilings[k][1], f"{ceilings[k][0]} ceiling", ha="right", va="bottom",
                            fontsize=7, color="#d62728")
                    top = max(top, ceilings[k][1] * 1.1)
        ax.set_ylim(0, top)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--no-peak", action="store_true", help="skip the ceilings (cargo bench --bench peak)")
    ap.add_argument("--cases", default="decode_b1,decode_b32,prefill_512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", LLAMA_BIN))
    ap.add_argument("--forward-bin", help="a built forward bench (default: scripts/forward-bench-bin.sh)")
    ap.add_argument("--out", default=None, help="JSON (default target/bench/vs-llama-<file stem>.json)")
    ap.add_argument("--plot", default=None, help="PNG (default beside the JSON)")
    ap.add_argument("--from-json", metavar="JSON", help="print the table and draw the plot of a saved run")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            result = json.load(f)
        report(result, a.plot or a.from_json[:-5] + ".png")
        return
    cases = a.cases.split(",")
    bad = [c for c in cases if c not in PEER]
    if bad:
        sys.exit(f"unknown case(s) {bad}: choose from {list(PEER)}")
    model = os.path.abspath(os.path.join(ROOT, a.model))
    if not os.path.exists(model):
        sys.exit(f"{a.model}: no such file (make model)")
    if not os.path.exists(f"{a.llama_bin}/llama-bench"):
        sys.exit(f"no llama-bench in {a.llama_bin}: ../shared/tools/build-llama-server.sh builds it (or --llama-bin)")
    stem = os.path.splitext(os.path.basename(model))[0]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    out = a.out or os.path.join(target, "bench", f"vs-llama-{stem}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fwd = a.forward_bin or run([os.path.join(ROOT, "scripts/forward-bench-bin.sh")]).strip()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    ceilings = None
    if not a.no_peak:
        log(f"peak (load {load()})")
        ceilings = peak(a.threads, model)
    rounds = []
    for i in range(a.rounds):
        r = {"load": load()}
        for c in cases:
            log(f"round {i + 1}/{a.rounds}: {c} (load {r['load']})")
            r[c] = sloserve(fwd, model, c, a.threads)
            r[c]["llama"] = llama(a.llama_bin, model, c, a.threads)
            log(f"  fast {r[c]['fast']:.1f}  llama.cpp {r[c]['llama']:.1f} tok/s")
        rounds.append(r)
    summary = summarize(rounds, cases)
    result = {"model": a.model, "threads": a.threads, "started": started, "ended": time.strftime("%Y-%m-%d %H:%M:%S"),
              "loads": [r["load"] for r in rounds], "rounds": rounds, "summary": summary,
              "dense": os.environ.get("SLOSERVE_DENSE"), "isa": os.environ.get("SLOSERVE_ISA"), "llama_bin": a.llama_bin, "shapes": SHAPES,
              "ceilings_tok_s": {k: v for k, v in (ceilings or {}).items() if k != "raw"}}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    log(f"wrote {out}")
    report(result, a.plot or out[:-5] + ".png")


def report(result, png):
    """The table on stdout and the plot of one run's result (as saved in its JSON)."""
    stem = os.path.splitext(os.path.basename(result["model"]))[0]
    rounds, threads = len(result["rounds"]), result["threads"]
    ceilings = result["ceilings_tok_s"] or None
    print(f"{stem}, {threads} threads, {rounds} rounds, load {', '.join(result['loads'])}")
    table(result["summary"], ceilings)
    title = (f"{stem}: sloserve vs llama.cpp, {threads} threads, median of {rounds} alternating rounds "
             f"({result['started'][:10]})")
    plot(result["summary"], ceilings, title, png)


if __name__ == "__main__":
    main()
