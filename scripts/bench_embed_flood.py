#!/usr/bin/env python3
"""An interactive chat stream beside an embeddings flood (issue #53): one `sloserve serve` on a
decoder model that both chats and embeds (`--pooling mean`); a closed loop of interactive chat
requests (one at a time, streamed) measures TTFT and TPOT alone for PHASE seconds, then again while
FLOOD clients keep `/v1/embeddings` requests of BATCH texts in flight (batch class, the default for
pooling requests). Prints TTFT p50/p95 and TPOT p50 of both phases against the interactive target
(`--default-ttft-slo-ms`, 500 ms unless given), the embeddings' inputs/s during the flood, and any
non-200 answer. Repeats the pair ROUNDS times. Standard library only; loopback only.

Usage: bench_embed_flood.py --bin target/release/sloserve [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
           [--phase 60] [--flood 4] [--batch 32] [--rounds 3] [--json out.json]
"""
import argparse, json, os, socket, statistics, subprocess, sys, threading, time, urllib.request, http.client

WORDS = ("the harbour town kept its boats close that winter while the lighthouse keeper wrote "
         "each storm into a ledger nobody read until spring when the fishermen argued about "
         "nets prices weather and the new school the council had promised for years").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(i, words):
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)) + f" ({i})"


def wait_ready(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("server not ready")


def chat_once(port, i, max_tokens):
    """One streamed interactive chat; returns (ttft_s, tpot_s or None, status)."""
    body = {"messages": [{"role": "user", "content": "Summarise in one line: " + text(i, 60)}],
            "max_tokens": max_tokens, "stream": True, "temperature": 0, "ignore_eos": True,
            "slo_class": "interactive"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        return None, None, resp.status
    first, last, n = None, None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    conn.close()
    if first is None:
        return None, None, 599
    tpot = (last - first) / (n - 1) if n > 1 else None
    return first - t0, tpot, 200


def flood_worker(port, stop, batch, counts, errors, seed):
    i = seed * 100000
    while not stop.is_set():
        body = {"input": [text(i + k, 48) for k in range(batch)]}
        i += batch
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            conn.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                counts.append(batch)
            else:
                errors.append(r.status)
        except OSError as e:
            errors.append(str(e))
        finally:
            conn.close()


def phase(port, seconds, max_tokens, start_i):
    ttfts, tpots, bad = [], [], []
    i = start_i
    t_end = time.time() + seconds
    while time.time() < t_end:
        ttft, tpot, status = chat_once(port, i, max_tokens)
        i += 1
        if status != 200:
            bad.append(status)
            continue
        ttfts.append(ttft)
        if tpot is not None:
            tpots.append(tpot)
    return ttfts, tpots, bad, i


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def summary(name, ttfts, tpots):
    return {"phase": name, "requests": len(ttfts), "ttft_p50_ms": 1000 * pct(ttfts, 0.5),
            "ttft_p95_ms": 1000 * pct(ttfts, 0.95), "tpot_p50_ms": 1000 * pct(tpots, 0.5)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--phase", type=float, default=60)
    ap.add_argument("--flood", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ttft-target-ms", type=float, default=500)
    ap.add_argument("--json")
    a = ap.parse_args()
    port = free_port()
    log = open("/tmp/bench-embed-flood.log", "w")
    proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", str(port),
                             "--pooling", "mean", "--no-batch-api",
                             "--default-ttft-slo-ms", str(a.ttft_target_ms)], stdout=log, stderr=log)
    rows, failures = [], []
    try:
        wait_ready(port, proc)
        chat_once(port, 0, a.max_tokens)  # warm-up
        i = 1
        for r in range(a.rounds):
            ttfts, tpots, bad, i = phase(port, a.phase, a.max_tokens, i)
            alone = summary("alone", ttfts, tpots)
            failures += bad
            stop, counts, errors = threading.Event(), [], []
            workers = [threading.Thread(target=flood_worker, args=(port, stop, a.batch, counts, errors, r * 10 + w))
                       for w in range(a.flood)]
            for w in workers:
                w.start()
            time.sleep(2)  # the flood fills the queue first
            t0 = time.time()
            done0 = sum(counts)
            ttfts, tpots, bad, i = phase(port, a.phase, a.max_tokens, i)
            inputs_s = (sum(counts) - done0) / (time.time() - t0)
            stop.set()
            for w in workers:
                w.join()
            flood = summary("beside flood", ttfts, tpots)
            flood["embedding_inputs_per_s"] = inputs_s
            failures += bad + errors
            for row in (alone, flood):
                row["round"] = r + 1
                rows.append(row)
                print(f"round {r + 1} {row['phase']:>13}: {row['requests']:3d} chats, TTFT p50 {row['ttft_p50_ms']:7.1f} ms"
                      f" p95 {row['ttft_p95_ms']:7.1f} ms, TPOT p50 {row['tpot_p50_ms']:6.1f} ms"
                      + (f", embeddings {row['embedding_inputs_per_s']:.1f} inputs/s" if 'embedding_inputs_per_s' in row else ""),
                      flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    p95s = [row["ttft_p95_ms"] for row in rows if row["phase"] == "beside flood"]
    ok = not failures and all(p <= a.ttft_target_ms for p in p95s)
    print(f"TTFT p95 beside the flood, median of rounds: {statistics.median(p95s):.1f} ms"
          f" (target {a.ttft_target_ms:.0f} ms); non-200 answers: {len(failures)}; {'PASS' if ok else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "failures": [str(x) for x in failures], "pass": ok,
                       "load_average": os.getloadavg(), "args": vars(a)}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
