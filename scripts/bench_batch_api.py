#!/usr/bin/env python3
"""Batch API benchmark (issue #11): does a batch job use the capacity that
interactive traffic leaves, without hurting the interactive TTFT?

A. `--profile batch`: a JOB-line job (50-word prompts, 32 tokens, EOS ignored)
   submitted through /v1/files + /v1/batches, against the same requests sent
   directly (non-streamed) at concurrency 16, 32 and 64; the job's output tok/s
   over the best direct figure (goal >= 0.9).
B. `--profile mixed`: an interactive stream (shared 150-word prefix + 16 words,
   32 tokens, streamed, open-loop Poisson arrivals at half the interactive
   capacity, which is measured first as the request rate of two closed-loop
   clients) alone and beside the job. Goals: interactive TTFT P95 beside the job
   within 1.2x of alone; the job's output tok/s while the stream runs >= 0.8 x
   (job alone - the stream's output tok/s).

Prints medians over RUNS, writes OUT/results.json, OUT/table.md and a plot of
the job's throughput and the stream's TTFT over time (OUT/batch-api.png).

usage: scripts/bench_batch_api.py [--runs 3] [--job 500] [--stream-requests 100] [--bin target/release/sloserve]
       [--only a|b] [--mixed-args "SERVE FLAGS"]
Loopback only; every loop is bounded.
"""
import argparse, http.client, io, json, os, random, statistics, subprocess, sys, tempfile
import threading, time, urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import bench_slo_steps as slo  # noqa: E402  (the streaming client and workload)

PORT = 8093
slo.PORT = PORT
URL = f"http://127.0.0.1:{PORT}"
SMOOTH_S = 5.0  # the plot's throughput window


