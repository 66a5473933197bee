#!/usr/bin/env python3
"""sloserve behind the real gateway (issue #34 item 4): Envoy + llm-d's endpoint picker
(EPP) against `sloserve route` and one replica, on one machine.

1. Router overhead: one idle replica (`--profile interactive --threads 2`) reached three
   ways: directly, through `sloserve route`, and through Envoy + EPP (a one-replica stack).
   ROUNDS rounds of N triples of one-token streamed completions, order rotated each
   triple, distinct prompts: the median of the paired TTFT differences against direct.
2. One fleet or two behind a router: fleet_bench.py's workload (interactive shared-prefix
   requests at --rate, 1 s TTFT target, beside a batch job of --batch requests) against
     (a) one `--profile mixed --threads 2` replica, directly;
     (b) `sloserve route` over two fleets, one thread each (interactive, batch);
     (c) Envoy + EPP over two identical `--profile mixed --threads 1` replicas.
3. Prefix-heavy traffic: many users, a few shared system prompts (--prefixes of
   --prefix-words words, drawn with Zipf-like popularity), a unique question each, at
   --prefix-concurrency, through Envoy to two `--profile mixed --threads 1` replicas whose
   KV cache (--kv-cache-memory) holds only part of the system prompts, so where a prompt
   lands decides whether its prefix is cached. Pickers: Envoy round-robin (no EPP), the
   EPP with its approximate prefix scorer (its default profile), and the EPP with the
   precise one (token ids from the replicas' render endpoint, blocks from their KV-cache
   events). Reports the replicas' prefix-cache hit rate (cached / looked-up prompt
   tokens), TTFT p50/P95 and the requests each replica served. --prefix-rounds repeats.

Writes OUT/gateway-bench.json, OUT/gateway-bench.md and OUT/gateway-bench.png; stops every
process it started. Needs Envoy and the EPP (deploy/local/gwinstall.py; docs/gateway.md).

usage: scripts/gateway_bench.py [--bin target/release/sloserve] [--out out/gateway-bench]
       [--only overhead|fleets|prefix] [--smoke] [--from-json FILE]
"""
import argparse
import json
import os
import random
import statistics
import sys

import fleet_bench as fb
import fleet_common as fc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "gateway"))
import gwtest  # noqa: E402  (gateway.py up/down on a free base port)

PORT = 8500
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class Stack:
    """A deploy/local gateway stack for the length of a `with` block."""

    def __init__(self, args, tag, mode, replicas, profile, threads, extra=()):
        self.run_dir = os.path.abspath(os.path.join(args.out, tag))
        self.cmd = (args.bin, args.model, self.run_dir, mode,
                    ["--replicas", str(replicas), "--profile", profile, "--threads", str(threads), *extra])

    def __enter__(self):
        self.stack = gwtest.stack_up(*self.cmd[:4], extra=self.cmd[4])
        self.url = f"http://127.0.0.1:{self.stack['ports']['envoy']}"
        self.model = self.stack["model"]
        self.replicas = [f"http://127.0.0.1:{r['port']}" for r in self.stack["replicas"]]
        return self

    def __exit__(self, *exc):
        gwtest.stack_down(self.run_dir)


def overhead(args):
    rows = []
    with Stack(args, "overhead-stack", "epp", 1, "interactive", 2) as st:
        direct, gateway, model = st.replicas[0], st.url, st.model
        proc, routed = fc.router(args.bin, PORT, {"interactive": [direct]}, args.out)
        paths = {"direct": direct, "route": routed, "envoy+epp": gateway}
        n = 6 if args.smoke else args.pairs
        rng = random.Random(7)
        for _ in range(3):  # warm every path
            for url in paths.values():
                fb.ttft_ms(url, "warm up", model)
        for r in range(args.rounds):
            got = {k: [] for k in paths}
            for i in range(n):
                order = list(paths.items())
                order = order[i % 3:] + order[: i % 3]
                for k, url in order:
                    got[k].append(fb.ttft_ms(url, " ".join(rng.choice(fb.WORDS) for _ in range(32)), model))
            row = {k: statistics.median(v) for k, v in got.items()}
            for k in ("route", "envoy+epp"):
                row[f"{k}_minus_direct"] = statistics.median(b - a for a, b in zip(got["direct"], got[k]))
            rows.append(row)
            print(f"  round {r}: TTFT p50 direct {row['direct']:.2f} ms, route {row['route']:.2f} ms "
                  f"(+{row['route_minus_direct']:.2f}), envoy+epp {row['envoy+epp']:.2f} ms "
                  f"(+{row['envoy+epp_minus_direct']:.2f}); {n} triples", flush=True)
        fc.stop(proc)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"rounds": rows, "median": med}


