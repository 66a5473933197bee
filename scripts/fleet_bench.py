#!/usr/bin/env python3
"""The fleet benchmarks of issue #12, on one machine.

1. Router overhead: an idle `sloserve serve` replica, `sloserve bench` at
   concurrency 1 directly and through `sloserve route`, alternating, ROUNDS times;
   reports TTFT p50 through the router minus direct (median over rounds).
2. One fleet or two, with one workload: interactive shared-prefix traffic at a
   fixed rate (class interactive, 1 s TTFT SLO) beside a batch job of BATCH
   requests submitted at once (class batch), both through the router, for
     (a) two fleets, one thread each: `--profile interactive --threads 1` and
         `--profile batch --threads 1`;
     (b) the same with `sloserve route --spill-over` (the interactive replica has
         `--max-step-ms 100` in (a) and (b), so spilled batch prefill runs in short steps);
     (c) one `--profile mixed --threads 2` replica.
   Reports interactive TTFT P95, goodput at the 1 s TTFT SLO (requests/s whose
   TTFT met it) and attainment, and the batch job's output tok/s and duration.
Writes OUT/fleet-bench.json, OUT/fleet-bench.md and OUT/fleet-bench.png; stops
every process it started.

usage: scripts/fleet_bench.py [--bin target/release/sloserve] [--out out/fleet-bench]
       [--smoke] [--rounds 5] [--rate 1.0] [--batch 200]
Run it on a quiet machine: both cores are the thing measured. Loopback only.
"""
import argparse
import json
import os
import statistics

import fleet_common as fc

PORT = 8400


def overhead(args):
    rows = []
    _, direct = fc.replica(args.bin, PORT + 1, "interactive", 2, args.out)
    _, routed = fc.router(args.bin, PORT, {"interactive": [direct]}, args.out)
    n = 4 if args.smoke else 40
    for r in range(args.rounds):
        p50 = {}
        # Distinct prompts per path (no prefix-cache hits on what the other path
        # just sent) and the order alternating by round.
        paths = [("direct", direct, 0), ("router", routed, 1)]
        for name, url, k in paths if r % 2 == 0 else paths[::-1]:
            out = os.path.join(args.out, f"overhead-{name}-{r}")
            b = fc.bench(args.bin, url, out, ["--concurrency", "1", "--num-requests", str(n), "--warmup", "2",
                                              "--input-len", "32", "--output-len", "2",
                                              "--seed", str(1000 * r + k)])
            fc.finish(b, f"overhead {name}")
            p50[name] = fc.results(out)[0]["ttft_ms"]["median"]
        rows.append(p50)
        print(f"  round {r}: TTFT p50 direct {p50['direct']:.2f} ms, router {p50['router']:.2f} ms")
    fc.stop_all()
    diff = statistics.median(r["router"] - r["direct"] for r in rows)
    return {"rounds": rows, "median_overhead_ms": diff}


# The interactive replica caps steps at 100 ms (`max_step_ms`, as `mixed` does at 200):
# a spilled batch request's prefill must not hold an interactive arrival for long.
INTERACTIVE = ("interactive", 1, ["--max-step-ms", "100"])
CONFIGS = {
    "a: two fleets": {"replicas": [INTERACTIVE, ("batch", 1, [])], "route": []},
    "b: two fleets + spill-over": {"replicas": [INTERACTIVE, ("batch", 1, [])], "route": ["--spill-over"]},
    "c: one mixed replica, 2 threads": {"replicas": [("mixed", 2, [])], "route": []},
}


