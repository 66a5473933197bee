#!/usr/bin/env python3
"""Batch work is queued, not refused, for latency (issue #33 item 1), through a real
`sloserve serve` on loopback: with a tiny `--max-queue-wait` and two sequence slots, a
burst of batch-class requests far past that wait all succeed; a batch request whose
own deadline (`x-request-timeout-ms`) the queue cannot meet gets the deadline 429 at
once; past `--batch-max-waiting-requests` the queue-full 429. Bounded: at most 40
requests of 16 tokens, each with a 120 s client timeout.

usage: tests/python/test_batch_queueing.py [--bin BINARY]
Ends with 'python: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, json, os, socket, subprocess, sys, tempfile, time, traceback
import urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
WORDS = "time river stone light market garden window paper music winter city".split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def complete(port, seed, cls, headers=(), max_tokens=16, timeout=120):
    """One non-streaming completion: (status, parsed JSON body)."""
    prompt = " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(80))
    body = {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": f"{seed} {prompt}", "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "slo_class": cls}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **dict(headers)})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def start(binary, extra):
    port = free_port()
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([binary, "serve", "--model", MODEL, "--port", str(port),
                          "--profile", "mixed", "--max-num-seqs", "2", *extra],
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return p, port, log
        except Exception:
            check(p.poll() is None, "server exited at start")
            time.sleep(0.3)
    p.kill()
    raise AssertionError("server did not become healthy in 120 s")


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=40)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_a_batch_burst_far_past_the_queue_wait_is_queued(binary):
    # 0.2 s: an interactive request predicted to wait longer is refused; batch queues.
    p, port, _ = start(binary, ["--max-queue-wait", "0.2"])
    try:
        status, _ = complete(port, 0, "interactive")  # measures the prefill rate
        check(status == 200, f"warm-up: {status}")
        t0 = time.time()
        with ThreadPoolExecutor(24) as ex:
            burst = [ex.submit(complete, port, 1 + i, "batch") for i in range(24)]
            time.sleep(1.0)  # the queue is backed up: 22 wait behind 2 slots
            own = complete(port, 99, "batch", headers=[("x-request-timeout-ms", "50")])
            results = [f.result() for f in burst]
        wall = time.time() - t0
        codes = sorted(s for s, _ in results)
        check(codes == [200] * 24, f"batch refused for latency: {codes}")
        check(all(b["usage"]["completion_tokens"] == 16 for _, b in results), "short answers")
        check(wall > 0.4, f"the burst took {wall:.2f} s: no queue formed")
        status, body = own
        msg = body.get("error", {}).get("message", "")
        check(status == 429 and "own deadline" in msg, f"own deadline: {status} {msg}")
        print(f"  24 batch requests queued and served in {wall:.1f} s; deadline 429: {msg[:90]}")
    finally:
        stop(p)


def test_past_the_batch_queue_bound_is_a_queue_full_429(binary):
    p, port, _ = start(binary, ["--batch-max-waiting-requests", "4"])
    try:
        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(lambda i: complete(port, 200 + i, "batch", max_tokens=8), range(16)))
        codes = [s for s, _ in results]
        full = [b["error"]["message"] for s, b in results if s == 429]
        check(codes.count(200) >= 4, f"served: {codes}")  # the 4 admitted before any started
        check(full and all("waiting queue full" in m for m in full), f"429s: {codes} {full[:2]}")
        check(set(codes) <= {200, 429}, f"codes: {codes}")
        print(f"  bound 4: {codes.count(200)} served, {len(full)} queue-full 429")
    finally:
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "sloserve"))
    args = ap.parse_args()
    tests = [test_a_batch_burst_far_past_the_queue_wait_is_queued,
             test_past_the_batch_queue_bound_is_a_queue_full_429]
    passed = failed = 0
    for t in tests:
        print(t.__name__)
        try:
            t(args.bin)
            passed += 1
        except Exception:
            traceback.print_exc()
            failed += 1
    print(f"python: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
