#!/usr/bin/env python3
"""Time to ready and resident memory of `sloserve serve` beside llama-server on one GGUF file.

Each round starts each server in turn on a warm page cache (the file is read once before the
first round), polls its readiness route every 20 ms, and reads the process's VmRSS (after ready)
and VmHWM (the peak during load) from /proc. Both servers get the same KV cache: llama-server
`-c CTX -np 1` (f16 keys and values), sloserve `--kv-cache-memory` of the same bytes.
Prints per server the median and range over rounds, and the ratios; writes JSON.

usage: scripts/bench_load.py --model models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--rounds 5]
         [--ctx 4096] [--bin target/release/sloserve] [--llama-bin DIR] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_BIN = os.path.expanduser("~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")


def status_mb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def one(name, cmd, url, env=None, timeout=300):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, **(env or {})))
    try:
        while not ready(url):
            if p.poll() is not None:
                sys.exit(f"{name} exited ({p.returncode}): {p.stderr.read().decode()[-2000:]}")
            if time.monotonic() - t0 > timeout:
                sys.exit(f"{name} not ready after {timeout} s")
            time.sleep(0.02)
        secs = time.monotonic() - t0
        time.sleep(0.5)
        return {"ready_s": secs, "rss_mb": status_mb(p.pid, "VmRSS:"), "peak_mb": status_mb(p.pid, "VmHWM:")}
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--kv-bytes-per-token", type=int, default=28672,
                    help="f16 K+V bytes per token (Qwen2.5 1.5B: 28 layers x 2 x 256 x 2 = 28672)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/sloserve"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", LLAMA_BIN))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    with open(model, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    kv = a.ctx * a.kv_bytes_per_token
    file_mb = os.path.getsize(model) / 2**20
    servers = {
        "sloserve": ([a.bin, "serve", "--model", model, "--port", "8091", "--kv-cache-memory", str(kv),
                      "--max-model-len", str(a.ctx)], "http://127.0.0.1:8091/ready", None),
        "llama-server": ([f"{a.llama_bin}/llama-server", "-m", model, "--port", "8092", "-c", str(a.ctx), "-np", "1",
                          "-t", "2"], "http://127.0.0.1:8092/health", {"LD_LIBRARY_PATH": a.llama_bin}),
    }
    if not os.path.exists(servers["llama-server"][0][0]):
        del servers["llama-server"]
    rounds = []
    for i in range(a.rounds):
        r = {name: one(name, *spec) for name, spec in servers.items()}
        print(f"round {i + 1}: " + "; ".join(f"{n} ready {v['ready_s']:.2f} s, RSS {v['rss_mb']:.0f} MB, "
                                            f"peak {v['peak_mb']:.0f} MB" for n, v in r.items()), file=sys.stderr)
        rounds.append(r)
    summary = {}
    for name in servers:
        summary[name] = {k: {"median": statistics.median(r[name][k] for r in rounds),
                             "range": [min(r[name][k] for r in rounds), max(r[name][k] for r in rounds)]}
                         for k in ("ready_s", "rss_mb", "peak_mb")}
    print(f"{os.path.basename(model)}: {file_mb:.0f} MiB file, KV {kv / 2**20:.0f} MiB ({a.ctx} tokens), "
          f"{a.rounds} rounds, medians (range)")
    print("| server | time to ready (s) | RSS after ready (MiB) | peak RSS during load (MiB) |")
    print("| --- | --- | --- | --- |")
    for name, s in summary.items():
        cell = lambda k, f: f"{s[k]['median']:{f}} ({s[k]['range'][0]:{f}}-{s[k]['range'][1]:{f}})"
        print(f"| {name} | {cell('ready_s', '.2f')} | {cell('rss_mb', '.0f')} | {cell('peak_mb', '.0f')} |")
    bound = 1.15 * file_mb + kv / 2**20 + 300e6 / 2**20
    print(f"issue #29 bound (1.15 x file + KV + 300 MB): {bound:.0f} MiB")
    if "llama-server" in summary:
        r = summary["sloserve"]["ready_s"]["median"] / summary["llama-server"]["ready_s"]["median"]
        print(f"ready time sloserve : llama-server = {r:.2f}x (goal <= 1.5x + 1 s: "
              f"{1.5 * summary['llama-server']['ready_s']['median'] + 1:.2f} s)")
    out = a.out or os.path.join(ROOT, "target/bench", f"load-{os.path.splitext(os.path.basename(model))[0]}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"model": a.model, "ctx": a.ctx, "kv_bytes": kv, "file_mib": file_mb, "rounds": rounds,
                   "summary": summary, "bound_mib": bound, "date": time.strftime("%Y-%m-%d %H:%M")}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
