#!/usr/bin/env python3
"""`/v1/embeddings` throughput, sloserve against llama-server --embedding on the same GGUF, in the
same sitting: each server gets ROUNDS requests of BATCH texts (distinct windows of a fixed
paragraph, about TOKENS tokens each), one request at a time after a warm-up round; prints inputs/s
and prompt tokens/s for each and their ratio. Both pool by mean (`--pooling mean`), with the same
thread count; llama-server gets BATCH parallel slots (`-np`) so a request's inputs share its
batches, as sloserve's do. Standard library only; loopback only.

Usage: bench_embeddings.py --sloserve target/release/sloserve --llama-bin <llama.cpp build/bin>
           [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--batch 32] [--rounds 8] [--threads 2]
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


def run(name, cmd, port, ready, batch, rounds, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/bench-emb-{name}.log", "w"), env=env)
    try:
        wait(port, proc, ready)
        inputs = texts(batch, 48)
        post(port, "/v1/embeddings", {"input": inputs})  # warm-up
        tokens, t0 = 0, time.time()
        for r in range(rounds):
            out = post(port, "/v1/embeddings", {"input": texts(batch, 48 + r % 3)})
            assert len(out["data"]) == batch, out
            tokens += out["usage"]["prompt_tokens"]
        secs = time.time() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    n = batch * rounds
    print(f"{name}: {n} inputs, {tokens} tokens in {secs:.2f} s: {n / secs:.1f} inputs/s, "
          f"{tokens / secs:.0f} tokens/s", file=sys.stderr)
    return n / secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sloserve", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", default="interactive")
    a = ap.parse_args()
    p1 = free_port()
    ours = run("sloserve", [a.sloserve, "serve", "--model", a.model, "--port", str(p1), "--pooling", "mean",
                            "--threads", str(a.threads), "--profile", a.profile, "--max-model-len", "2048"],
               p1, "/ready", a.batch, a.rounds)
    p2 = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=a.llama_bin)
    theirs = run("llama-server", [os.path.join(a.llama_bin, "llama-server"), "-m", a.model, "--port", str(p2),
                                  "--host", "127.0.0.1", "--embedding", "--pooling", "mean", "-t", str(a.threads),
                                  "-np", str(a.batch), "-c", str(a.batch * 128), "-b", "4096", "-ub", "4096"],
                 p2, "/health", a.batch, a.rounds, env)
    print(f"sloserve / llama-server: {ours / theirs:.2f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
