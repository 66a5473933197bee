#!/usr/bin/env python3
"""Overload soak against a running sloserve (loopback only; stdlib only).

Calibrates the capacity (closed loop), then offers --overload times that rate
(open loop, Poisson) for --duration seconds with a mix of interactive streams,
batch requests, streams dropped mid-way and stalled readers, and checks:
the process stays up, RSS at the end within 10% of RSS after warm-up, no 5xx
but load shedding (503 + Retry-After: requests shed from the queue, counted and
reported apart), 429s (refused at submit) answered in < 50 ms p99, every
admitted interactive request that was served meets its TTFT target, and every
KV block is free afterwards (/metrics). Prints the figures and PASS/FAIL lines; exit 1 on a FAIL.
"""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlparse

PROMPT_WORDS = "the quick brown fox jumps over the lazy dog while a small model serves".split()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def prompt(rng, n):
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(n))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = Counter()
        self.kinds = Counter()
        self.refusal_ms = []  # 429 time to the response head (refused at submit)
        self.shed_ms = []  # 503 + Retry-After time to the head (shed from the queue)
        self.ttft = []  # (server ttft ms, target ms) of admitted interactive streams
        self.client_ttft_ms = []
        self.unexpected = []
        self.done = 0
        self.answered = Counter()  # request id -> outcomes recorded (exactly once: 1)
        self.reasons = Counter()  # (status, x-sloserve-shed-reason) of refusals

    def answer(self, rid):
        with self.lock:
            self.answered[rid] += 1

    def add(self, kind, status, **kw):
        with self.lock:
            self.kinds[kind] += 1
            self.status[status] += 1
            self.done += 1
            if "refusal_ms" in kw:
                self.refusal_ms.append(kw["refusal_ms"])
            if "shed_ms" in kw:
                self.shed_ms.append(kw["shed_ms"])
            if "ttft" in kw:
                self.ttft.append(kw["ttft"])
            if "client_ttft_ms" in kw:
                self.client_ttft_ms.append(kw["client_ttft_ms"])
            if "unexpected" in kw:
                self.unexpected.append(kw["unexpected"])


