"""What fleet_demo.py and fleet_bench.py share: starting `sloserve serve` replicas
and `sloserve route` on loopback ports (and stopping every process started, on
any exit), running `sloserve bench` workloads, reading their results.json.
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

_STARTED = []


def _stop_all():
    for p in reversed(_STARTED):
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 40
    for p in reversed(_STARTED):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    _STARTED.clear()


def _on_signal(signum, _frame):
    _stop_all()
    sys.exit(128 + signum)


atexit.register(_stop_all)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def start(cmd, log_path):
    """Starts `cmd` with output to `log_path`; stopped when this script ends."""
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    _STARTED.append(p)
    return p


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in _STARTED:
        _STARTED.remove(p)


def stop_all():
    _stop_all()


def wait_ready(url, proc, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[:2]} exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} not ready after {timeout} s")


def replica(binary, port, profile, threads, outdir, extra=()):
    """A `sloserve serve` replica on 127.0.0.1:port."""
    cmd = [binary, "serve", "--port", str(port), "--profile", profile, "--threads", str(threads), *extra]
    p = start(cmd, os.path.join(outdir, f"serve-{port}.log"))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, p)
    return p, url


def router(binary, port, fleets, outdir, extra=()):
    """`sloserve route` with fleets {name: [url, ...]}."""
    cmd = [binary, "route", "--port", str(port)]
    for name, urls in fleets.items():
        cmd += ["--fleet", f"{name}={','.join(urls)}"]
    cmd += list(extra)
    p = start(cmd, os.path.join(outdir, f"route-{port}.log"))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, p)
    return p, url


def bench(binary, url, out, args):
    """Starts `sloserve bench` (streaming, quiet) writing OUT/results.json."""
    cmd = [binary, "bench", "--url", url, "--quiet", "--out", out, *args]
    os.makedirs(out, exist_ok=True)
    return start(cmd, os.path.join(out, "bench.log"))


def finish(p, what):
    rc = p.wait()
    if p in _STARTED:
        _STARTED.remove(p)
    if rc != 0:
        raise SystemExit(f"{what}: sloserve bench exited with {rc} (see its bench.log)")


def results(out):
    """The first point of OUT/results.json: (summary, requests)."""
    with open(os.path.join(out, "results.json")) as f:
        r = json.load(f)
    pt = r["points"][0]
    return pt["summary"], pt["requests"], r["started_unix_s"]


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def metric_sum(text, prefix, contains=""):
    """Sum of the samples whose line starts with `prefix` and contains `contains`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(prefix) and contains in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def per_second(requests, t0_offset=0.0):
    """Output tokens per whole second of the run, from every request's chunk times."""
    buckets = {}
    for r in requests:
        if r.get("error"):
            continue
        for c in r["chunk_s"]:
            s = int(t0_offset + r["send_s"] + c)
            buckets[s] = buckets.get(s, 0) + 1
    if not buckets:
        return [], []
    xs = list(range(0, max(buckets) + 1))
    return xs, [buckets.get(x, 0) for x in xs]


def ttft_points(requests, t0_offset=0.0):
    """(send time, TTFT ms) of each successful request."""
    pts = [(t0_offset + r["send_s"], 1000 * r["chunk_s"][0]) for r in requests if not r.get("error") and r["chunk_s"]]
    return [p[0] for p in pts], [p[1] for p in pts]


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("matplotlib missing: no plot (pip install -r scripts/requirements-plots.txt)", file=sys.stderr)
        return None