def fleet_run(args, name, cfg, idx):
    fleets = {}
    for j, (profile, threads, extra) in enumerate(cfg["replicas"]):
        # The job's 200 requests arrive at once and are meant to queue: no
        # refusal for a long predicted wait (interactive TTFT refusals stay).
        _, url = fc.replica(args.bin, PORT + 10 + j, profile, threads, args.out, [*extra, "--max-queue-wait", "0"])
        fleets[profile] = [url]
    _, r_url = fc.router(args.bin, PORT, fleets, args.out, cfg["route"])
    tag = f"fleet-{idx}"
    n_inter = 6 if args.smoke else args.interactive
    inter_out, batch_out = os.path.join(args.out, tag + "-interactive"), os.path.join(args.out, tag + "-batch")
    inter = fc.bench(args.bin, r_url, inter_out, [
        "--dataset", "prefix", "--prefix-len", "200", "--input-len", "24", "--output-len", "16", "--ignore-eos",
        "--request-rate", str(args.rate), "--num-requests", str(n_inter),
        "--slo-class", "interactive=1", "--slo", "ttft=1000ms", "--seed", str(idx)])
    batch = fc.bench(args.bin, r_url, batch_out, [
        "--dataset", "synthetic", "--input-len", "128", "--output-len", "32", "--ignore-eos",
        "--concurrency", str(args.batch), "--num-requests", str(args.batch),
        "--slo-class", "batch=1", "--seed", str(100 + idx)])
    fc.finish(inter, f"{name} interactive")
    fc.finish(batch, f"{name} batch")
    spilled = fc.metric_sum(fc.metrics(r_url), "sloserve_router:spilled_total")
    fc.stop_all()
    si, ri, ti = fc.results(inter_out)
    sb, rb, tb = fc.results(batch_out)
    row = {
        "config": name,
        "interactive_requests": si["completed"] + si["failed"],
        "interactive_failed": si["failed"],
        "interactive_ttft_p50_ms": si["ttft_ms"]["median"],
        "interactive_ttft_p95_ms": si["ttft_ms"]["p95"],
        "goodput_1s_req_s": si["goodput"],
        "attainment_1s": si["slo_attainment"],
        "batch_requests": sb["completed"] + sb["failed"],
        "batch_failed": sb["failed"],
        "batch_output_tok_s": sb["output_throughput"],
        "batch_duration_s": sb["duration_s"],
        "spilled": spilled,
    }
    t0 = min(ti, tb)
    trace = {"interactive": fc.ttft_points(ri, ti - t0), "batch_tok_s": fc.per_second(rb, tb - t0)}
    return row, trace


def table(over, rows):
    lines = []
    if over:
        lines.append(f"Router overhead (TTFT p50 through the router minus direct, idle replica, median of "
                     f"{len(over['rounds'])} rounds): **{over['median_overhead_ms']:.2f} ms**\n")
    lines.append("| config | interactive TTFT p50 ms | TTFT P95 ms | goodput @ 1 s (req/s) | attainment | "
                 "batch output tok/s | batch job s | spilled |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        lines.append(f"| {r['config']} | {r['interactive_ttft_p50_ms']:.0f} | {r['interactive_ttft_p95_ms']:.0f} | "
                     f"{r['goodput_1s_req_s']:.2f} | {100 * r['attainment_1s']:.0f}% | {r['batch_output_tok_s']:.1f} | "
                     f"{r['batch_duration_s']:.0f} | {r['spilled']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows, traces, path):
    plt = fc.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    names = [r["config"] for r in rows]
    for ax, key, label in ((axes[0][0], "interactive_ttft_p95_ms", "interactive TTFT P95 (ms)"),
                           (axes[0][1], "batch_output_tok_s", "batch output tok/s")):
        ax.bar(range(len(rows)), [r[key] for r in rows], color=["tab:blue", "tab:green", "tab:orange"][: len(rows)])
        ax.set_xticks(range(len(rows)), [n.split(":")[0] for n in names])
        ax.set_ylabel(label)
    axes[0][0].axhline(1000, color="grey", linestyle="--", linewidth=1)
    for (name, tr), color in zip(traces.items(), ["tab:blue", "tab:green", "tab:orange"]):
        axes[1][0].scatter(*tr["interactive"], s=10, color=color, label=name)
        axes[1][1].plot(*tr["batch_tok_s"], color=color, label=name)
    axes[1][0].set_yscale("log")
    axes[1][0].set_ylabel("interactive TTFT (ms) by send time (s)")
    axes[1][0].axhline(1000, color="grey", linestyle="--", linewidth=1)
    axes[1][1].set_ylabel("batch output tok/s by second")
    axes[1][0].legend(fontsize=8)
    fig.suptitle("One fleet or two: interactive shared-prefix traffic beside a batch job")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--out", default="out/fleet-bench")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, measures nothing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=1.0, help="interactive requests per second")
    ap.add_argument("--interactive", type=int, default=90, help="interactive requests")
    ap.add_argument("--batch", type=int, default=200, help="requests in the batch job")
    ap.add_argument("--only", choices=["overhead", "fleets"])
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.batch = min(args.rounds, 1), min(args.batch, 8)
    os.makedirs(args.out, exist_ok=True)
    over = None
    if args.only != "fleets":
        print("router overhead:")
        over = overhead(args)
    rows, traces = [], {}
    if args.only != "overhead":
        for i, (name, cfg) in enumerate(CONFIGS.items()):
            print(f"{name} ...")
            row, traces[name] = fleet_run(args, name, cfg, i)
            rows.append(row)
    md = table(over, rows) if rows else table(over, [])
    print("\n" + md)
    with open(os.path.join(args.out, "fleet-bench.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "fleet-bench.json"), "w") as f:
        json.dump({"overhead": over, "fleets": rows, "smoke": args.smoke}, f, indent=1)
    if rows:
        plot(rows, traces, os.path.join(args.out, "fleet-bench.png"))


if __name__ == "__main__":
    main()
