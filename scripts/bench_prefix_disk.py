#!/usr/bin/env python3
"""TTFT of a long system prompt: cold, and after a restart with the prefix cache's disk tier
(`--prefix-cache-dir`), beside llama-server restoring a saved slot (`--slot-save-path`,
`POST /slots/0?action=restore`), in one sitting on the same GGUF file and threads.

Per round: sloserve with an empty cache directory answers a chat whose system prompt is about
4,000 tokens (cold TTFT), is stopped (SIGTERM; `--kill` for SIGKILL), restarted on the same
directory, and answers the same chat again (TTFT after the restart; its text must equal the
cold one). llama-server answers the chat cold, saves slot 0, is restarted, restores the slot
(timed) and answers again. Medians over rounds; the load average per round.

usage: scripts/bench_prefix_disk.py [--rounds 3] [--model FILE] [--threads 2] [--kill]
         [--bin target/release/sloserve] [--llama-bin DIR] [--no-llama] [--out FILE.json]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_BIN = os.path.expanduser("~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_prompt():
    """About 4,000 tokens of rules an agent might carry."""
    topics = ["invoices", "refunds", "shipping", "returns", "accounts", "taxes", "coupons", "warranty"]
    rules = [f"Rule {i}: when a customer asks about {topics[i % 8]} case {i * 7 % 101}, first check "
             f"ledger entry {i * 13 % 997} and cite section {i % 17}.{i % 5} of the handbook."
             for i in range(1, 141)]
    return "You are the support agent of a small shop. Follow every rule below.\n" + "\n".join(rules)


def wait_ready(port, path, proc, secs=300):
    t0 = time.time()
    while time.time() - t0 < secs:
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode})")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("server not ready")


def chat(port, system):
    """(TTFT seconds, text, prompt tokens, cached tokens) of a streamed greedy chat."""
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "Which rule covers refunds case 14?"}]}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"chat: HTTP {r.status}: {r.read()[:500]}")
    ttft, text, usage = None, "", {}
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        ev = json.loads(line[5:])
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.time() - t0
            text += piece
        usage = ev.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, text, usage.get("prompt_tokens"), cached


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        sys.exit(f"{path}: HTTP {r.status}: {data[:500]}")
    return time.time() - t0


def stop(proc, kill):
    proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    proc.wait(timeout=120)


def sloserve_round(args, system):
    cache = tempfile.mkdtemp(prefix="sloserve-disk-")
    port = free_port()
    cmd = [args.bin, "serve", "--model", args.model, "--port", str(port), "--threads", str(args.threads),
           "--served-model-name", "m", "--max-model-len", "8192", "--kv-cache-memory", "1GiB",
           "--prefix-cache-dir", cache, "--no-batch-api"]
    out = {}
    try:
        for phase in ("cold", "restart"):
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t0 = time.time()
            wait_ready(port, "/ready", p)
            out[f"{phase}_start_s"] = time.time() - t0
            out[phase] = chat(port, system)
            if phase == "cold":
                time.sleep(1.0)  # the writer finishes (a SIGTERM drains it anyway)
            stop(p, args.kill and phase == "cold")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return out


def llama_round(args, system):
    slots = tempfile.mkdtemp(prefix="llama-slots-")
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=args.llama_bin)
    cmd = [f"{args.llama_bin}/llama-server", "-m", args.model, "--port", str(port), "-t", str(args.threads),
           "-c", "8192", "-np", "1", "--slot-save-path", slots + "/", "-a", "m"]
    out = {}
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_ready(port, "/health", p)
        out["cold"] = chat(port, system)
        post(port, "/slots/0?action=save", {"filename": "sys.bin"})
        stop(p, False)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_ready(port, "/health", p)
        out["restore_s"] = post(port, "/slots/0?action=restore", {"filename": "sys.bin"})
        out["restart"] = chat(port, system)
        stop(p, False)
    finally:
        shutil.rmtree(slots, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kill", action="store_true", help="SIGKILL sloserve instead of SIGTERM")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/sloserve"))
    ap.add_argument("--llama-bin", default=LLAMA_BIN)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "target/bench/prefix-disk.json"))
    args = ap.parse_args()
    system = system_prompt()
    rounds = []
    for i in range(args.rounds):
        r = {"load": load(), "sloserve": sloserve_round(args, system)}
        s = r["sloserve"]
        if s["cold"][1] != s["restart"][1]:
            sys.exit(f"round {i}: the output after the restart differs from the cold one:\n"
                     f"{s['cold'][1]!r}\n{s['restart'][1]!r}")
        if not args.no_llama:
            r["llama"] = llama_round(args, system)
        log(f"round {i}: load {r['load']}: sloserve cold {s['cold'][0]:.2f} s, after restart "
            f"{s['restart'][0]:.3f} s (prompt {s['cold'][2]}, cached {s['restart'][3]})"
            + ("" if args.no_llama else
               f"; llama-server cold {r['llama']['cold'][0]:.2f} s, restore {r['llama']['restore_s']:.3f} s"
               f" + TTFT {r['llama']['restart'][0]:.3f} s"))
        rounds.append(r)
    med = lambda f: statistics.median(f(r) for r in rounds)
    summary = {
        "sloserve_cold_ttft_s": med(lambda r: r["sloserve"]["cold"][0]),
        "sloserve_restart_ttft_s": med(lambda r: r["sloserve"]["restart"][0]),
        "prompt_tokens": rounds[0]["sloserve"]["cold"][2],
        "cached_tokens_after_restart": rounds[0]["sloserve"]["restart"][3],
        "stop": "SIGKILL" if args.kill else "SIGTERM",
    }
    if not args.no_llama:
        summary["llama_cold_ttft_s"] = med(lambda r: r["llama"]["cold"][0])
        summary["llama_restore_s"] = med(lambda r: r["llama"]["restore_s"])
        summary["llama_restore_plus_ttft_s"] = med(lambda r: r["llama"]["restore_s"] + r["llama"]["restart"][0])
    print(json.dumps(summary, indent=2))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "rounds": rounds}, f, indent=2)


if __name__ == "__main__":
    main()
