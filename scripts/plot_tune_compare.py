#!/usr/bin/env python3
"""Two or more `sloserve tune` runs side by side: TTFT P95, TPOT P50 and output tok/s
against max_num_seqs, one line per run, the SLO lines and each run's interactive and batch
picks marked. Also prints a markdown table of every point.

usage: scripts/plot_tune_compare.py LABEL=out/tune-a/tune.json LABEL=out/tune-b/tune.json \
         --out docs/figures/tune-135m-vs-1.5b.png
"""
import argparse
import json

import fleet_common as fc


def load(spec):
    label, path = spec.split("=", 1)
    with open(path) as f:
        return label, json.load(f)


def pick(report, kind):
    rec = report.get(kind)
    return rec["knobs"]["max_num_seqs"] if rec else None


def table(runs):
    lines = ["| model | max_num_seqs | TTFT p50 ms | TTFT P95 ms | TPOT p50 ms | output tok/s | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in runs:
        for p in r["points"]:
            m, n = p["metrics"], p["knobs"]["max_num_seqs"]
            marks = [k for k in ("interactive", "batch") if pick(r, k) == n]
            verdict = ("meets" if p["verdict"]["meets"] else "misses") + "".join(f", **{k} pick**" for k in marks)
            lines.append(f"| {label} | {n} | {p['summary']['ttft_ms']['median']:.0f} | {m['ttft_p95_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.1f} | {m['output_tok_s']:.1f} | {verdict} |")
    return "\n".join(lines)


def plot(runs, path):
    plt = fc.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    slo = runs[0][1]["slo"]
    for (label, r), color in zip(runs, ["tab:blue", "tab:red", "tab:green", "tab:purple"]):
        pts = sorted(r["points"], key=lambda p: p["knobs"]["max_num_seqs"])
        xs = [p["knobs"]["max_num_seqs"] for p in pts]
        for ax, key in zip(axes, ("ttft_p95_ms", "tpot_p50_ms", "output_tok_s")):
            ys = [p["metrics"][key] for p in pts]
            ax.plot(xs, ys, marker="o", color=color, label=label)
            for kind, marker in (("interactive", "*"), ("batch", "s")):
                n = pick(r, kind)
                if n in xs:
                    ax.scatter([n], [ys[xs.index(n)]], marker=marker, s=180, facecolors="none", edgecolors=color,
                               linewidths=1.5)
    axes[0].axhline(slo["ttft_p95_ms"], color="grey", linestyle="--", linewidth=1, label="TTFT SLO")
    if slo.get("tpot_p50_ms"):
        axes[1].axhline(slo["tpot_p50_ms"], color="grey", linestyle="--", linewidth=1, label="TPOT SLO")
    for ax, label in zip(axes, ("TTFT P95 (ms)", "TPOT p50 (ms)", "output tok/s (all streams)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_num_seqs (= concurrency)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    fig.suptitle("sloserve tune, same workload and SLO on two models (star: interactive pick, square: batch pick)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=path/to/tune.json")
    ap.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args()
    runs = [load(s) for s in args.runs]
    print(table(runs))
    plot(runs, args.out)


if __name__ == "__main__":
    main()