def served(urls):
    """Requests each replica finished so far."""
    return [fc.metric_sum(fc.metrics(u), "sloserve:request_success_total") for u in urls]


def fleets(args):
    rows, traces = [], {}
    # (a) one replica, straight to it.
    name = "a: one mixed replica, 2 threads, direct"
    print(f"{name} ...", flush=True)
    _, url = fc.replica(args.bin, PORT + 10, "mixed", 2, args.out, ["--max-queue-wait", "0"])
    row, traces[name] = fb.run_workload(args, name, url, 0)
    row["per_replica"] = served([url])
    fc.stop_all()
    rows.append(row)
    # (b) our router, two fleets.
    name = "b: sloserve route, two fleets"
    print(f"{name} ...", flush=True)
    row, traces[name] = fb.fleet_run(args, name, fb.CONFIGS["a: two fleets"], 1)
    rows.append(row)
    # (c) the real gateway over two identical replicas.
    name = "c: Envoy + EPP, two mixed replicas"
    print(f"{name} ...", flush=True)
    with Stack(args, "fleet-stack", "epp", 2, "mixed", 1, ["--serve-arg=--max-queue-wait", "--serve-arg=0"]) as st:
        row, traces[name] = fb.run_workload(args, name, st.url, 2, ["--model", st.model])
        row["per_replica"] = served(st.replicas)
    rows.append(row)
    return rows, traces


def prefix_dataset(args, path, seed):
    """JSONL chats: --prefix-requests users, each with one of --prefixes system prompts
    (Zipf-like popularity, exponent 0.8) and a question of its own."""
    rng = random.Random(seed)
    prompts = [f"You are assistant number {k}. " + " ".join(rng.choice(fb.WORDS) for _ in range(args.prefix_words))
               for k in range(args.prefixes)]
    weights = [1 / (k + 1) ** 0.8 for k in range(args.prefixes)]
    with open(path, "w") as f:
        for i in range(args.prefix_requests):
            k = rng.choices(range(args.prefixes), weights)[0]
            q = f"User {i} asks: " + " ".join(rng.choice(fb.WORDS) for _ in range(20)) + "?"
            f.write(json.dumps({"messages": [{"role": "system", "content": prompts[k]},
                                             {"role": "user", "content": q}], "max_tokens": 16}) + "\n")


# short name: (row label, gateway mode, gateway.py up flags)
PICKERS = {
    "round-robin": ("round-robin (Envoy, no EPP)", "direct", ["--lb-policy", "ROUND_ROBIN"]),
    "approximate": ("EPP, approximate prefix", "epp", ["--epp-config", "approximate"]),
    "precise": ("EPP, precise prefix", "epp", ["--epp-config", "precise"]),
}


def prefix_run(args, short, rnd):
    name, mode, extra = PICKERS[short]
    data = os.path.join(args.out, f"prefix-{rnd}.jsonl")
    if not os.path.exists(data):
        prefix_dataset(args, data, 1000 + rnd)
    tag = f"prefix-{short}-{rnd}"
    serve = [f"--serve-arg=--kv-cache-memory={args.kv_cache_memory}", "--serve-arg=--max-queue-wait",
             "--serve-arg=0"]
    with Stack(args, tag + "-stack", mode, 2, "mixed", 1, [*extra, *serve]) as st:
        before = [fc.metrics(u) for u in st.replicas]
        out = os.path.join(args.out, tag)
        n = args.prefix_requests
        fc.finish(fc.bench(args.bin, st.url, out, [
            "--model", st.model, "--dataset", f"jsonl:{data}", "--num-requests", str(n),
            "--concurrency", str(args.prefix_concurrency), "--ignore-eos", "--seed", str(rnd)]), name)
        after = [fc.metrics(u) for u in st.replicas]
    s, _, _ = fc.results(out)

    def delta(family):
        return [fc.metric_sum(a, family) - fc.metric_sum(b, family) for a, b in zip(after, before)]

    hits, queried = delta("sloserve:prefix_cache_hits_total"), delta("sloserve:prefix_cache_queries_total")
    return {
        "picker": name, "round": rnd, "requests": s["completed"] + s["failed"], "failed": s["failed"],
        "hit_rate": sum(hits) / max(1.0, sum(queried)), "cached_tokens": sum(hits), "queried_tokens": sum(queried),
        "ttft_p50_ms": s["ttft_ms"]["median"], "ttft_p95_ms": s["ttft_ms"]["p95"],
        "per_replica": delta("sloserve:request_success_total"), "output_tok_s": s["output_throughput"],
    }


