#!/usr/bin/env python3
"""The fleet benchmarks of issue #12, on one machine.

1. Router overhead: an idle `sloserve serve` replica; ROUNDS rounds of 100 pairs of
   one-token streamed requests, one directly and one through `sloserve route`
   (order flipped every pair, distinct prompts); reports the median of the paired
   TTFT differences (router minus direct), median over rounds.
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
import http.client
import json
import os
import random
import statistics
import time
from urllib.parse import urlparse

import fleet_common as fc

PORT = 8400


WORDS = ("the quick brown fox jumps over a lazy dog while small models serve many streams "
         "of text in order and every request gets its answer soon").split()


def ttft_ms(url, prompt, model=None):
    """One streamed one-token completion on a fresh connection: ms to the first event.
    `model` names the model in the body (a gateway's EPP needs it)."""
    u = urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = {"prompt": prompt, "max_tokens": 1, "stream": True, "temperature": 0}
    body = json.dumps({"model": model, **body} if model else body)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"{url}: HTTP {r.status}: {r.read()[:200]!r}")
    ms = None
    for line in r:
        if line.startswith(b"data: ") and ms is None:
            ms = (time.perf_counter() - t0) * 1e3
    c.close()
    return ms


def overhead(args):
    """Paired requests, direct and through the router alternately (order flipped
    every pair), each with its own prompt (no prefix-cache hit on the other's):
    the median of the paired differences per round, then over rounds."""
    rows = []
    _, direct = fc.replica(args.bin, PORT + 1, "interactive", 2, args.out)
    _, routed = fc.router(args.bin, PORT, {"interactive": [direct]}, args.out)
    n = 4 if args.smoke else 100
    rng = random.Random(7)
    for _ in range(3):  # warm both paths
        ttft_ms(direct, "warm up"), ttft_ms(routed, "warm up")
    for r in range(args.rounds):
        d_ms, r_ms = [], []
        for i in range(n):
            prompts = [" ".join(rng.choice(WORDS) for _ in range(32)) for _ in range(2)]
            order = [("d", direct), ("r", routed)] if i % 2 == 0 else [("r", routed), ("d", direct)]
            got = {k: ttft_ms(url, p) for (k, url), p in zip(order, prompts)}
            d_ms.append(got["d"])
            r_ms.append(got["r"])
        diff = statistics.median(b - a for a, b in zip(d_ms, r_ms))
        rows.append({"direct": statistics.median(d_ms), "router": statistics.median(r_ms), "paired_diff": diff})
        print(f"  round {r}: TTFT p50 direct {rows[-1]['direct']:.2f} ms, router {rows[-1]['router']:.2f} ms, "
              f"median paired difference {diff:.2f} ms ({n} pairs)")
    fc.stop_all()
    return {"rounds": rows, "median_overhead_ms": statistics.median(r["paired_diff"] for r in rows)}


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
    row, trace = run_workload(args, name, r_url, idx)
    row["spilled"] = fc.metric_sum(fc.metrics(r_url), "sloserve_router:spilled_total")
    fc.stop_all()
    return row, trace


def run_workload(args, name, url, idx, bench_args=()):
    """The fleet workload against `url` (a router, a gateway or one replica): interactive
    shared-prefix requests at `args.rate` beside a batch job; its row and plot trace.
    `bench_args` go to both `sloserve bench` runs (e.g. `--model`, which a gateway needs)."""
    tag = f"fleet-{idx}"
    n_inter = 6 if args.smoke else args.interactive
    inter_out, batch_out = os.path.join(args.out, tag + "-interactive"), os.path.join(args.out, tag + "-batch")
    inter = fc.bench(args.bin, url, inter_out, [*bench_args,
        "--dataset", "prefix", "--prefix-len", "200", "--input-len", "24", "--output-len", "16", "--ignore-eos",
        "--request-rate", str(args.rate), "--num-requests", str(n_inter),
        "--slo-class", "interactive=1", "--slo", "ttft=1000ms", "--seed", str(idx)])
    batch = fc.bench(args.bin, url, batch_out, [*bench_args,
        "--dataset", "synthetic", "--input-len", "128", "--output-len", "32", "--ignore-eos",
        "--concurrency", str(min(args.batch, args.batch_concurrency)), "--num-requests", str(args.batch),
        "--slo-class", "batch=1", "--seed", str(100 + idx)])
    fc.finish(inter, f"{name} interactive")
    fc.finish(batch, f"{name} batch")
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
        "spilled": 0,
    }
    t0 = min(ti, tb)
    trace = {"interactive": fc.ttft_points(ri, ti - t0), "batch_tok_s": fc.per_second(rb, tb - t0)}
    return row, trace


def table(over, rows):
    lines = []
    if over:
        lines.append(f"Router overhead (TTFT through the router minus direct, median of paired requests, idle "
                     f"replica, median of {len(over['rounds'])} rounds): **{over['median_overhead_ms']:.2f} ms**\n")
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
    ap.add_argument("--batch-concurrency", type=int, default=32,
                    help="the job's requests in flight (the router picks a replica, and may spill, per request)")
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
