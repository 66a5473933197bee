#!/usr/bin/env python3
"""How fast a sloserve replica answers /metrics while it generates: the EPP scrapes each
replica every 50 ms and takes a replica whose metrics are too old as saturated, so a
scrape must take a few ms under load, not a step's time.

Starts `sloserve serve` (or uses --url), keeps --concurrency streaming generations
running, scrapes /metrics every --interval s for --seconds s on one keep-alive
connection (as the EPP's HTTP client does), and prints p50 / p99 / max latency and the
body size. Also checks that the vllm:* gauges move while it runs.

usage: deploy/local/metrics_latency.py --bin target/release/sloserve [--concurrency 8]
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request


SERVER = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate_forever(host, port, stop, i, counts):
    body = json.dumps({"prompt": f"Story {i}: once upon a time", "max_tokens": 128, "stream": True,
                       "temperature": 0.8, "seed": i}).encode()
    while not stop.is_set():
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            while not stop.is_set() and r.readline():
                pass
            counts[i] += 1
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()


def freshness(host, port, seconds=3.0):
    """How old a scrape's vllm:* gauges can be: they come from the engine's snapshot,
    published after each step, so they change once a step. Polls /metrics every ~2 ms
    and returns the intervals (ms) between changes of sloserve:generation_tokens_total."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    changes, last = [], None
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        conn.request("GET", "/metrics")
        for line in conn.getresponse().read().decode().splitlines():
            if line.startswith("sloserve:generation_tokens_total{"):
                v = line.rsplit(" ", 1)[1]
                if v != last:
                    changes.append(time.perf_counter())
                    last = v
        time.sleep(0.002)
    conn.close()
    return [(b - a) * 1000 for a, b in zip(changes[1:], changes[2:])]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running replica, e.g. http://127.0.0.1:8000")
    ap.add_argument("--bin", help="the sloserve binary to start (when no --url)")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--interval", type=float, default=0.05)
    args = ap.parse_args()
    proc = None
    if args.url:
        host, port = args.url.split("//")[1].rstrip("/").split(":")
        port = int(port)
    else:
        host, port = "127.0.0.1", free_port()
        global SERVER
        proc = SERVER = subprocess.Popen([args.bin, "serve", "--model", args.model, "--host", host, "--port", str(port),
                                 *args.serve_arg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.time() - t0 > 180:
                    sys.exit("server did not become ready")
                time.sleep(0.2)
    stop = threading.Event()
    counts = [0] * args.concurrency
    gens = [threading.Thread(target=generate_forever, args=(host, port, stop, i, counts), daemon=True)
            for i in range(args.concurrency)]
    for t in gens:
        t.start()
    time.sleep(2.0)  # let the generations reach the engine
    lat, size, running = [], 0, []
    conn = http.client.HTTPConnection(host, port, timeout=10)
    t_end = time.time() + args.seconds
    while time.time() < t_end:
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        lat.append((time.perf_counter() - t0) * 1000)
        size = len(body)
        for line in body.decode().splitlines():
            if line.startswith("vllm:num_requests_running{"):
                running.append(float(line.rsplit(" ", 1)[1]))
        time.sleep(max(0.0, args.interval - (time.perf_counter() - t0)))
    conn.close()
    lags = freshness(host, port)
    stop.set()
    load = os.getloadavg()[0]
    print(f"/metrics under {args.concurrency} streaming generations, {len(lat)} scrapes every "
          f"{args.interval * 1000:.0f} ms over {args.seconds:.0f} s (load average {load:.2f}, {os.cpu_count()} CPUs):")
    print(f"  latency p50 {pct(lat, 0.5):.2f} ms, p99 {pct(lat, 0.99):.2f} ms, max {max(lat):.2f} ms; "
          f"body {size} bytes")
    print(f"  vllm:num_requests_running seen: min {min(running):.0f}, max {max(running):.0f}; "
          f"generations finished meanwhile: {sum(counts)}")
    print(f"  freshness: the gauges changed every p50 {pct(lags, 0.5):.0f} ms, p99 {pct(lags, 0.99):.0f} ms, "
          f"max {max(lags):.0f} ms (once per engine step, {len(lags)} steps seen)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if SERVER:
            SERVER.terminate()
            SERVER.wait(timeout=30)
