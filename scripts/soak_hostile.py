#!/usr/bin/env python3
"""The hostile soak (issue 55) against a running sloserve with two API keys
(loopback only; stdlib only; started by `HOSTILE=1 scripts/soak.sh`).

Calibrates the capacity with key A's normal chats (closed loop), then for
--duration seconds offers --overload times that from key A (open loop, Poisson:
60% interactive streams with a TTFT target, 40% batch chats with a 100 s deadline of
their own, x-request-timeout-ms) while key B loops every
hostile shape of the audit (scripts/soak_shapes.py, its own process). Throughout it
samples the server's RSS, thread count (/proc/PID/task), CPU seconds and the load
average each second, and times GET /health four times a second. Checks: key A's
interactive TTFT P95 (server-measured) within its target; no 5xx to either key but
load shedding (503 + Retry-After + x-sloserve-shed-reason, counted apart); every key
A request answered exactly once with its own x-request-id (nothing lost); every
hostile shape got only the answers it may get; /health p99 under 50 ms; no thread or
RSS growth after warm-up; every KV block free afterwards. Prints a PASS/FAIL table,
writes the figures as JSON; exit 1 on a FAIL.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))
from soak import Client, Stats, calibrate, drained, offer, pct, rss_kib, unanswered  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


PHASES = ["idle", "calibrate", "soak", "drain", "after"]


class Sampler:
    """Per second: (t, phase, RSS KiB, threads, CPU s, load 1 min); GET /health every
    0.25 s. Runs in its own process (forked before any thread starts), so the
    clients' threads do not delay its probes; `phase` is shared."""

    def __init__(self, pid, host, port):
        self.pid, self.host, self.port = pid, host, port
        self.ctx = multiprocessing.get_context("fork")
        self._phase = self.ctx.Value("i", 0)
        self.stop = self.ctx.Event()
        self.out = tempfile.NamedTemporaryFile(prefix="soak-samples-", suffix=".json", delete=False).name
        self.proc = self.ctx.Process(target=self.run, daemon=True)
        self.samples, self.health, self.health_errors, self.thread_names = [], [], Counter(), {}
        self.thread_cpu = {}

    @property
    def phase(self):
        return PHASES[self._phase.value]

    @phase.setter
    def phase(self, name):
        self._phase.value = PHASES.index(name)

    def start(self):
        self.proc.start()

    def finish(self):
        self.stop.set()
        self.proc.join(timeout=30)
        with open(self.out) as f:
            d = json.load(f)
        os.unlink(self.out)
        self.samples = [tuple(x) for x in d["samples"]]
        self.health = [tuple(x) for x in d["health"]]
        self.health_errors = Counter(d["health_errors"])
        self.thread_names = d["thread_names"]
        self.thread_cpu = d["thread_cpu"]

    def run(self):
        t0 = time.monotonic()
        next_s = t0
        names = {}  # phase -> the server's threads by name at their most numerous
        cpu = {}  # phase -> CPU seconds by thread name, at the phase's last sample
        while not self.stop.is_set():
            t = time.monotonic()
            if t >= next_s:
                next_s += 1.0
                try:
                    self.samples.append((round(t - t0, 2), self.phase, rss_kib(self.pid),
                                         threads(self.pid), round(cpu_secs(self.pid), 2), loadavg()))
                    n = thread_names(self.pid)
                    if sum(n.values()) >= sum(names.get(self.phase, {}).values()):
                        names[self.phase] = n
                    cpu[self.phase] = thread_cpu(self.pid)
                except OSError:
                    pass  # the process is gone: the checks see it
            self.probe()
            self.stop.wait(max(0.0, 0.25 - (time.monotonic() - t)))
        with open(self.out, "w") as f:
            json.dump({"samples": self.samples, "health": self.health,
                       "health_errors": self.health_errors, "thread_names": names,
                       "thread_cpu": cpu}, f)

    def probe(self):
        t = time.monotonic()
        c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            ms = (time.monotonic() - t) * 1e3
            if r.status == 200:
                self.health.append((self.phase, round(ms, 3)))
            else:
                self.health_errors[str(r.status)] += 1
        except (OSError, http.client.HTTPException) as e:
            self.health_errors[type(e).__name__] += 1
        finally:
            c.close()

    def window(self, phase, lo=None, hi=None):
        """Samples of `phase` whose time since that phase began is in [lo, hi)."""
        xs = [s for s in self.samples if s[1] == phase]
        if not xs:
            return []
        start = xs[0][0]
        return [s for s in xs if (lo is None or s[0] - start >= lo) and (hi is None or s[0] - start < hi)]


def thread_names(pid):
    """The process's threads counted by name (/proc/PID/task/*/comm)."""
    n = Counter()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                n[f.read().strip()] += 1
        except OSError:
            pass
    return dict(n)


def thread_cpu(pid):
    """CPU seconds of the process's live threads, summed by name."""
    n = Counter()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read().strip()
            n[name] += round(cpu_secs(f"{pid}/task/{t}"), 2)
        except (OSError, ValueError, IndexError):
            pass
    return dict(n)