def pct(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


class Client:
    """One key's traffic. `chat`: /v1/chat/completions with messages (else
    /v1/completions with a prompt). Every request carries its own x-request-id,
    kept in `sent`; the answer must echo it, and `Stats.answered` counts each id's
    outcomes (exactly once: 1)."""

    def __init__(self, url, key, ttft_ms, max_tokens, chat=False, tag="soak", batch_deadline_ms=None):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port
        assert self.host in ("127.0.0.1", "localhost", "::1"), "loopback only"
        self.key, self.ttft_ms, self.max_tokens = key, ttft_ms, max_tokens
        self.chat, self.tag = chat, tag
        # A batch request's own deadline (x-request-timeout-ms), below the client's
        # 120 s timeout: the server refuses it (429) or ends it (408) rather than
        # leaving the client to give up on it.
        self.batch_deadline_ms = batch_deadline_ms
        self.sent = []  # request ids, in order
        self.served = []  # each served stream's server figures (usage.sloserve)
        self.seq = 0
        self.lock = threading.Lock()

    def headers(self, rid=None):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        if rid:
            h["x-request-id"] = rid
        return h

    def new_id(self):
        with self.lock:
            self.seq += 1
            rid = f"{self.tag}-{os.getpid()}-{self.seq}"
            self.sent.append(rid)
        return rid

    def metrics(self):
        c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        c.request("GET", "/metrics", headers=self.headers())
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, v = line.rsplit(" ", 1)
            base = name.split("{")[0]
            out[base] = out.get(base, 0.0) + float(v)
        return out

    def one(self, stats, rng, kind):
        """One request of `kind`: interactive | batch | dropped | stalled."""
        if kind == "stalled":
            return self.stalled(stats, rng)
        interactive = kind in ("interactive", "dropped")
        text = prompt(rng, rng.randint(8, 64))
        body = {
            "max_tokens": rng.randint(8, self.max_tokens),
            "slo_class": "interactive" if interactive else "batch",
            "stream": interactive,
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if interactive:
            body["ttft_slo_ms"] = self.ttft_ms
            body["stream_options"] = {"include_usage": True}
        rid = self.new_id()
        path = "/v1/chat/completions" if self.chat else "/v1/completions"
        t0 = time.monotonic()
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            h = self.headers(rid)
            if not interactive and self.batch_deadline_ms:
                h["x-request-timeout-ms"] = str(self.batch_deadline_ms)
            c.request("POST", path, json.dumps(body), h)
            r = c.getresponse()
            head_ms = (time.monotonic() - t0) * 1e3
            stats.answer(rid)
            if r.getheader("x-request-id") != rid:
                stats.add(kind, r.status, unexpected=f"answer echoes {r.getheader('x-request-id')!r}")
                return
            if r.status != 200:
                r.read()
                with stats.lock:
                    stats.reasons[f"{r.status} {r.getheader('x-sloserve-shed-reason')}"] += 1
                shed = (r.status == 503 and r.getheader("Retry-After") is not None
                        and r.getheader("x-sloserve-shed-reason") is not None)
                kw = {}
                if r.status == 429:
                    kw["refusal_ms"] = head_ms
                elif shed:
                    kw["shed_ms"] = head_ms
                if r.status >= 500 and not shed:
                    kw["unexpected"] = r.status
                stats.add(kind, r.status, **kw)
                return
            if not interactive:
                if not json.loads(r.read()).get("choices"):
                    stats.add(kind, 200, unexpected="200 without choices")
                    return
                stats.add(kind, 200)
                return
            first = None
            usage = None
            events = 0
            done = False
            for line in r:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    stats.add(kind, 200, unexpected=f"stream error: {ev['error'].get('code')}")
                    return
                events += 1
                ch = ev.get("choices") or [{}]
                if first is None and (ch[0].get("text") or (ch[0].get("delta") or {}).get("content")):
                    first = (time.monotonic() - t0) * 1e3
                if ev.get("usage"):
                    usage = ev["usage"]
                if kind == "dropped" and events >= 3:
                    c.close()  # drop the stream mid-way
                    stats.add(kind, 200)
                    return
            if not done:
                stats.add(kind, 200, unexpected="stream ended without [DONE]")
                return
            kw = {}
            if first is not None:
                kw["client_ttft_ms"] = first
            s = (usage or {}).get("sloserve") or {}
            if s.get("ttft_ms") is not None:
                kw["ttft"] = (s["ttft_ms"], s.get("ttft_target_ms") or self.ttft_ms)
                with self.lock:
                    self.served.append(dict(s, client_ttft_ms=first, at=time.time()))
            stats.add(kind, 200, **kw)
        except (OSError, http.client.HTTPException, ValueError) as e:
            stats.add(kind, "conn-error", unexpected=f"{type(e).__name__}: {e}")
        finally:
            c.close()

    def stalled(self, stats, rng):
        """A stream whose reader never reads (tiny receive buffer), closed later."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10)
        try:
            s.connect((self.host, self.port))
            body = json.dumps({
                "prompt": prompt(rng, 16), "max_tokens": self.max_tokens * 4,
                "ignore_eos": True, "stream": True, "logprobs": 20, "slo_class": "batch",
            })
            head = "".join(f"{k}: {v}\r\n" for k, v in self.headers().items())
            s.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            time.sleep(rng.uniform(15, 30))  # never read (past the write timeout)
            stats.add("stalled", "stalled")
        except OSError as e:
            stats.add("stalled", "conn-error", unexpected=f"stalled: {e}")
        finally:
            s.close()


def calibrate(client, secs, conc):
    stats = Stats()
    stop = time.monotonic() + secs

    def worker(i):
        rng = random.Random(i)
        while time.monotonic() < stop:
            client.one(stats, rng, "batch")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    client.sent.clear()  # calibration's requests are not the soak's
    return stats.status[200] / secs


def offer(client, stats, rate, duration, mix, max_threads, seed=42):
    """Open loop: Poisson arrivals at `rate` for `duration` s, each a thread running
    one request of a kind drawn from `mix`; waits for them. Returns how many
    arrivals were skipped because `max_threads` were still running."""
    rng = random.Random(seed)
    threads = []
    skipped = 0
    t_end = time.monotonic() + duration
    next_t = time.monotonic()
    while True:
        next_t += rng.expovariate(rate)
        if next_t >= t_end:
            break
        time.sleep(max(0.0, next_t - time.monotonic()))
        threads = [t for t in threads if t.is_alive()]
        if len(threads) >= max_threads:
            skipped += 1
            continue
        kind = rng.choice(mix)
        t = threading.Thread(target=client.one, args=(stats, random.Random(rng.random()), kind), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=180)
    return skipped


def unanswered(client, stats):
    """(ids sent but never answered, ids answered more than once)."""
    lost = [r for r in client.sent if stats.answered[r] == 0]
    twice = [r for r in client.sent if stats.answered[r] > 1]
    return lost, twice


def drained(client, secs=60):
    """Afterwards: waits until the engine has drained and freed every block (at most
    `secs`); returns the last /metrics sums."""
    deadline = time.monotonic() + secs
    m = {}
    while time.monotonic() < deadline:
        m = client.metrics()
        if m.get("sloserve:kv_cache_blocks_used", 1) == 0 and m.get("sloserve:num_requests_running", 1) == 0:
            break
        time.sleep(0.5)
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--api-key", default=os.environ.get("SLOSERVE_API_KEY", "").split(",")[0].split(":")[0])
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--calibrate", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--ttft-slo-ms", type=float, default=2000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-threads", type=int, default=512)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    client = Client(a.url, a.api_key, a.ttft_slo_ms, a.max_tokens)

    cap = calibrate(client, a.calibrate, a.concurrency)
    rss0 = rss_kib(a.pid)
    rate = max(0.5, cap * a.overload)
    print(f"capacity {cap:.2f} req/s; offering {rate:.2f} req/s for {a.duration:.0f} s; RSS after warm-up {rss0} KiB", flush=True)

    stats = Stats()
    mix = ["interactive"] * 50 + ["batch"] * 30 + ["dropped"] * 10 + ["stalled"] * 10
    skipped = offer(client, stats, rate, a.duration, mix, a.max_threads)
    m = drained(client)
    alive = True
    try:
        os.kill(a.pid, 0)
    except OSError:
        alive = False
    rss1 = rss_kib(a.pid) if alive else 0
    met = sum(1 for t, target in stats.ttft if t <= target)
    fig = {
        "capacity_req_s": round(cap, 3),
        "offered_req_s": round(rate, 3),
        "duration_s": a.duration,
        "requests": stats.done,
        "client_threads_exhausted": skipped,
        "by_kind": dict(stats.kinds),
        "by_status": {str(k): v for k, v in stats.status.items()},
        "refusal_p50_ms": round(pct(stats.refusal_ms, 50), 2),
        "refusal_p99_ms": round(pct(stats.refusal_ms, 99), 2),
        "shed": len(stats.shed_ms),
        "shed_head_p50_ms": round(pct(stats.shed_ms, 50), 1),
        "interactive_admitted": len(stats.ttft),
        "interactive_ttft_met": met,
        "server_ttft_p99_ms": round(pct([t for t, _ in stats.ttft], 99), 1),
        "client_ttft_p99_ms": round(pct(stats.client_ttft_ms, 99), 1),
        "unexpected": Counter(str(u) for u in stats.unexpected).most_common(10),
        "unanswered": len(unanswered(client, stats)[0]),
        "rss_warm_kib": rss0,
        "rss_end_kib": rss1,
        "kv_blocks_used_after": m.get("sloserve:kv_cache_blocks_used"),
        "running_after": m.get("sloserve:num_requests_running"),
        "engine_restarts": m.get("sloserve:engine_restarts_total"),
    }
    print(json.dumps(fig, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=2)
    checks = [
        ("process stays up", alive),
        ("RSS at the end within 10% of RSS after warm-up", alive and rss1 <= rss0 * 1.10),
        ("no 5xx but load shedding, no connection errors", not stats.unexpected),
        ("every request answered exactly once (its own x-request-id)", unanswered(client, stats) == ([], [])),
        ("429s answered in < 50 ms p99", pct(stats.refusal_ms, 99) < 50),
        ("every admitted interactive request met its TTFT target", met == len(stats.ttft)),
        ("every KV block free afterwards", m.get("sloserve:kv_cache_blocks_used") == 0),
    ]
    ok = True
    for name, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
        ok &= bool(passed)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
