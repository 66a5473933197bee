#!/usr/bin/env python3
"""The local gateway stack end to end (`make test-gateway`; not in `make test`): two
`sloserve serve` replicas behind Envoy and llm-d-router's EPP (deploy/local/gateway.py),
driven with the openai SDK through Envoy's port only.

Checks: 50 requests (chat, streaming chat, completions) all succeed and both replicas
serve some (their own /metrics say so); the gateway's SLO headers reach the replica; a
shared-prefix workload lands mostly on one replica (the EPP's prefix scorer); a replica
killed with SIGKILL leaves the picks within seconds and no client hangs; `down` stops
every process. With --mode direct (Envoy alone, no EPP) the prefix check does not apply
and is reported as skipped.

usage: tests/gateway/test_gateway.py --bin target/debug/sloserve [--mode epp|direct|auto]
       [--epp-config approximate|precise]
Ends with 'gateway: N passed, M failed'; exits non-zero on any failure.
"""

import argparse
import concurrent.futures as cf
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

import gwtest as g

SYSTEM = ("You are the help desk of the Northwind harbour office. " * 4 + "Rules: " + " ".join(
    f"rule {i}: answer about berth {i}, tides and fees in plain words, and never invent a price." for i in range(24)))


def fifty_requests(stack, model, ports):
    before = [g.served(p) for p in ports]
    c = g.client(stack)
    jobs = [(g.KINDS[i % 3], f"Request {i}: name a colour and a fruit ({i * 7919 % 1000}).") for i in range(50)]
    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda j: j[0](c, model, j[1]), jobs))
    assert len(results) == 50
    delta = [g.served(p) - b for p, b in zip(ports, before)]
    print(f"  50 requests: per replica {delta}")
    assert sum(delta) == 50, f"replicas finished {delta}, sum != 50"
    assert all(d > 0 for d in delta), f"a replica served nothing: {delta}"


def slo_headers(stack, model, ports):
    """The gateway's headers pass through Envoy (and the EPP) and reach the replica: SLO
    targets, the class and the objective (in direct mode they also pick the batch replica)."""
    c = g.client(stack)
    r = g.chat(c, model, "Say hi.", extra_headers={"x-llm-d-slo-ttft-ms": "4321", "x-llm-d-slo-tpot-ms": "987"})
    slo = (r.usage.model_extra or {}).get("sloserve", {})
    assert slo.get("ttft_target_ms") == 4321 and slo.get("tpot_target_ms") == 987, slo
    g.wait_idle(ports)
    before = [g.served(p) for p in ports]
    for h in [{"x-slo-class": "batch"}, {"x-llm-d-inference-objective": "batch"}, {"x-slo-class": "batch"}]:
        r = g.completion(c, model, "Batch work:", extra_headers=h)
        assert r.usage.model_extra["sloserve"]["slo_class"] == "batch", (h, r.usage)
    delta = [g.served(p) - b for p, b in zip(ports, before)]
    if stack["mode"] == "direct":
        assert delta == [0, 3], f"batch requests not on the batch replica (replica-1): {delta}"


def shared_prefix(stack, model, ports, n=20):
    g.wait_idle(ports)
    before = [g.served(p) for p in ports]
    hits0 = [g.family_sum(g.metrics(p), "sloserve:prefix_cache_hits_total") for p in ports]
    c = g.client(stack)
    for i in range(n):
        c.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Question {i}: when does berth {i % 24} open?"}])
    delta = [g.served(p) - b for p, b in zip(ports, before)]
    hits = [g.family_sum(g.metrics(p), "sloserve:prefix_cache_hits_total") - h for p, h in zip(ports, hits0)]
    share = max(delta) / n
    print(f"  shared prefix: {n} requests per replica {delta} (top share {share:.0%}); cached prompt tokens {hits}")
    assert sum(delta) == n, delta
    assert share >= 0.8, f"shared-prefix requests spread {delta}: the prefix scorer did not keep them together"


