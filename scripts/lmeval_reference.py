#!/usr/bin/env python3
"""Scores an lm-eval loglikelihood multiple-choice run with llama.cpp: reads lm-eval's samples
file (`--log_samples`: each doc's choices as (context, continuation) pairs, its target and the
served model's loglikelihoods), tokenizes each pair as lm-eval does (`_encode_pair`: trailing spaces
of the context move to the continuation; the continuation's tokens are those of context +
continuation past the context's own), and sums llama.cpp's logprob of each continuation token given
the tokens before it, from `llama-server` (one `/completion` step per token, the token forced by a
logit bias; its `logprob` is the log-softmax of the raw logits). Prints a JSON summary: llama.cpp's
acc and acc_norm, the run's, and the largest per-choice loglikelihood difference. Standard library
only; llama-server listens on 127.0.0.1.

usage: scripts/lmeval_reference.py --samples FILE --llama-server BIN --model GGUF [--port N]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, proc, secs=120):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    sys.exit("llama-server did not become ready")


def tokenize(base, text):
    return post(base, "/tokenize", {"content": text, "add_special": False})["tokens"]


def encode_pair(base, context, continuation):
    """lm-eval's TemplateLM._encode_pair."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenize(base, context + continuation)
    ctx = tokenize(base, context)
    return ctx, whole[len(ctx):]


def loglikelihood(base, ctx, cont):
    """Sum of log p(cont[j] | ctx + cont[:j]) and whether each was the argmax."""
    total, greedy = 0.0, True
    for j, tok in enumerate(cont):
        r = post(base, "/completion", {
            "prompt": ctx + cont[:j], "n_predict": 1, "n_probs": 1, "temperature": 0,
            "logit_bias": [[tok, 1000.0]], "cache_prompt": True,
        })
        p = r["completion_probabilities"][0]
        if p["id"] != tok:
            sys.exit(f"llama-server sampled {p['id']}, not the forced {tok}")
        total += p["logprob"]
        greedy = greedy and p["top_logprobs"][0]["id"] == tok
    return total, greedy


def pairs(sample):
    """The (context, continuation) of each choice, in choice order."""
    args = sample["arguments"]
    if isinstance(args, dict):
        keys = sorted(args, key=lambda k: int(k.rsplit("_", 1)[1]))
        return [(args[k]["arg_0"], args[k]["arg_1"]) for k in keys]
    return [tuple(a) for a in args]


def served_lls(sample):
    """The served model's loglikelihood of each choice, from lm-eval's responses."""
    return [float(r[0][0]) if isinstance(r[0], list) else float(r[0]) for r in sample["resps"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    samples = [json.loads(l) for l in open(a.samples) if l.strip()]
    port = a.port or free_port()
    base = f"http://127.0.0.1:{port}"
    # The exact setup of the shared references: F32 weights, F32 KV cache, flash attention off.
    cmd = [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
           "-np", "1", "-t", str(a.threads), "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.llama_server))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_ready(base, proc)
        acc = acc_norm = served_acc = 0
        max_diff, disagree = 0.0, []
        for s in samples:
            choices = s["doc"]["choices"]
            lls = []
            for ctx, cont in pairs(s):
                c, t = encode_pair(base, ctx, cont)
                lls.append(loglikelihood(base, c, t)[0])
            served = served_lls(s)
            max_diff = max(max_diff, max(abs(x - y) for x, y in zip(lls, served)))
            best = max(range(len(lls)), key=lambda i: lls[i])
            norm = max(range(len(lls)), key=lambda i: lls[i] / len(choices[i]))
            sbest = max(range(len(served)), key=lambda i: served[i])
            target = int(s["target"])
            acc += best == target
            acc_norm += norm == target
            served_acc += sbest == target
            if best != sbest:
                disagree.append(s["doc_id"])
        n = len(samples)
        print(json.dumps({"docs": n, "llamacpp_acc": acc / n, "llamacpp_acc_norm": acc_norm / n,
                          "served_acc": served_acc / n, "max_loglikelihood_diff": max_diff,
                          "docs_choosing_differently": disagree}))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