class Server:
    def __init__(self, binary, model, profile, log, extra=()):
        self.data = tempfile.mkdtemp(prefix="sloserve-bench-batch-")
        args = [binary, "serve", "--model", model, "--port", str(PORT), "--profile", profile,
                "--data-dir", self.data, *extra]
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                urllib.request.urlopen(URL + "/ready", timeout=1).read()
                return
            except Exception:
                if self.proc.poll() is not None:
                    sys.exit(f"sloserve exited: see {log.name}")
                time.sleep(0.2)
        sys.exit("sloserve never became ready")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def call(method, path, body=None, ctype="application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    conn.request(method, path, body=body, headers={"Content-Type": ctype} if body else {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def job_body(i):
    rng = random.Random(424242 + i)
    return {"prompt": slo.words(rng, 50), "max_tokens": 32, "temperature": 0.0, "ignore_eos": True}


def direct(n, concurrency):
    """The job's requests sent directly; returns output tok/s."""
    done, lock, nxt = [0], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= n:
                    return
                i = nxt[0]
                nxt[0] += 1
            r = call("POST", "/v1/completions", json.dumps(job_body(i)).encode())
            with lock:
                done[0] += r["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0] / (time.perf_counter() - t0)


def submit_job(n):
    lines = "".join(json.dumps({"custom_id": f"j{i}", "method": "POST", "url": "/v1/completions",
                                "body": job_body(i)}) + "\n" for i in range(n))
    boundary = "benchbatch"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"job.jsonl\"\r\n\r\n"
            f"{lines}\r\n--{boundary}--\r\n").encode()
    f = call("POST", "/v1/files", body, f"multipart/form-data; boundary={boundary}")
    b = call("POST", "/v1/batches", json.dumps({"input_file_id": f["id"], "endpoint": "/v1/completions",
                                                 "completion_window": "24h"}).encode())
    return b["id"]


def follow(bid, t_origin, stop=None):
    """Polls the batch every 0.25 s: [(t, output_tokens)] until it ends (or `stop`)."""
    trace = []
    while True:
        b = call("GET", f"/v1/batches/{bid}")
        trace.append((time.perf_counter() - t_origin, b["usage"]["output_tokens"]))
        if b["status"] in ("completed", "failed", "cancelled", "expired") or (stop and stop.is_set()):
            return trace, b
        time.sleep(0.25)


def rate_between(trace, a, b):
    pts = [(t, n) for t, n in trace if a <= t <= b]
    if len(pts) < 2:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def job_rate(trace):
    moving = [(t, n) for t, n in trace if n > 0]
    return rate_between(trace, trace[0][0], moving[-1][0]) if moving else None


def open_loop(w, rate, n, t_origin, seed):
    rng = random.Random(seed)
    out, threads = [], []
    t = time.perf_counter()
    for i in range(n):
        t += rng.expovariate(rate)
        time.sleep(max(0.0, t - time.perf_counter()))
        th = threading.Thread(target=lambda i=i: out.append(slo.one(w.interactive(i), t_origin)))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return out


def part_a(args, log):
    srv = Server(args.bin, args.model, "batch", log)
    try:
        best = max(direct(args.job, c) for c in (16, 32, 64))
        t0 = time.perf_counter()
        trace, b = follow(submit_job(args.job), t0)
        job = b["usage"]["output_tokens"] / trace[-1][0]
        return {"direct_best_tok_s": best, "job_tok_s": job, "ratio": job / best}
    finally:
        srv.stop()


def part_b(args, log, run):
    srv = Server(args.bin, args.model, "mixed", log, args.mixed_args.split())
    w = slo.Workload(seed=run + 1)
    try:
        slo.warm(w)
        t0 = time.perf_counter()
        cap = slo.run_loop(lambda i: w.interactive(20_000 + i), 2, t0, 16, slo.STAGGER_S)
        ok = [r for r in cap if r["ok"]]
        capacity = len(ok) / (max(r["stamps"][-1] for r in ok) - min(r["start"] for r in ok))
        rate = capacity / 2
        t0 = time.perf_counter()
        alone = open_loop(w, rate, args.stream_requests, t0, seed=run)
        st_alone = slo.summarize_interactive(alone)
        t0 = time.perf_counter()
        job_alone_trace, _ = follow(submit_job(args.job), t0)
        job_alone = job_rate(job_alone_trace)
        t0 = time.perf_counter()
        bid = submit_job(args.job)
        stop = threading.Event()
        res = {}
        th = threading.Thread(target=lambda: res.update(zip(("trace", "b"), follow(bid, t0, stop))))
        th.start()
        time.sleep(3.0)  # the job fills the engine first
        a = time.perf_counter() - t0
        beside = open_loop(w, rate, args.stream_requests, t0, seed=run)
        b_ = time.perf_counter() - t0
        th.join()
        st_beside = slo.summarize_interactive(beside)
        job_beside = rate_between(res["trace"], a, b_)
        floor = 0.8 * (job_alone - st_alone["output_tok_s"])
        return {
            "capacity_req_s": capacity, "stream_rate_req_s": rate,
            "ttft_p95_alone_ms": st_alone["ttft_p95_ms"], "ttft_p95_beside_ms": st_beside["ttft_p95_ms"],
            "ttft_p95_ratio": st_beside["ttft_p95_ms"] / st_alone["ttft_p95_ms"],
            "tpot_p50_alone_ms": st_alone["tpot_p50_ms"], "tpot_p50_beside_ms": st_beside["tpot_p50_ms"],
            "stream_tok_s": st_alone["output_tok_s"], "job_alone_tok_s": job_alone,
            "job_beside_tok_s": job_beside, "job_floor_tok_s": floor,
        }, {"job_alone": job_alone_trace, "job_beside": res["trace"], "window": [a, b_],
            "stream_alone": [(r["start"], r["ttft"]) for r in alone if r["ok"]],
            "stream_beside": [(r["start"], r["ttft"]) for r in beside if r["ok"]]}
    finally:
        srv.stop()


def plot(trace, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for key, style in (("job_alone", "--"), ("job_beside", "-")):
        # Lines finish in bursts (equal lengths end together): a 5 s trailing window.
        tr = trace[key]
        xs, ys, j = [], [], 0
        for t, n in tr:
            while tr[j][0] < t - SMOOTH_S:
                j += 1
            if t - tr[j][0] >= SMOOTH_S / 2:
                xs.append(t)
                ys.append((n - tr[j][1]) / (t - tr[j][0]))
        ax1.plot(xs, ys, style, label=key.replace("_", " "))
    a, b = trace["window"]
    for ax in (ax1, ax2):
        ax.axvspan(a, b, color="orange", alpha=0.1, label="stream beside the job" if ax is ax1 else None)
    ax1.set_ylabel(f"job output tok/s ({SMOOTH_S:.0f} s window)")
    ax1.legend()
    for key, m in (("stream_alone", "x"), ("stream_beside", "o")):
        pts = trace[key]
        off = a if key == "stream_alone" else 0.0
        ax2.scatter([p[0] + off for p in pts], [p[1] * 1e3 for p in pts], marker=m, s=14, label=key.replace("_", " ") + (" (shifted)" if off else ""))
    ax2.set_ylabel("interactive TTFT (ms)")
    ax2.set_xlabel("seconds")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--job", type=int, default=500)
    ap.add_argument("--stream-requests", type=int, default=100,
                    help="interactive requests in each stream (a P95 over 40 is the 2nd worst)")
    ap.add_argument("--out", default="out/bench-batch-api")
    ap.add_argument("--only", choices=["a", "b"])
    ap.add_argument("--mixed-args", default="",
                    help="extra `serve` flags for part B (the mixed profile), e.g. '--default-tpot-slo-ms 40'")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "server.log"), "w")
    res = {"a": [], "b": [], "load": os.getloadavg()}
    trace = None
    for run in range(args.runs):
        if args.only != "b":
            res["a"].append(part_a(args, log))
            print(f"run {run} A: {json.dumps(res['a'][-1])}", flush=True)
        if args.only != "a":
            r, trace = part_b(args, log, run)
            res["b"].append(r)
            print(f"run {run} B: {json.dumps(r)}", flush=True)
    res["load_end"] = os.getloadavg()
    med = lambda part, k: statistics.median(x[k] for x in res[part]) if res[part] else None
    rows = []
    if res["a"]:
        rows += [f"| job alone ({args.job} lines, batch profile), output tok/s | {med('a', 'job_tok_s'):.1f} |",
                 f"| same requests direct, best of c16/32/64, output tok/s | {med('a', 'direct_best_tok_s'):.1f} |",
                 f"| job / direct (goal >= 0.9) | {med('a', 'ratio'):.2f} |"]
    if res["b"]:
        rows += [f"| interactive stream rate (req/s; capacity {med('b', 'capacity_req_s'):.2f}) | {med('b', 'stream_rate_req_s'):.2f} |",
                 f"| TTFT P95 alone / beside the job (ms) | {med('b', 'ttft_p95_alone_ms'):.0f} / {med('b', 'ttft_p95_beside_ms'):.0f} |",
                 f"| TTFT P95 ratio (goal <= 1.2) | {med('b', 'ttft_p95_ratio'):.2f} |",
                 f"| interactive TPOT p50 alone / beside the job (ms) | {med('b', 'tpot_p50_alone_ms'):.1f} / {med('b', 'tpot_p50_beside_ms'):.1f} |",
                 f"| job alone / beside the stream, output tok/s | {med('b', 'job_alone_tok_s'):.1f} / {med('b', 'job_beside_tok_s'):.1f} |",
                 f"| floor 0.8 x (job alone - stream {med('b', 'stream_tok_s'):.1f} tok/s) | {med('b', 'job_floor_tok_s'):.1f} |"]
    table = "| medians of %d runs | |\n|---|---|\n" % args.runs + "\n".join(rows) + "\n"
    print(table)
    open(os.path.join(args.out, "table.md"), "w").write(table)
    json.dump(res, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    if trace:
        json.dump(trace, open(os.path.join(args.out, "trace.json"), "w"))
        plot(trace, os.path.join(args.out, "batch-api.png"))


if __name__ == "__main__":
    main()
