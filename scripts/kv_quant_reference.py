#!/usr/bin/env python3
"""Records llama.cpp's quantized-KV error against its f16 KV on the default model
(SmolLM2-135M Q4_1), for crates/model/tests/kv_quant_forward.rs: for each of the ten prompts of
tests/data/llamacpp-greedy-smollm2-q4_1.jsonl, llama-server with `-ctk f16 -ctv f16` greedily
continues 32 tokens (top-5 logprobs each step); then with `-ctk q8_0 -ctv q8_0` and with
`-ctk q4_0 -ctv q4_0` every step is teacher-forced on those tokens (the prompt plus the f16
run's first j tokens, one token predicted, top-10 logprobs); with `f16` teacher-forced too, as
the floor of llama.cpp's own run-to-run difference. Flash attention on in all three
(llama.cpp's quantized V needs it). Writes tests/data/llamacpp-kvquant-smollm2.jsonl and prints
each type's mean and max top-5 error per step. Standard library only; 127.0.0.1 only.

Usage: scripts/kv_quant_reference.py [--bin DIR] [--model FILE] [--out FILE]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "crates", "model", "tests", "data")
DEFAULT_BIN = os.path.expanduser("~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
STEPS = 32


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bin_dir, model, kv_type):
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-t", "2", "-np", "1", "-c", "4096", "-fa", "on", "-ctk", kv_type, "-ctv", kv_type]
    print("+", " ".join(cmd), file=sys.stderr)
    log = open(f"/tmp/kvquant-ref-{kv_type}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(1)
    proc.kill()
    sys.exit("llama-server did not become healthy in 300 s")


def complete(port, ids, n_predict, n_probs):
    out = post(port, "/completion", {
        "prompt": ids, "n_predict": n_predict, "temperature": 0, "n_probs": n_probs,
        "post_sampling_probs": False, "cache_prompt": True, "seed": 0,
        # Greedy past the end-of-text token too: the steps are fixed.
        "ignore_eos": True,
    })
    return out["completion_probabilities"]


def tops(p):
    return [{"id": t["id"], "logprob": t["logprob"]} for t in p["top_logprobs"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(DATA, "llamacpp-kvquant-smollm2.jsonl"))
    a = ap.parse_args()
    with open(os.path.join(DATA, "llamacpp-greedy-smollm2-q4_1.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    records = [{"id": r["id"], "prompt_token_ids": r["prompt_token_ids"]} for r in lines]
    proc, port = start_server(a.bin, a.model, "f16")
    try:
        for r in records:
            probs = complete(port, r["prompt_token_ids"], STEPS, 5)
            r["f16"] = {"greedy_token_ids": [p["id"] for p in probs],
                        "top5_logprobs_per_step": [tops(p) for p in probs]}
    finally:
        proc.terminate()
        proc.wait()
    # "f16_forced": the f16 KV teacher-forced too, llama.cpp's own floor (the forced
    # steps decode one token after a cached prefix; the greedy run decoded the same).
    for kv in ["f16", "q8_0", "q4_0"]:
        proc, port = start_server(a.bin, a.model, kv)
        try:
            for r in records:
                forced = r["f16"]["greedy_token_ids"]
                r[kv if kv != "f16" else "f16_forced"] = {"top10_logprobs_per_step": [
                    tops(complete(port, r["prompt_token_ids"] + forced[:j], 1, 10)[0]) for j in range(STEPS)]}
        finally:
            proc.terminate()
            proc.wait()
    with open(a.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {a.out} ({len(records)} records)", file=sys.stderr)
    for kv in ["f16_forced", "q8_0", "q4_0"]:
        errs = []
        for r in records:
            for base, quant in zip(r["f16"]["top5_logprobs_per_step"], r[kv]["top10_logprobs_per_step"]):
                q = {t["id"]: t["logprob"] for t in quant}
                floor = min(q.values())
                errs.append(max(abs(t["logprob"] - q.get(t["id"], floor)) for t in base))
        print(f"llama.cpp {kv} vs f16 KV: top-5 logprob error per step mean {sum(errs) / len(errs):.4f} "
              f"max {max(errs):.4f} ({len(errs)} steps)")


if __name__ == "__main__":
    main()
