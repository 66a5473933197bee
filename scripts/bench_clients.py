#!/usr/bin/env python3
"""NVIDIA aiperf against `sloserve bench` on the same workload (issue #53 item 4): the same prompts
(a JSONL written here, fed to aiperf as a `single_turn` custom dataset and to bench as `jsonl:`),
the same output length (`ignore_eos`), the same concurrency and request count, each client on a
fresh `sloserve serve` (so neither finds the other's prompts in the prefix cache), alternating
clients round by round. aiperf counts tokens with the tokenizer `sloserve inspect
--export-tokenizer` writes from the GGUF. Prints, per concurrency, the median over rounds of TTFT
mean / p50, ITL mean, output tok/s and requests/s for each client and aiperf / bench, and whether
each is within TOLERANCE (10%); beside them the server's own mean TTFT during each client's run
(from `/metrics`), which tells a client's overhead from a server slowed by the client's CPU use.

Usage: bench_clients.py [--bin target/release/sloserve] [--aiperf .venv-aiperf/bin/aiperf]
           [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--concurrency 1,4] [--requests 24]
           [--rounds 3] [--input-words 200] [--output-len 64] [--json out.json]
(`make bench-clients` installs aiperf 0.13.0 into .venv-aiperf and runs this.)
"""
import argparse, json, os, random, socket, statistics, subprocess, sys, time, urllib.request

WORDS = ("time river stone light garden winter market letter window harbour music paper forest "
         "engine silver morning bridge voice table mountain story friend colour island road field "
         "number question summer animal kitchen doctor teacher camera planet signal pocket").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n, words, seed):
    rng = random.Random(seed)
    return [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def start_server(bin_, model, port, name):
    log = open(f"/tmp/bench-clients-serve-{port}.log", "w")
    proc = subprocess.Popen([bin_, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port),
                             "--served-model-name", name, "--no-batch-api"], stdout=log, stderr=log)
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("server not ready")


def warm(port, name):
    body = {"model": name, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=300).read()


def server_ttft_ms(port):
    """The server's own mean TTFT over the run (its `time_to_first_token_seconds` histogram, all
    classes; the warm-up request is one of them)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("sloserve:time_to_first_token_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sloserve:time_to_first_token_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return 1000 * total / count if count else float("nan")


def run_aiperf(a, port, name, conc, data, outdir):
    cmd = [a.aiperf, "profile", "--model", name, "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
           "--streaming", "--tokenizer", a.tokenizer, "--concurrency", str(conc),
           "--request-count", str(a.requests),
           "--input-file", data, "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
           "--workers-max", "1", "--record-processors", "1", "--ui", "none", "--artifact-dir", outdir]
    subprocess.run(cmd, check=True, stdout=open(outdir + ".log", "w"), stderr=subprocess.STDOUT)
    with open(os.path.join(outdir, "profile_export_aiperf.json")) as f:
        m = json.load(f)

    def get(key, stat):
        v = m.get(key) or m.get("records", {}).get(key)
        return v[stat] if v else float("nan")
    return {"ttft_mean": get("time_to_first_token", "avg"), "ttft_p50": get("time_to_first_token", "p50"),
            "itl_mean": get("inter_token_latency", "avg"),
            "output_tok_s": get("output_token_throughput", "avg"),
            "req_s": get("request_throughput", "avg"),
            "completed": get("request_count", "avg")}


def run_bench(a, port, name, conc, data, outdir):
    cmd = [a.bin, "bench", "--url", f"http://127.0.0.1:{port}", "--endpoint", "chat", "--model", name,
           "--concurrency", str(conc), "--num-requests", str(a.requests), "--warmup", "0",
           "--dataset", f"jsonl:{data}", "--ignore-eos", "true", "--quiet", "--out", outdir]
    subprocess.run(cmd, check=True, stdout=open(outdir + ".log", "w"), stderr=subprocess.STDOUT)
    with open(os.path.join(outdir, "results.json")) as f:
        rep = json.load(f)
    s = rep["points"][0]["summary"] if "points" in rep else rep["summary"]
    return {"ttft_mean": s["ttft_ms"]["mean"], "ttft_p50": s["ttft_ms"]["median"], "itl_mean": s["itl_ms"]["mean"],
            "output_tok_s": s["output_throughput"], "req_s": s["request_throughput"], "completed": s["completed"]}


KEYS = ["ttft_mean", "ttft_p50", "itl_mean", "output_tok_s", "req_s", "server_ttft_mean"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sloserve")
    ap.add_argument("--aiperf", default=".venv-aiperf/bin/aiperf")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--input-words", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--work", default="out/bench-clients")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    a.tokenizer = os.path.join(a.work, "tokenizer")
    subprocess.run([a.bin, "inspect", "--export-tokenizer", a.tokenizer, a.model], check=True,
                   stdout=subprocess.DEVNULL)
    name = "served"
    results = {}
    for conc in [int(c) for c in a.concurrency.split(",")]:
        for r in range(a.rounds):
            texts = prompts(a.requests, a.input_words, seed=1000 * conc + r)
            ai_data = os.path.join(a.work, f"aiperf-c{conc}-r{r}.jsonl")
            bench_data = os.path.join(a.work, f"bench-c{conc}-r{r}.jsonl")
            with open(ai_data, "w") as f:
                for t in texts:
                    f.write(json.dumps({"text": t, "output_length": a.output_len}) + "\n")
            with open(bench_data, "w") as f:
                for t in texts:
                    f.write(json.dumps({"messages": [{"role": "user", "content": t}], "output_len": a.output_len}) + "\n")
            order = ["aiperf", "bench"] if r % 2 == 0 else ["bench", "aiperf"]
            for client in order:
                port = free_port()
                proc = start_server(a.bin, a.model, port, name)
                try:
                    warm(port, name)
                    outdir = os.path.join(a.work, f"{client}-c{conc}-r{r}")
                    fn = run_aiperf if client == "aiperf" else run_bench
                    row = fn(a, port, name, conc, ai_data if client == "aiperf" else bench_data, outdir)
                    row["server_ttft_mean"] = server_ttft_ms(port)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                row["load_average"] = os.getloadavg()[0]
                results.setdefault(f"c{conc}", {}).setdefault(client, []).append(row)
                print(f"c={conc} round {r + 1} {client:>6}: " + ", ".join(f"{k} {row[k]:.2f}" for k in KEYS)
                      + f" (completed {row['completed']:.0f}, load {row['load_average']:.1f})", flush=True)
    ok = True
    table = {}
    for conc, by in results.items():
        med = {c: {k: statistics.median(x[k] for x in rows) for k in KEYS} for c, rows in by.items()}
        ratios = {k: med["aiperf"][k] / med["bench"][k] for k in KEYS}
        table[conc] = {"median": med, "aiperf_over_bench": ratios}
        print(f"{conc}: " + ", ".join(f"{k} aiperf {med['aiperf'][k]:.2f} / bench {med['bench'][k]:.2f} = {ratios[k]:.3f}"
                                      for k in KEYS))
        ok &= all(abs(v - 1) <= a.tolerance for k, v in ratios.items() if k != "server_ttft_mean")
    print("within {:.0f}%: {}".format(100 * a.tolerance, "yes" if ok else "NO"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": results, "summary": table, "within_tolerance": ok, "args": vars(a)}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
