#!/usr/bin/env python3
"""Preemption that keeps work: a batch flood with interactive arrivals on a small KV budget,
with preempted sequences' KV kept (`preemption_keeps_kv`, the default) and freed at once
(`--no-preemption-keeps-kv`, the earlier behaviour), in one sitting on the same binary.

Per run: `sloserve serve` with `--max-num-seqs` slots and `--kv-cache-memory` small enough that
the batch flood fills it; the flood (`--batch` requests of distinct ~`--batch-words`-word prompts,
`--batch-tokens` generated with `ignore_eos`) is sent at once; meanwhile one interactive client
sends short requests back to back (`--think` seconds apart) until the flood is done, each
taking a running batch sequence's slot (a preemption). Reported: the flood's wall time and
output tokens/s, the interactive requests' latency, and from /metrics the preemptions, what
became of their KV when they resumed (kept / spilled / recomputed) and the tokens recomputed
(prompt, generated). Runs alternate off/on `--rounds` times; the load average is recorded.

usage: scripts/bench_preempt.py [--model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]
         [--bin target/release/sloserve] [--threads 2] [--rounds 1] [--kv 40MiB]
         [--max-num-seqs 6] [--batch 12] [--batch-words 220] [--batch-tokens 48] [--keep-first]
         [--out FILE.json]
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("river stone lamp quiet orange tiger paper cloud silver garden window market "
         "winter copper forest candle bridge harbor meadow violet engine ladder pepper").split()


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(seed, n):
    """`n` pseudo-random words, distinct per seed (no shared prefix beyond the first word)."""
    x, out = seed * 2654435761 + 1, [f"Request {seed}:"]
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(x >> 33) % len(WORDS)])
    return " ".join(out)


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]}")
    return time.time() - t0, json.loads(data)["usage"]["completion_tokens"]


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r'sloserve:(num_preemptions_total|preemption_resumptions_total|'
                     r'preemption_paused_released_total|recomputed_tokens_total|'
                     r'prefix_cache_hits_total|engine_steps_total)\{([^}]*)\} (\S+)', line)
        if m:
            label = re.findall(r'(?:kv|part)="(\w+)"', m.group(2))
            key = m.group(1) + (f".{label[0]}" if label else "")
            out[key] = float(m.group(3))
    return out


def wait_ready(port, proc, secs=300):
    t0 = time.time()
    while time.time() - t0 < secs:
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode})")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/ready")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("server not ready")


def one_run(args, keep):
    port = free_port()
    cmd = [args.bin, "serve", "--model", args.model, "--port", str(port), "--threads", str(args.threads),
           "--served-model-name", "m", "--max-model-len", "2048", "--kv-cache-memory", args.kv,
           "--max-num-seqs", str(args.max_num_seqs), "--no-batch-api"]
    if not keep:
        cmd.append("--no-preemption-keeps-kv")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, p)
        load0 = load()
        done = threading.Event()
        batch_out, inter = [], []
        lock = threading.Lock()

        def batch(i):
            body = {"model": "m", "prompt": text(i, args.batch_words), "max_tokens": args.batch_tokens,
                    "ignore_eos": True, "temperature": 0, "slo_class": "batch"}
            _, n = post(port, body)
            with lock:
                batch_out.append(n)

        def interactive():
            k = 0
            while not done.is_set():
                body = {"model": "m", "prompt": text(10_000 + k, 30), "max_tokens": 8,
                        "temperature": 0, "slo_class": "interactive"}
                inter.append(post(port, body)[0])
                k += 1
                done.wait(args.think)

        t0 = time.time()
        flood = [threading.Thread(target=batch, args=(i,)) for i in range(args.batch)]
        for t in flood:
            t.start()
        time.sleep(args.think)
        it = threading.Thread(target=interactive)
        it.start()
        for t in flood:
            t.join()
        wall = time.time() - t0
        done.set()
        it.join()
        m = metrics(port)
        r = {"keep": keep, "flood_s": wall, "flood_tokens": sum(batch_out),
             "flood_tok_s": sum(batch_out) / wall, "interactive": len(inter),
             "interactive_p50_s": statistics.median(inter) if inter else None,
             "load_before": load0, "load_after": load(), "metrics": m}
        log(json.dumps(r))
        return r
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/sloserve"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kv", default="40MiB")
    ap.add_argument("--max-num-seqs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--batch-words", type=int, default=220)
    ap.add_argument("--batch-tokens", type=int, default=48)
    ap.add_argument("--think", type=float, default=1.0)
    ap.add_argument("--keep-first", action="store_true", help="run with the KV kept first in each round")
    ap.add_argument("--out")
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for keep in ((True, False) if args.keep_first else (False, True)):
            log(f"round {r + 1}: preemption_keeps_kv={keep}, load {load()}")
            runs.append(one_run(args, keep))
    out = {"args": vars(args), "runs": runs}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    for keep in (False, True):
        rs = [r for r in runs if r["keep"] == keep]
        med = lambda k: statistics.median(x[k] for x in rs)
        mm = lambda k: statistics.median(x["metrics"].get(k, 0) for x in rs)
        print(f"keeps_kv={keep}: flood {med('flood_s'):.1f} s, {med('flood_tok_s'):.2f} out tok/s; "
              f"{mm('num_preemptions_total'):.0f} preemptions, resumed kept "
              f"{mm('preemption_resumptions_total.kept'):.0f} / spilled "
              f"{mm('preemption_resumptions_total.spilled'):.0f} / recomputed "
              f"{mm('preemption_resumptions_total.recomputed'):.0f}; recomputed tokens prompt "
              f"{mm('recomputed_tokens_total.prompt'):.0f}, generated "
              f"{mm('recomputed_tokens_total.generated'):.0f}; interactive p50 "
              f"{med('interactive_p50_s'):.2f} s over {med('interactive'):.0f}")


if __name__ == "__main__":
    main()