def kill_one(stack, model, ports):
    """SIGKILL replica-1 while it streams: no client hangs (the cut streams fail at
    once), and within seconds every request goes to the survivor."""
    victim = next(p for p in stack["procs"] if p["name"] == "replica-1")
    victim_port, survivor_port = ports[1], ports[0]
    c = g.client(stack, timeout=30.0)

    def stream(i):
        t0 = time.time()
        try:
            g.chat_stream(c, model, f"Count slowly from {i} to {i + 200}, one number a line.", max_tokens=160)
            return "ok", time.time() - t0
        except Exception as e:  # a stream cut by the kill: an error, not a hang
            return type(e).__name__, time.time() - t0

    def probe(t_kill, seconds=12.0):
        """Completions one after another from the kill on, no SDK retries."""
        out = []
        while time.time() - t_kill < seconds:
            t0 = time.time()
            try:
                g.completion(c, model, "The sea is", max_tokens=2)
                out.append((t0 - t_kill, "ok"))
            except Exception as e:
                out.append((t0 - t_kill, type(e).__name__))
        return out

    g.wait_idle(ports)
    before = g.served(survivor_port)
    with cf.ThreadPoolExecutor(12) as ex:
        futs = []
        t0 = time.time()
        # Streams until the victim runs at least one (the EPP spreads them by load).
        while g.family_sum(g.metrics(victim_port), "vllm:num_requests_running") < 1:
            assert time.time() - t0 < 20 and len(futs) < 8, "replica-1 got no stream to run"
            futs.append(ex.submit(stream, len(futs)))
            time.sleep(0.5)
        t_kill = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        probing = ex.submit(probe, t_kill)
        inflight = [f.result(timeout=45) for f in futs]
        outcomes = probing.result(timeout=60)
    print(f"  {len(inflight)} streams in flight at the kill: "
          + ", ".join(f"{o} after {d:.1f} s" for o, d in inflight))
    assert all(d < 35 for _, d in inflight), f"a client waited past its bound: {inflight}"
    assert any(o != "ok" for o, _ in inflight), f"no stream was cut by the kill: {inflight}"
    failed = [t for t, o in outcomes if o != "ok"]
    last_fail = max(failed) if failed else 0.0
    print(f"  from the kill on: {len(outcomes)} requests one after another, {len(failed)} failed"
          + (f", the last {last_fail:.2f} s after the kill" if failed else ""))
    assert last_fail < 5.0, f"requests still failed {last_fail:.1f} s after the kill: {outcomes}"
    ok_late = [t for t, o in outcomes if o == "ok" and t > 5.0]
    assert len(ok_late) >= 3, f"too few requests served after the kill: {outcomes}"
    gained = g.served(survivor_port) - before
    assert gained >= len(outcomes) - len(failed), (gained, outcomes)
    if stack["mode"] == "epp":
        dead = f"127.0.0.1:{victim_port}"
        late = [r for r in g.access_log(stack["run_dir"]) if r[0] > t_kill + 5.0 and r[3] == dead]
        assert not late, f"the EPP still picked the dead replica: {late[:3]}"
        with open(os.path.join(stack["log_dir"], "watcher.log")) as f:
            drops = [float(line.split()[0]) for line in f if "replica-1" not in line.split("->")[-1]]
        drop = [t - t_kill for t in drops if t > t_kill]
        assert drop and drop[0] < 3.0, f"the watcher did not drop replica-1 in time: {drop}"
        print(f"  replica-1 left the discovery file {drop[0]:.2f} s after the kill")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(g.ROOT, "target", "debug", "sloserve"))
    ap.add_argument("--model", default=os.path.join(g.ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--mode", default="epp", choices=["epp", "direct", "auto"])
    ap.add_argument("--epp-config", default="approximate",
                    help="the EPP's scorers (gateway.py up --epp-config): approximate or precise prefix")
    ap.add_argument("--keep", action="store_true", help="leave the run folder (logs) in place")
    args = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="sloserve-gateway-test-")
    passed = failed = skipped = 0
    stack = g.stack_up(args.bin, args.model, run_dir, args.mode, ["--epp-config", args.epp_config])
    model, ports = stack["model"], [r["port"] for r in stack["replicas"]]
    print(f"gateway: {stack['mode']} stack, Envoy on {stack['ports']['envoy']}, replicas {ports}, logs {run_dir}/logs")
    checks = [fifty_requests, slo_headers, shared_prefix, kill_one]
    try:
        for check in checks:
            if check is shared_prefix and stack["mode"] != "epp":
                print(f"SKIP {check.__name__}: no EPP (direct mode has no prefix scorer)")
                skipped += 1
                continue
            t0 = time.time()
            try:
                check(stack, model, ports)
                print(f"PASS {check.__name__} ({time.time() - t0:.1f} s)")
                passed += 1
            except Exception:
                traceback.print_exc()
                print(f"FAIL {check.__name__}")
                failed += 1
    finally:
        g.stack_down(run_dir)
    gone = [p for p in stack["procs"] if g.pid_alive(p["pid"])]
    if gone:
        print(f"FAIL down: still running {gone}")
        failed += 1
    else:
        print(f"PASS down: all {len(stack['procs'])} processes stopped")
        passed += 1
    if failed or args.keep:
        print(f"logs kept in {run_dir}/logs")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"gateway: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
