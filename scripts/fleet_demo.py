#!/usr/bin/env python3
"""`make fleet-demo`: two replicas on one machine behind `sloserve route`.

Starts `sloserve serve --profile interactive --threads 1` and `--profile batch
--threads 1` on loopback ports, `sloserve route --fleet interactive=... --fleet
batch=...` in front of them, and drives the router with two `sloserve bench` runs
at once: interactive shared-prefix chat-like traffic at a fixed rate, and a batch
job (batch class). Prints each fleet's TTFT and throughput and what the replicas'
and the router's /metrics say about where requests went, and plots per-fleet TTFT
over time and output tok/s per second to OUT/fleet-demo.png. Every process it
started is stopped when it ends (also on ctrl-c / SIGTERM).

usage: scripts/fleet_demo.py [--bin target/release/sloserve] [--out out/fleet-demo]
       [--smoke] [--spill-over]
Loopback only; every loop is bounded in requests and time.
"""
import argparse
import os

import fleet_common as fc

BASE_PORT = 8300


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--out", default="out/fleet-demo")
    ap.add_argument("--smoke", action="store_true", help="a few requests only (checks the script)")
    ap.add_argument("--spill-over", action="store_true", help="let batch requests use the idle interactive replica")
    ap.add_argument("--rate", type=float, default=1.0, help="interactive requests per second")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n_inter, n_batch = (6, 8) if args.smoke else (60, 200)

    # Short steps on the interactive replica: spilled batch prefill must not hold an
    # interactive arrival for long.
    _, i_url = fc.replica(args.bin, BASE_PORT + 1, "interactive", 1, args.out, ["--max-step-ms", "100"])
    # The job's requests arrive at once and are meant to queue (no wait refusals).
    _, b_url = fc.replica(args.bin, BASE_PORT + 2, "batch", 1, args.out, ["--max-queue-wait", "0"])
    extra = ["--spill-over"] if args.spill_over else []
    _, r_url = fc.router(args.bin, BASE_PORT, {"interactive": [i_url], "batch": [b_url]}, args.out, extra)
    print(f"replicas: interactive {i_url}, batch {b_url}; router {r_url}")

    inter_out = os.path.join(args.out, "interactive")
    batch_out = os.path.join(args.out, "batch")
    inter = fc.bench(args.bin, r_url, inter_out, [
        "--dataset", "prefix", "--prefix-len", "200", "--input-len", "24", "--output-len", "16",
        "--request-rate", str(args.rate), "--num-requests", str(n_inter), "--ignore-eos",
        "--slo-class", "interactive=1", "--slo", "ttft=1000ms", "--seed", "1"])
    batch = fc.bench(args.bin, r_url, batch_out, [
        "--dataset", "synthetic", "--input-len", "128", "--output-len", "32",
        "--concurrency", str(min(n_batch, 64)), "--num-requests", str(n_batch), "--ignore-eos",
        "--slo-class", "batch=1", "--seed", "2"])
    fc.finish(inter, "interactive bench")
    fc.finish(batch, "batch bench")

    rm, im, bm = fc.metrics(r_url), fc.metrics(i_url), fc.metrics(b_url)
    fc.stop_all()

    runs = {}
    for name, out in (("interactive", inter_out), ("batch", batch_out)):
        summary, reqs, t0 = fc.results(out)
        runs[name] = (summary, reqs, t0)
    t_start = min(r[2] for r in runs.values())
    print(f"\n{'fleet':<12} {'requests':>8} {'failed':>6} {'TTFT p50 ms':>12} {'TTFT P95 ms':>12} {'output tok/s':>12}")
    for name, (s, _, _) in runs.items():
        print(f"{name:<12} {s['completed']:>8} {s['failed']:>6} {s['ttft_ms']['median']:>12.0f} "
              f"{s['ttft_ms']['p95']:>12.0f} {s['output_throughput']:>12.1f}")
    s = runs["interactive"][0]
    if s.get("slo_attainment") is not None:
        print(f"interactive TTFT <= 1 s: {100 * s['slo_attainment']:.0f}% of requests, goodput {s['goodput']:.2f} req/s")
    fin = "sloserve:request_success_total{"
    for rname, text in (("interactive replica", im), ("batch replica", bm)):
        n_i = fc.metric_sum(text, fin, 'slo_class="interactive"')
        n_b = fc.metric_sum(text, fin, 'slo_class="batch"')
        print(f"{rname}: {n_i:.0f} interactive, {n_b:.0f} batch requests finished")
    print(f"router: {fc.metric_sum(rm, 'sloserve_router:spilled_total'):.0f} spilled, "
          f"{fc.metric_sum(rm, 'sloserve_router:retries_total'):.0f} retried")
    with open(os.path.join(args.out, "router-metrics.txt"), "w") as f:
        f.write(rm)

    plt = fc.pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    colors = {"interactive": "tab:blue", "batch": "tab:orange"}
    for name, (_, reqs, t0) in runs.items():
        xs, ys = fc.ttft_points(reqs, t0 - t_start)
        ax1.scatter(xs, ys, s=12, label=f"{name} fleet", color=colors[name])
        xs, ys = fc.per_second(reqs, t0 - t_start)
        ax2.plot(xs, ys, label=f"{name} fleet", color=colors[name])
    ax1.axhline(1000, color="grey", linestyle="--", linewidth=1, label="1 s TTFT SLO")
    ax1.set_ylabel("TTFT (ms), by send time")
    ax1.set_yscale("log")
    ax1.legend()
    ax2.set_ylabel("output tok/s")
    ax2.set_xlabel("seconds since start")
    ax2.legend()
    fig.suptitle("sloserve route: interactive and batch fleets (one thread each)")
    fig.tight_layout()
    path = os.path.join(args.out, "fleet-demo.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