def median(xs):
    return pct(xs, 50) if xs else 0


def slope_per_min(xs, col):
    """Least-squares slope of column `col` against time, per minute."""
    if len(xs) < 3:
        return 0.0
    ts = [s[0] for s in xs]
    ys = [s[col] for s in xs]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--key-a", required=True)
    ap.add_argument("--key-b", required=True)
    ap.add_argument("--quota", type=int, required=True, help="the server's --batch-quota-bytes-per-key")
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--calibrate", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=60, help="seconds of the soak before growth is judged")
    ap.add_argument("--ttft-slo-ms", type=float, default=2000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-threads", type=int, default=512)
    ap.add_argument("--batch-deadline-ms", type=int, default=100_000,
                    help="key A's batch chats carry this x-request-timeout-ms (0: none), below the "
                         "client's 120 s timeout: at 2x capacity batch work cannot all be served")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    a_client = Client(a.url, a.key_a, a.ttft_slo_ms, a.max_tokens, chat=True, tag="keya",
                      batch_deadline_ms=a.batch_deadline_ms or None)
    sampler = Sampler(a.pid, a_client.host, a_client.port)
    sampler.start()
    time.sleep(5)
    load_before = loadavg()

    sampler.phase = "calibrate"
    cap = calibrate(a_client, a.calibrate, a.concurrency)
    rate = max(0.5, cap * a.overload)
    print(f"capacity {cap:.2f} req/s (key A chats); offering {rate:.2f} req/s for {a.duration:.0f} s "
          f"beside key B's hostile shapes; load {load_before:.2f}", flush=True)

    sampler.phase = "soak"
    cpu0 = cpu_secs(a.pid)
    shapes_json = (a.json or "soak-hostile.json") + ".shapes.json"
    here = os.path.dirname(os.path.abspath(__file__))
    b_proc = subprocess.Popen([sys.executable, os.path.join(here, "soak_shapes.py"), "--url", a.url,
                               "--key", a.key_b, "--duration", str(a.duration), "--quota", str(a.quota),
                               "--max-tokens", str(a.max_tokens), "--json", shapes_json])
    stats = Stats()
    mix = ["interactive"] * 60 + ["batch"] * 40
    # The arrivals end after --duration; the requests still running then drain.
    threading.Timer(a.duration, lambda: setattr(sampler, "phase", "drain")).start()
    skipped = offer(a_client, stats, rate, a.duration, mix, a.max_threads)
    sampler.phase = "drain"
    try:
        b_code = b_proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        b_proc.kill()
        b_code = "killed after 600 s"
    cpu_soak = cpu_secs(a.pid) - cpu0
    m = drained(a_client)
    sampler.phase = "after"
    time.sleep(20)  # idle: the runtime's spare blocking threads end after 10 s
    sampler.finish()
    load_after = loadavg()
    alive = os.path.exists(f"/proc/{a.pid}")
    try:
        with open(shapes_json) as f:
            shapes = json.load(f)
    except (OSError, ValueError):
        shapes = {"shapes": {}, "client_b": {"unexpected": [["no shapes file", 1]]}}

    # Figures.
    ttft = [t for t, _ in stats.ttft]
    p95 = pct(ttft, 95)
    lost, twice = unanswered(a_client, stats)
    soak_s = sampler.window("soak")
    # Growth is judged after warm-up: a minute then against the last minute (shorter
    # windows in a short run).
    w, span = min(a.warmup, a.duration / 5), min(60, a.duration / 3)
    warm = sampler.window("soak", w, w + span)
    last = sampler.window("soak", a.duration - span)
    post = sampler.window("soak", w)
    idle_before = sampler.window("idle")
    after = sampler.window("after", 10)
    hp = [ms for _, ms in sampler.health]
    hs = [ms for ph, ms in sampler.health if ph == "soak"]
    b_bad = {k: v["unexpected"] for k, v in shapes["shapes"].items() if v["unexpected"]}
    if shapes["client_b"]["unexpected"]:
        b_bad["dropped/stalled"] = shapes["client_b"]["unexpected"]
    shed_a = len(stats.shed_ms)
    fig = {
        "capacity_req_s": round(cap, 3), "offered_req_s": round(rate, 3), "duration_s": a.duration,
        "load_before": load_before, "load_during_mean": round(sum(s[5] for s in soak_s) / max(1, len(soak_s)), 2),
        "load_during_max": max((s[5] for s in soak_s), default=0), "load_after": load_after,
        "key_a": {
            "requests": stats.done, "client_threads_exhausted": skipped, "by_kind": dict(stats.kinds),
            "by_status": {str(k): v for k, v in stats.status.items()},
            "refusals": dict(stats.reasons), "refused_429_p50_ms": round(pct(stats.refusal_ms, 50), 2),
            "refused_429_p99_ms": round(pct(stats.refusal_ms, 99), 2), "shed_503": shed_a,
            "interactive_offered": stats.kinds["interactive"],
            "interactive_served": len(ttft), "ttft_p50_ms": round(pct(ttft, 50), 1),
            "ttft_p95_ms": round(p95, 1), "ttft_p99_ms": round(pct(ttft, 99), 1),
            "ttft_met": sum(1 for t, target in stats.ttft if t <= target),
            "client_ttft_p95_ms": round(pct(stats.client_ttft_ms, 95), 1),
            "unexpected": Counter(str(u) for u in stats.unexpected).most_common(10),
            "unanswered": len(lost), "answered_twice": len(twice),
        },
        "key_b": shapes,
        "key_b_exit": b_code,
        "health_p50_ms": round(pct(hp, 50), 2), "health_p99_ms": round(pct(hp, 99), 2),
        "health_max_ms": round(max(hp, default=0), 1), "health_soak_p99_ms": round(pct(hs, 99), 2),
        "health_soak_max_ms": round(max(hs, default=0), 1),
        "health_idle_p99_ms": round(pct([ms for ph, ms in sampler.health if ph == "idle"], 99), 2),
        "health_probes": len(hp), "health_errors": dict(sampler.health_errors),
        "threads_idle_before": median([s[3] for s in idle_before]),
        "threads_warm_median": median([s[3] for s in warm]), "threads_last_min_median": median([s[3] for s in last]),
        "threads_max": max((s[3] for s in soak_s), default=0), "threads_after": median([s[3] for s in after]),
        "threads_slope_per_min": round(slope_per_min(post, 3), 3),
        "rss_idle_before_kib": median([s[2] for s in idle_before]),
        "rss_warm_median_kib": median([s[2] for s in warm]), "rss_last_min_median_kib": median([s[2] for s in last]),
        "rss_max_kib": max((s[2] for s in soak_s), default=0), "rss_after_kib": median([s[2] for s in after]),
        "rss_slope_kib_per_min": round(slope_per_min(post, 2), 1),
        "cpu_s_soak": round(cpu_soak, 1), "cpu_s_total": round(cpu_secs(a.pid), 1) if alive else None,
        "kv_blocks_used_after": m.get("sloserve:kv_cache_blocks_used"),
        "running_after": m.get("sloserve:num_requests_running"),
        "engine_restarts": m.get("sloserve:engine_restarts_total"),
        "key_a_served": a_client.served,
        "thread_names": sampler.thread_names,
        # CPU seconds by thread name in the soak (its last sample less calibration's).
        "thread_cpu_soak_s": {k: round(v - sampler.thread_cpu.get("calibrate", {}).get(k, 0), 1)
                              for k, v in sampler.thread_cpu.get("soak", {}).items()},
        "samples": sampler.samples,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)
    print(json.dumps({k: v for k, v in fig.items() if k not in ("samples", "key_b")}, indent=2))
    print(json.dumps(shapes, indent=1))
    rss_warm = fig["rss_warm_median_kib"]
    checks = [
        ("the server stays up", alive),
        (f"key A interactive TTFT P95 {p95:.0f} ms (server-measured, {len(ttft)} of "
         f"{stats.kinds['interactive']} served) within its {a.ttft_slo_ms:.0f} ms target",
         bool(ttft) and p95 <= a.ttft_slo_ms),
        (f"key A interactive TTFT P95 as the client sees it {fig['key_a']['client_ttft_p95_ms']:.0f} ms "
         f"within the target", bool(stats.client_ttft_ms) and fig["key_a"]["client_ttft_p95_ms"] <= a.ttft_slo_ms),
        ("key A: no 5xx but load shedding, no connection error", not stats.unexpected),
        (f"key A: every request answered exactly once ({len(a_client.sent)} sent, "
         f"{len(lost)} unanswered, {len(twice)} twice)", not lost and not twice),
        ("key B: every shape got only its expected answers, no 5xx but shedding", not b_bad and b_code == 0),
        (f"/health during the soak: p99 {fig['health_soak_p99_ms']:.1f} ms < 50 ms (max "
         f"{fig['health_soak_max_ms']:.0f} ms; idle p99 {fig['health_idle_p99_ms']:.1f} ms), no probe failed",
         hs and fig["health_soak_p99_ms"] < 50 and not sampler.health_errors),
        (f"threads: last minute {fig['threads_last_min_median']} <= after warm-up "
         f"{fig['threads_warm_median']} + 4; idle after {fig['threads_after']} <= after warm-up",
         fig["threads_last_min_median"] <= fig["threads_warm_median"] + 4
         and fig["threads_after"] <= fig["threads_warm_median"]),
        (f"RSS: last minute {fig['rss_last_min_median_kib']} and idle after {fig['rss_after_kib']} KiB "
         f"within 10% of after warm-up {rss_warm} KiB",
         rss_warm and fig["rss_last_min_median_kib"] <= rss_warm * 1.10 and fig["rss_after_kib"] <= rss_warm * 1.10),
        ("every KV block free afterwards, nothing running",
         m.get("sloserve:kv_cache_blocks_used") == 0 and m.get("sloserve:num_requests_running") == 0),
    ]
    ok = True
    for name, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
        ok &= bool(passed)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