def prefix(args):
    rows = []
    for rnd in range(args.prefix_rounds):
        for short in args.pickers.split(","):
            print(f"prefix round {rnd}: {PICKERS[short][0]} ...", flush=True)
            rows.append(prefix_run(args, short, rnd))
            r = rows[-1]
            print(f"  hit rate {100 * r['hit_rate']:.1f}%, TTFT p50 {r['ttft_p50_ms']:.0f} ms, "
                  f"P95 {r['ttft_p95_ms']:.0f} ms, per replica {r['per_replica']}", flush=True)
    return rows


def median_rows(rows):
    """Per picker, the median over rounds of each figure."""
    out = []
    for name, _, _ in PICKERS.values():
        rs = [r for r in rows if r["picker"] == name]
        if rs:
            out.append({"picker": name, "rounds": len(rs), "failed": sum(r["failed"] for r in rs),
                        **{k: statistics.median(r[k] for r in rs)
                           for k in ("hit_rate", "ttft_p50_ms", "ttft_p95_ms", "output_tok_s")},
                        "per_replica": [r["per_replica"] for r in rs]})
    return out


def table(over, fleet_rows, prefix_med, args):
    lines = []
    if over:
        m = over["median"]
        lines += [f"Router overhead (idle replica, one-token streamed completions, median of paired differences, "
                  f"median of {len(over['rounds'])} rounds): TTFT direct {m['direct']:.2f} ms; "
                  f"`sloserve route` **+{m['route_minus_direct']:.2f} ms**; Envoy + EPP "
                  f"**+{m['envoy+epp_minus_direct']:.2f} ms**\n"]
    if fleet_rows:
        lines += ["| config | interactive TTFT p50 ms | TTFT P95 ms | goodput @ 1 s (req/s) | attainment | "
                  "batch output tok/s | batch job s | failed | per replica |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in fleet_rows:
            lines.append(
                f"| {r['config']} | {r['interactive_ttft_p50_ms']:.0f} | {r['interactive_ttft_p95_ms']:.0f} | "
                f"{r['goodput_1s_req_s']:.2f} | {100 * r['attainment_1s']:.0f}% | {r['batch_output_tok_s']:.1f} | "
                f"{r['batch_duration_s']:.0f} | {r['interactive_failed'] + r['batch_failed']} | "
                f"{r.get('per_replica', '')} |")
        lines.append("")
    if prefix_med:
        lines += [f"Prefix-heavy: {args.prefix_requests} chats, {args.prefixes} system prompts of {args.prefix_words} "
                  f"words, concurrency {args.prefix_concurrency}, KV cache {args.kv_cache_memory} a replica "
                  f"(medians over rounds)\n",
                  "| picker | prefix-cache hit rate | TTFT p50 ms | TTFT P95 ms | output tok/s | failed | "
                  "requests per replica (each round) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in prefix_med:
            split = "; ".join("/".join(f"{x:.0f}" for x in p) for p in r["per_replica"])
            lines.append(f"| {r['picker']} | {100 * r['hit_rate']:.1f}% | {r['ttft_p50_ms']:.0f} | "
                         f"{r['ttft_p95_ms']:.0f} | {r['output_tok_s']:.1f} | {r['failed']} | {split} |")
    return "\n".join(lines) + "\n"


def plot(fleet_rows, prefix_med, path):
    plt = fc.pyplot()
    n = 2 * bool(fleet_rows) + bool(prefix_med)
    if plt is None or n == 0:
        return
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4.5), squeeze=False)
    axes = list(axes[0])
    if fleet_rows:
        xs = range(len(fleet_rows))
        labels = [r["config"].split(":")[0] for r in fleet_rows]
        ttft, tok = axes.pop(0), axes.pop(0)
        ttft.bar(xs, [r["interactive_ttft_p95_ms"] for r in fleet_rows], color="tab:blue")
        ttft.set_ylabel("interactive TTFT P95 (ms)")
        ttft.axhline(1000, color="grey", linestyle="--", linewidth=1)
        tok.bar(xs, [r["batch_output_tok_s"] for r in fleet_rows], color="tab:green")
        tok.set_ylabel("batch job output tok/s")
        for ax in (ttft, tok):
            ax.set_xticks(xs, labels)
            ax.set_title("a: one replica, b: route (2 fleets), c: Envoy+EPP", fontsize=9)
    if prefix_med:
        ax = axes.pop(0)
        xs = range(len(prefix_med))
        ax.bar(xs, [100 * r["hit_rate"] for r in prefix_med], color="tab:orange")
        ax.set_xticks(xs, [r["picker"].split(" (")[0] for r in prefix_med], fontsize=8)
        ax.set_ylabel("prefix-cache hit rate (%)")
        for x, r in zip(xs, prefix_med):
            ax.text(x, 100 * r["hit_rate"] + 1, f"TTFT p50 {r['ttft_p50_ms']:.0f} ms", ha="center", fontsize=8)
        ax.set_title("prefix-heavy traffic, two replicas", fontsize=9)
    fig.suptitle("sloserve behind Envoy + llm-d's EPP", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def report(over, fleet_rows, prefix_rows, args):
    """The table, gateway-bench.md/.json and the plot, into args.out."""
    prefix_med = median_rows(prefix_rows)
    md = table(over, fleet_rows, prefix_med, args)
    print("\n" + md)
    with open(os.path.join(args.out, "gateway-bench.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "gateway-bench.json"), "w") as f:
        json.dump({"overhead": over, "fleets": fleet_rows, "prefix": prefix_rows, "prefix_median": prefix_med,
                   "smoke": args.smoke, "args": vars(args)}, f, indent=1)
    plot(fleet_rows, prefix_med, os.path.join(args.out, "gateway-bench.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--out", default="out/gateway-bench")
    ap.add_argument("--only", choices=["overhead", "fleets", "prefix"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, measures nothing")
    ap.add_argument("--from-json", help="a gateway-bench.json: its table and plot again, into --out (measures nothing)")
    ap.add_argument("--rounds", type=int, default=5, help="overhead rounds")
    ap.add_argument("--pairs", type=int, default=60, help="triples per overhead round")
    ap.add_argument("--rate", type=float, default=1.0, help="fleets: interactive requests per second")
    ap.add_argument("--interactive", type=int, default=90, help="fleets: interactive requests")
    ap.add_argument("--batch", type=int, default=200, help="fleets: requests in the batch job")
    ap.add_argument("--batch-concurrency", type=int, default=32)
    ap.add_argument("--prefixes", type=int, default=12)
    ap.add_argument("--prefix-words", type=int, default=500)
    ap.add_argument("--prefix-requests", type=int, default=96)
    ap.add_argument("--prefix-concurrency", type=int, default=4)
    ap.add_argument("--prefix-rounds", type=int, default=3)
    ap.add_argument("--kv-cache-memory", default="64MiB", help="prefix: each replica's KV cache")
    ap.add_argument("--pickers", default="round-robin,approximate,precise",
                    help="prefix: which pickers, comma-separated (" + ", ".join(PICKERS) + ")")
    args = ap.parse_args()
    args.bin, args.model = os.path.abspath(args.bin), os.path.abspath(args.model)
    if args.smoke:
        args.rounds, args.batch, args.interactive, args.prefix_rounds, args.prefix_requests = 1, 8, 6, 1, 8
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(args.from_json) as f:
            d = json.load(f)
        for k, v in d["args"].items():
            if k not in ("out", "from_json"):
                setattr(args, k, v)
        return report(d["overhead"], d["fleets"], d["prefix"], args)
    over, fleet_rows, prefix_rows = None, [], []
    if args.only in (None, "overhead"):
        print("router overhead:", flush=True)
        over = overhead(args)
    if args.only in (None, "fleets"):
        fleet_rows, _ = fleets(args)
    if args.only in (None, "prefix"):
        prefix_rows = prefix(args)
    report(over, fleet_rows, prefix_rows, args)


if __name__ == "__main__":
    main()
