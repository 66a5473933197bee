#!/usr/bin/env python3
"""`/v1/embeddings` throughput, sloserve against llama-server --embedding on the same GGUF, in the
same sitting: both servers up at once, each gets ROUNDS requests of BATCH texts (distinct windows
of a fixed paragraph, about 55 tokens each), one request at a time after a warm-up, the two
alternating round by round (the order flipped each round); prints each one's per-round inputs/s,
their medians and the ratio of the medians. Both pool by mean (`--pooling mean`), with the same
thread count; llama-server gets BATCH parallel slots (`-np`) so a request's inputs share its
batches, as sloserve's do. Standard library only; loopback only.

Usage: bench_embeddings.py --sloserve target/release/sloserve --llama-bin <llama.cpp build/bin>
           [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--batch 32] [--rounds 8] [--threads 2]
           [--max-model-len 2048] [--llama-ubatch 4096]
(all-MiniLM-L6-v2: --model models/all-MiniLM-L6-v2.F16.gguf; `make bench-embeddings-minilm`.)
"""
import argparse, json, os, socket, subprocess, sys, time, urllib.request

WORDS = ("the harbour town kept its boats close that winter while the lighthouse keeper wrote "
         "each storm into a ledger nobody read until spring when the fishermen argued about "
         "nets prices weather and the new school the council had promised for years").split()


def texts(n, words):
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)) + f" ({i})" for i in range(n)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def wait(port, proc, path):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("server not ready")


def start(name, cmd, port, ready, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/bench-emb-{name}.log", "w"), env=env)
    try:
        wait(port, proc, ready)
    except BaseException:
        proc.kill()
        raise
    return proc


def one_round(port, batch, words):
    """One request of `batch` texts: (inputs/s, prompt tokens/s)."""
    t0 = time.time()
    out = post(port, "/v1/embeddings", {"input": texts(batch, words)})
    secs = time.time() - t0
    assert len(out["data"]) == batch, out
    return batch / secs, out["usage"]["prompt_tokens"] / secs


def median(xs):
    xs = sorted(xs)
    return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sloserve", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", default="interactive")
    ap.add_argument("--max-model-len", type=int, default=2048)
    # llama-server's batch and micro-batch (-b, -ub): a non-causal model attends over the whole
    # micro-batch (masked), so a smaller one can be faster for an encoder; 4096: one request, one batch.
    ap.add_argument("--llama-ubatch", type=int, default=4096)
    a = ap.parse_args()
    p1, p2 = free_port(), free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=a.llama_bin)
    servers = {}
    rates = {"sloserve": [], "llama-server": []}
    try:
        servers["sloserve"] = (start("sloserve", [a.sloserve, "serve", "--model", a.model, "--port", str(p1),
                                                  "--pooling", "mean", "--threads", str(a.threads), "--profile",
                                                  a.profile, "--max-model-len", str(a.max_model_len)],
                                     p1, "/ready"), p1)
        servers["llama-server"] = (start("llama-server", [os.path.join(a.llama_bin, "llama-server"), "-m", a.model,
                                                          "--port", str(p2), "--host", "127.0.0.1", "--embedding",
                                                          "--pooling", "mean", "-t", str(a.threads), "-np", str(a.batch),
                                                          "-c", str(a.batch * 128), "-b", str(a.llama_ubatch),
                                                          "-ub", str(a.llama_ubatch)],
                                         p2, "/health", env), p2)
        for name, (_, port) in servers.items():
            one_round(port, a.batch, 48)  # warm-up
        # Alternating rounds (the order flips each round), so load from other work on the
        # machine falls on both alike; each round is one request of BATCH texts.
        for r in range(a.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                rates[name].append(one_round(servers[name][1], a.batch, 48 + r % 3))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    med = {}
    for name, rs in rates.items():
        med[name] = median([x for x, _ in rs])
        print(f"{name}: median {med[name]:.1f} inputs/s, {median([t for _, t in rs]):.0f} tokens/s over {len(rs)} "
              f"rounds (each: {', '.join(f'{x:.1f}' for x, _ in rs)} inputs/s)", file=sys.stderr)
    print(f"sloserve / llama-server (medians): {med['sloserve'] / med['llama-server']:.2f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
