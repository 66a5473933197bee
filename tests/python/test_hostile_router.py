#!/usr/bin/env python3
"""`sloserve route` under hostile clients (issue #30): the real router binary in
front of two real `sloserve serve` replicas, API keys on, loopback only, each
attack bounded in time. Keyless requests get 401 before a body is read; the batch-id
owner map learns only from a 2xx; oversize bodies looping on two connections leave
normal requests at 100% and no replica ejected; slowloris and idle sockets are
closed within the header-read / keep-alive timeouts while /health answers; a
SIGSTOPped replica's stream ends and new requests fail over within the upstream
timeout. Every process started here is stopped (SIGCONT first) even on failure.

usage: tests/python/test_hostile_router.py [--bin BINARY] [--only NAME]
Ends with a line 'python hostile router: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, io, json, os, signal, socket, subprocess, sys, tempfile, threading, time, traceback
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, check, free_port, wait_ready  # noqa: E402

MODEL = "smol"
KEY = "sk-hostile-router-a"
UPSTREAM_TIMEOUT = 3.0
PROCS = []


def start(cmd, name):
    log = tempfile.NamedTemporaryFile(prefix=f"sloserve-{name}-", suffix=".log", delete=False)
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    p.log_name = log.name
    PROCS.append(p)
    return p


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(timeout=10)
            except Exception:
                pass


def http(base, method, path, body=None, key=None, timeout=30, headers=None):
    h = {"content-type": "application/json", **(headers or {})}
    if key:
        h["authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def metric(base, name, backend):
    _, text, _ = http(base, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(f"sloserve_router:{name}{{") and f'backend="{backend}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {backend}")


def chat(i, max_tokens=2):
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Say a number: {i}"}],
            "max_tokens": max_tokens, "temperature": 0}


def test_keys_are_checked_before_the_body(env):
    r = env["router"]
    s, body, _ = http(r, "GET", "/v1/models")
    check(s == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", (s, body))
    s, _, _ = http(r, "GET", "/v1/models", key="sk-wrong")
    check(s == 401, s)
    s, _, _ = http(r, "GET", "/health")
    check(s == 200, s)
    # A keyless request announcing a 10 MiB body it never sends: 401 at once.
    with socket.create_connection(("127.0.0.1", env["router_port"]), timeout=5) as c:
        t0 = time.time()
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 10485760\r\n\r\n")
        head = c.recv(4096)
        check(head.startswith(b"HTTP/1.1 401") and time.time() - t0 < 2, head[:80])
    client = openai.OpenAI(base_url=r + "/v1", api_key=KEY, max_retries=0, timeout=60)
    out = client.chat.completions.create(**chat(1))
    check(out.choices[0].message.content is not None, out)
    try:
        openai.OpenAI(base_url=r + "/v1", api_key="nope", max_retries=0).chat.completions.create(**chat(1))
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def test_owner_map_learns_only_from_2xx(env):
    # A file only the second replica knows (uploaded to it directly).
    direct = openai.OpenAI(base_url=env["replicas"][1] + "/v1", api_key=KEY, max_retries=0)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": chat(1)}
    f = direct.files.create(file=("in.jsonl", io.BytesIO((json.dumps(line) + "\n").encode())), purpose="batch")
    # Through the keyless router (keys checked by the replicas only): the first
    # replica answers 401 to a keyless request; that must not pin the file to it.
    open_router = env["open_router"]
    s, _, _ = http(open_router, "GET", f"/v1/files/{f.id}")
    check(s == 401, s)
    s, body, h = http(open_router, "GET", f"/v1/files/{f.id}", key=KEY)
    check(s == 200 and json.loads(body)["id"] == f.id, (s, body))
    check(h.get("x-sloserve-backend") == env["replicas"][1], h)
    # A list the replicas refuse (no key) is their 401, not a 503.
    s, body, _ = http(open_router, "GET", "/v1/files")
    check(s == 401, (s, body))


def oversize_loop(port, stop, counts):
    chunk = b"x" * (1 << 20)
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 52428800\r\n\r\n{\"prompt\":\"")
                try:
                    for _ in range(8):
                        c.sendall(chunk)
                except OSError:
                    pass
                head = c.recv(64)
                counts[head[:12].decode(errors="replace")] = counts.get(head[:12].decode(errors="replace"), 0) + 1
        except OSError as e:
            counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1


def test_oversize_bodies_eject_nobody(env):
    r = env["router"]
    # Over the limit without a Content-Length (chunked): 413 once 4 MiB are in (or,
    # when the router's close overtakes the answer, a reset), never a replica asked.
    with socket.create_connection(("127.0.0.1", env["router_port"]), timeout=10) as c:
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"authorization: Bearer " + KEY.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            for _ in range(5):
                c.sendall(b"100000\r\n" + b"x" * (1 << 20) + b"\r\n")
            head = c.recv(64)
            check(head.startswith(b"HTTP/1.1 413"), head)
        except (ConnectionResetError, BrokenPipeError):
            pass
    # (The replicas were ejected once at the start, before they listened.)
    ejected = [metric(r, "backend_ejections_total", b) for b in env["replicas"]]
    stop, counts = threading.Event(), {}
    hostile = [threading.Thread(target=oversize_loop, args=(env["router_port"], stop, counts)) for _ in range(2)]
    for t in hostile:
        t.start()
    ok = bad = 0
    errors = []
    t0 = time.time()
    try:
        # At least 8 normal requests and 6 s of the attack (40 s at most: a busy machine).
        while (time.time() - t0 < 6 or ok + bad < 8) and time.time() - t0 < 40:
            s, body, _ = http(r, "POST", "/v1/chat/completions", chat(ok + bad), key=KEY)
            if s == 200:
                ok += 1
            else:
                bad += 1
                errors.append((s, body[:200]))
    finally:
        stop.set()
        for t in hostile:
            t.join(timeout=10)
    print(f"     oversize loop: {ok} of {ok + bad} normal requests succeeded; hostile answers {counts}")
    check(bad == 0 and ok >= 8, (ok, bad, errors[:3]))
    check(sum(v for k, v in counts.items() if k.startswith("HTTP/1.1 413")) > 0, counts)
    for b, before in zip(env["replicas"], ejected):
        check(metric(r, "backend_ejections_total", b) == before, f"{b} was ejected")
        check(metric(r, "backend_healthy", b) == 1, f"{b} is not healthy")


def test_slowloris_and_idle_sockets_are_closed(env):
    port = env["router_port"]
    socks = []
    for i in range(40):
        c = socket.create_connection(("127.0.0.1", port), timeout=8)
        if i % 2:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # never finished
        socks.append(c)
    # Past --max-connections (32), probes still answer.
    s, _, _ = http(env["router"], "GET", "/health", timeout=5)
    check(s == 200, s)
    t0 = time.time()
    closed = 0
    for c in socks:
        try:
            data = c.recv(4096)
            while data:  # a 408 or 503 answer, then the close
                data = c.recv(4096)
            closed += 1
        except OSError:
            closed += 1
        finally:
            c.close()
    took = time.time() - t0
    print(f"     40 idle / slowloris sockets closed in {took:.1f} s")
    check(closed == 40 and took < 5, (closed, took))


def test_sigstopped_replica_fails_over_within_the_timeout(env):
    r, reps, procs = env["fast_router"], env["replicas"], env["replica_procs"]
    body = json.dumps({**chat("stream"), "max_tokens": 400, "stream": True}).encode()
    req = urllib.request.Request(r + "/v1/chat/completions", data=body, method="POST",
                                 headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=30)
    victim = resp.headers["x-sloserve-backend"]
    proc = procs[reps.index(victim)]
    resp.readline()
    proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        rest = resp.read().decode(errors="replace")
        took = time.time() - t0
        print(f"     stream on the stopped replica ended after {took:.1f} s")
        check(took < UPSTREAM_TIMEOUT + 2, took)
        check("upstream_timeout" in rest or "[DONE]" in rest, rest[-300:])
        # New requests while it stays stopped: each answered 200 by the other replica.
        results = []

        def one(i):
            t = time.time()
            s, b, h = http(r, "POST", "/v1/chat/completions", chat(100 + i), key=KEY, timeout=30)
            results.append((s, time.time() - t, h.get("x-sloserve-backend")))
        ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=40)
        print(f"     while stopped: {[(s, round(d, 1)) for s, d, _ in results]}")
        check(len(results) == 6 and all(s == 200 for s, _, _ in results), results)
        check(all(d < 2 * UPSTREAM_TIMEOUT + 3 for _, d, _ in results), results)
        check(all(b != victim for _, _, b in results), results)
    finally:
        proc.send_signal(signal.SIGCONT)
    # Re-admitted by the health checks once it answers again.
    t0 = time.time()
    while time.time() - t0 < 10 and metric(r, "backend_healthy", victim) != 1:
        time.sleep(0.2)
    check(metric(r, "backend_healthy", victim) == 1, "not re-admitted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "sloserve"))
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--only")
    args = ap.parse_args()
    passed = failed = 0
    try:
        ports = [free_port(), free_port()]
        replicas = [f"http://127.0.0.1:{p}" for p in ports]
        procs = [start([args.bin, "serve", "--model", args.model, "--port", str(p), "--api-key", KEY,
                        "--served-model-name", MODEL, "--max-model-len", "512", "--kv-cache-memory", "32MiB",
                        "--data-dir", tempfile.mkdtemp(prefix="sloserve-hostile-")], f"replica{i}")
                 for i, p in enumerate(ports)]
        fleet = ",".join(replicas)
        rport, oport = free_port(), free_port()
        common = ["--fleet", f"interactive={fleet}", "--fleet", f"batch={fleet}", "--health-interval-ms", "1000"]
        router = start([args.bin, "route", "--port", str(rport), *common, "--api-key", KEY,
                        "--header-read-timeout", "1", "--keep-alive-timeout", "1", "--body-read-timeout", "2",
                        "--max-connections", "32"], "router")
        # A short upstream timeout only where a stopped replica is the point (on a
        # busy machine a normal answer can take seconds).
        fport = free_port()
        fast_router = start([args.bin, "route", "--port", str(fport), *common, "--api-key", KEY,
                             "--upstream-timeout", str(UPSTREAM_TIMEOUT)], "fast-router")
        open_router = start([args.bin, "route", "--port", str(oport), *common, "--policy", "round-robin"],
                            "open-router")
        for base, p in zip(replicas, procs):
            wait_ready(base, p)
        wait_ready(f"http://127.0.0.1:{rport}", router)
        wait_ready(f"http://127.0.0.1:{oport}", open_router)
        wait_ready(f"http://127.0.0.1:{fport}", fast_router)
        env = {"router": f"http://127.0.0.1:{rport}", "router_port": rport,
               "fast_router": f"http://127.0.0.1:{fport}", "open_router": f"http://127.0.0.1:{oport}",
               "replicas": replicas, "replica_procs": procs}
        tests = [test_keys_are_checked_before_the_body, test_owner_map_learns_only_from_2xx,
                 test_oversize_bodies_eject_nobody, test_slowloris_and_idle_sockets_are_closed,
                 test_sigstopped_replica_fails_over_within_the_timeout]
        for t in tests:
            if args.only and args.only != t.__name__:
                continue
            t0 = time.time()
            try:
                t(env)
                passed += 1
                print(f"ok   {t.__name__} ({time.time() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", flush=True)
                traceback.print_exc()
        for p in PROCS:
            if p.poll() is not None:
                failed += 1
                print(f"FAIL {p.args[1]} exited early ({p.returncode}):\n{open(p.log_name).read()[-2000:]}")
    except Exception:
        failed += 1
        traceback.print_exc()
    finally:
        stop_all()
    print(f"python hostile router: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
