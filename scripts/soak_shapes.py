#!/usr/bin/env python3
"""Key B of the hostile soak (issue 55): loops every hostile shape of the audit
against a running sloserve for --duration seconds, each in its own closed loop
(stdlib only, loopback only), and writes what each shape got (status counts, time to
the answer, anything unexpected) as JSON.

Each shape has the answers it may get; anything else, any 5xx but load shedding
(503 with Retry-After and x-sloserve-shed-reason) and any connection error is
"unexpected". Shapes (loops):
  pp1000 (2)      a unique 1,000-patternProperties schema, turn by turn as
                  response_format, a tool's parameters, /v1/responses text.format: 400
  pp32 (1)        a unique 32-patternProperties schema (compiles): 200, or 429 (grammar-busy, load)
  stops_250k (2)  16 stop strings of 250,000 bytes (a 4 MB body): 400 naming stop
  stops_64k (2)   16 stop strings of 4,096 bytes (the bound), a stream: 200 to [DONE]
  a100000 (1)     "pattern": "^a{100000}$", stream and not by turns: 400 constraint_failed
                  (or that error as an SSE event once the stream began)
  n16 (1)         n=16 chat: 200, or 429 before any choice runs
  responses_50k (1)  50,000 empty function_call_output items: 400 context_length_exceeded
  fairness (1)    forged x-llm-d-inference-fairness-id (fresh, or a fixed victim's): 200
  batch_quota (1) a Batch API job whose output passes the key's quota: failed, quota_exceeded
  dropped (1), stalled (1)  streams dropped after 3 events, readers that never read

usage: soak_shapes.py --url URL --key KEY --duration S --json OUT
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from urllib.parse import urlparse

sys.path.insert(0, __import__("os").path.dirname(__file__))
from soak import Client, Stats, pct  # noqa: E402

FAIRNESS = "x-llm-d-inference-fairness-id"
STOP_250K = json.dumps([chr(ord("A") + i) * 250_000 for i in range(16)])
RESPONSES_50K = json.dumps({
    "input": [{"type": "function_call_output", "call_id": "c", "output": ""}] * 50_000,
    "max_output_tokens": 4,
}).encode()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = defaultdict(Counter)
        self.ms = defaultdict(list)
        self.unexpected = defaultdict(Counter)
        self.shed = Counter()

    def add(self, shape, status, ms, bad=None):
        with self.lock:
            self.status[shape][str(status)] += 1
            self.ms[shape].append(ms)
            if bad:
                self.unexpected[shape][bad[:200]] += 1


class Shed(Exception):
    """A 503 with Retry-After and x-sloserve-shed-reason: load shedding (allowed)."""


class Fault(Exception):
    """Any other 5xx: never allowed."""


class Hostile:
    def __init__(self, url, key, max_tokens):
        u = urlparse(url)
        self.host, self.port, self.key = u.hostname, u.port, key
        assert self.host in ("127.0.0.1", "localhost", "::1"), "loopback only"
        self.max_tokens = max_tokens

    def call(self, method, path, body=b"", extra=None, ctype="application/json", timeout=180):
        """(status, headers, JSON or text, SSE events or None) of one request."""
        h = {"Authorization": f"Bearer {self.key}", **(extra or {})}
        if ctype:
            h["Content-Type"] = ctype
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body, h)
            r = c.getresponse()
            hdr = {k.lower(): v for k, v in r.getheaders()}
            if r.status >= 500:
                text = r.read()[:200]
                if r.status == 503 and "retry-after" in hdr and "x-sloserve-shed-reason" in hdr:
                    raise Shed(hdr["x-sloserve-shed-reason"])
                raise Fault(f"{r.status} {text!r}")
            if r.status == 200 and "text/event-stream" in hdr.get("content-type", ""):
                events, done = [], False
                for line in r:
                    if line.startswith(b"data: "):
                        data = line[6:].strip()
                        if data == b"[DONE]":
                            done = True
                            break
                        events.append(json.loads(data))
                return r.status, hdr, done, events
            text = r.read()
            try:
                return r.status, hdr, json.loads(text), None
            except ValueError:
                return r.status, hdr, text[:200], None
        finally:
            c.close()

    def chat(self, body, extra=None):
        return self.call("POST", "/v1/chat/completions", json.dumps(body).encode(), extra)


def err_code(body):
    return (body.get("error") or {}).get("code") if isinstance(body, dict) else None


def sse_error(events):
    return next((e["error"] for e in events if "error" in e), None)


def msgs(text="Say something."):
    return [{"role": "user", "content": text}]


def pattern_schema(n):
    tag = uuid.uuid4().hex[:12]
    return {"type": "object", "patternProperties": {f"^{tag}_{i}_": {"type": "integer"} for i in range(n)}}


def pp_request(h, n, turn):
    """A unique n-patternProperties schema through one of three routes."""
    schema = pattern_schema(n)
    if turn % 3 == 0:
        return h.chat({"messages": msgs(), "max_tokens": 16, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": False}}})
    if turn % 3 == 1:
        return h.chat({"messages": msgs(), "max_tokens": 16, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": schema}}]})
    body = {"input": "Say something.", "max_output_tokens": 16,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": False}}}
    return h.call("POST", "/v1/responses", json.dumps(body).encode())


def shape_pp1000(h, rng, turn):
    st, _, body, _ = pp_request(h, 1000, turn)
    return st, None if st == 400 else f"{st} {err_code(body)}"


def shape_pp32(h, rng, turn):
    st, hdr, body, _ = pp_request(h, 32, turn)
    ok = st == 200 or (st == 429 and "retry-after" in hdr)  # grammar-busy or the queue
    return st, None if ok else f"{st} {err_code(body)} {str(body)[:120]}"


def shape_stops_250k(h, rng, turn):
    body = ('{"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 32, '
            '"stream": true, "stop": ' + STOP_250K + "}").encode()
    st, _, b, _ = h.call("POST", "/v1/chat/completions", body)
    return st, None if st == 400 and "stop" in json.dumps(b) else f"{st} {str(b)[:120]}"


def shape_stops_64k(h, rng, turn):
    stops = [uuid.uuid4().hex[:8] + chr(ord("a") + i) * 4088 for i in range(16)]
    st, _, done, events = h.chat({"messages": msgs("Write a story."), "max_tokens": h.max_tokens,
                                  "ignore_eos": True, "stream": True, "stop": stops})
    if st == 200:
        return st, None if done and not sse_error(events) else f"stream: done={done} {sse_error(events)}"
    return st, None if st == 429 else f"{st} {err_code(done)}"


def shape_a100000(h, rng, turn):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{100000}$"}},
              "required": ["s"]}
    stream = turn % 2 == 1
    st, _, body, events = h.chat({"messages": msgs(), "max_tokens": 32, "stream": stream,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "a", "schema": schema, "strict": True}}})
    if st == 400:
        return st, None if err_code(body) == "constraint_failed" else f"400 {err_code(body)}"
    if st == 200 and stream:
        e = sse_error(events) or {}
        text = "".join((ev.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for ev in events)
        # No token drawn without the mask may reach the client: whatever came is a prefix of {"s": "aaa...
        ok = e.get("code") == "constraint_failed" and all(c in '{"s: a' for c in text)
        return "sse-400", None if ok else f"stream: {e} text {text[:60]!r}"
    if st == 200:
        return st, f"200 {str(body)[:120]}"
    return st, None if st == 429 else f"{st} {err_code(body)}"


def shape_n16(h, rng, turn):
    st, hdr, body, _ = h.chat({"messages": msgs(), "n": 16, "max_tokens": 16})
    if st == 200:
        return st, None if len(body.get("choices", [])) == 16 else f"{len(body.get('choices', []))} choices"
    return st, None if st == 429 else f"{st} {err_code(body)}"


def shape_responses_50k(h, rng, turn):
    st, _, body, _ = h.call("POST", "/v1/responses", RESPONSES_50K)
    return st, None if st == 400 and err_code(body) == "context_length_exceeded" else f"{st} {err_code(body)}"


def shape_fairness(h, rng, turn):
    fid = "victim" if turn % 2 else uuid.uuid4().hex
    st, _, done, events = h.chat({"messages": msgs(), "max_tokens": 16, "stream": True,
                                  "slo_class": "interactive"}, {FAIRNESS: fid})
    if st == 200:
        return st, None if done and not sse_error(events) else f"stream: done={done} {sse_error(events)}"
    return st, None if st == 429 else f"{st} {err_code(done)}"


def multipart(lines):
    b = uuid.uuid4().hex
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    body = (f"--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
    return body, f"multipart/form-data; boundary={b}"


def shape_batch_quota(h, rng, turn, quota):
    """A small input whose output (every token's top 20 logprobs) passes the quota."""
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": msgs("Write a long story."), "max_tokens": 64, "ignore_eos": True,
                       "logprobs": True, "top_logprobs": 20}} for i in range(8)]
    body, ctype = multipart(lines)
    st, _, f, _ = h.call("POST", "/v1/files", body, ctype=ctype)
    if st != 200:
        return st, None if st == 413 else f"upload {st} {err_code(f)}"
    st, _, b, _ = h.call("POST", "/v1/batches", json.dumps({
        "input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).encode())
    if st != 200:
        return st, f"create {st} {err_code(b)}"
    deadline = time.monotonic() + 240
    while b.get("status") not in ("completed", "failed", "expired", "cancelled"):
        if time.monotonic() > deadline:
            return "timeout", f"batch still {b.get('status')}"
        time.sleep(1)
        _, _, b, _ = h.call("GET", f"/v1/batches/{b['id']}", ctype=None)
    codes = [e.get("code") for e in ((b.get("errors") or {}).get("data") or [])]
    _, _, files, _ = h.call("GET", "/v1/files", ctype=None)
    held = sum(x.get("bytes", 0) for x in files.get("data", []))
    for fid in {f["id"], b.get("output_file_id"), b.get("error_file_id")} - {None}:
        h.call("DELETE", f"/v1/files/{fid}", ctype=None)
    bad = None
    if b["status"] != "failed" or "quota_exceeded" not in codes:
        bad = f"batch {b['status']} {codes} {b.get('request_counts')}"
    elif held > quota:
        bad = f"key holds {held} bytes, quota {quota}"
    return f"batch-{b['status']}", bad


def loop(name, fn, end, tally, pace, seed):
    rng = random.Random(seed)
    turn = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            st, bad = fn(rng, turn)
        except Shed as e:
            st, bad = f"503-{e}", None
        except Fault as e:
            st, bad = str(e)[:3], str(e)
        except (OSError, http.client.HTTPException, ValueError) as e:
            st, bad = "conn-error", f"{type(e).__name__}: {e}"
        ms = (time.monotonic() - t0) * 1e3
        tally.add(name, st, ms, bad)
        turn += 1
        time.sleep(max(0.0, pace - (time.monotonic() - t0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--quota", type=int, required=True, help="the server's --batch-quota-bytes-per-key")
    ap.add_argument("--pace", type=float, default=0.05, help="least seconds between a loop's requests")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    h = Hostile(a.url, a.key, a.max_tokens)
    end = time.monotonic() + a.duration
    tally = Tally()
    shapes = [("pp1000", shape_pp1000, 2), ("pp32", shape_pp32, 1), ("stops_250k", shape_stops_250k, 2),
              ("stops_64k", shape_stops_64k, 2), ("a100000", shape_a100000, 1), ("n16", shape_n16, 1),
              ("responses_50k", shape_responses_50k, 1), ("fairness", shape_fairness, 1),
              ("batch_quota", lambda h, r, t: shape_batch_quota(h, r, t, a.quota), 1)]
    threads = []
    for name, fn, n in shapes:
        for i in range(n):
            threads.append(threading.Thread(target=loop, args=(
                name, lambda rng, turn, fn=fn: fn(h, rng, turn), end, tally, a.pace, i)))
    # Dropped streams and stalled readers: the plain soak's own kinds, as key B.
    b = Client(a.url, a.key, 2000, a.max_tokens, chat=True, tag="keyb")
    bstats = Stats()
    for kind in ("dropped", "stalled"):
        threads.append(threading.Thread(target=loop, args=(
            kind, lambda rng, turn, kind=kind: (b.one(bstats, rng, kind), ("sent", None))[1], end, tally, 0.2, 7)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = {"shapes": {}, "client_b": {"by_kind": dict(bstats.kinds), "by_status": {str(k): v for k, v in bstats.status.items()},
                                      "unexpected": Counter(str(u) for u in bstats.unexpected).most_common(10)}}
    for name in tally.status:
        ms = tally.ms[name]
        out["shapes"][name] = {"requests": len(ms), "status": dict(tally.status[name]),
                               "p50_ms": round(pct(ms, 50), 1), "max_ms": round(max(ms), 1),
                               "unexpected": tally.unexpected[name].most_common(5)}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
