#!/usr/bin/env python3
"""Where an interactive stream's TTFT goes beside a batch flood, from the server's own
histograms: the client's TTFT against the engine's (arrival -> first token), split into
queue (arrival -> first scheduled step) and prefill (first scheduled step -> first
token), means over the interactive class, alone and beside the flood.

The mix is scripts/bench_slo_steps.py's (`--shape small`: the default model, stream c=2
with a warmed prefix, flood c=16); the server runs `--profile mixed` plus CONFIG_TOML.
Run with RUST_LOG=info,sloserve_engine::scheduler=trace to keep every step's planned
shape, prediction, limit and measured time in /tmp/ttft-breakdown-{alone,beside}.log.

usage: scripts/ttft_breakdown.py [--bin target/release/sloserve] [--model FILE]
         [--config-toml 'interactive_followup_ms = 0'] [--reps 2]
"""
import argparse, importlib.util, os, statistics, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("slo_steps", os.path.join(HERE, "bench_slo_steps.py"))
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def hist(metrics, name):
    out = {"sum": 0.0, "count": 0.0}
    for suf in out:
        for line in metrics.splitlines():
            if line.startswith(f"sloserve:{name}_{suf}{{") and 'slo_class="interactive"' in line:
                out[suf] = float(line.split()[-1])
    return out


def mean_ms(m0, m1, name):
    a, c = hist(m0, name), hist(m1, name)
    n = c["count"] - a["count"]
    return (c["sum"] - a["sum"]) / n * 1e3 if n else float("nan")


def run(args, beside):
    w = b.Workload(1, b.SHAPES["small"])
    sh = w.shape
    name = "beside" if beside else "alone"
    with open(f"/tmp/ttft-breakdown-{name}.log", "w") as log:
        srv = b.Server(args.bin, args.model, args.config_toml, log)
        try:
            b.warm(w)
            t0 = time.perf_counter()
            stop = threading.Event()
            fthreads = []
            if beside:
                fthreads, _ = b.closed_loop(lambda i: w.batch(50_000 + i), sh["flood_c"], t0, stop=stop)
                time.sleep(4.0)  # the flood fills the engine first
            m0 = srv.metrics()
            inter = b.run_loop(w.interactive, sh["inter_c"], t0, sh["inter_requests"], b.STAGGER_S)
            m1 = srv.metrics()
            stop.set()
            for t in fthreads:
                t.join()
        finally:
            srv.stop()
    st = b.summarize_interactive(inter)
    ttfts = [r["ttft"] * 1e3 for r in inter if r["ok"]]
    print(f"{name:6}: client TTFT mean {statistics.mean(ttfts):.1f} ms, p50 {st['ttft_p50_ms']:.1f}, "
          f"P95 {st['ttft_p95_ms']:.1f} | engine TTFT mean {mean_ms(m0, m1, 'time_to_first_token_seconds'):.1f}: "
          f"queue {mean_ms(m0, m1, 'request_queue_time_seconds'):.1f} + prefill "
          f"{mean_ms(m0, m1, 'request_prefill_time_seconds'):.1f} | TPOT p50 {st['tpot_p50_ms']:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--config-toml", default="", help="engine settings on top of `mixed`")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    for _ in range(args.reps):
        run(args, False)
        run(args, True)


if __name__ == "__main__":
    main()
