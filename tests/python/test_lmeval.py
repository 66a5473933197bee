#!/usr/bin/env python3
"""lm-eval 0.4.13 end to end: its `local-completions` model (echo + logprobs on /v1/completions,
the server's own tokenizer through `tokenizer_backend=remote`: /tokenizer_info, /tokenize,
/detokenize) runs the local multiple-choice task tests/data/lmeval/sloserve_mc.yaml (32 questions
from tests/data/lmeval/questions.jsonl, no hub download) against `sloserve serve` in exact
precision, and its accuracy must equal the one llama.cpp's logits give on the same choices
(scripts/lmeval_reference.py: llama-server on the model dequantized to F32, F32 KV cache).

Standard library only; run with lm-eval's venv (make test-lmeval).
usage: tests/python/test_lmeval.py --bin SLOSERVE [--model GGUF] [--llama-bin DIR] [--out DIR]
Ends with 'python: N passed, M failed'.
"""
import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LLAMA_BIN = os.path.expanduser(
    "~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
TASK_DIR = os.path.join(ROOT, "tests", "data", "lmeval")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, proc, secs=300):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"sloserve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    sys.exit("sloserve did not become ready")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", LLAMA_BIN))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "lmeval"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    # llama.cpp's exact reference: the same weights dequantized to F32.
    f32 = os.path.join(a.out, os.path.basename(a.model).replace(".gguf", ".f32.gguf"))
    if not os.path.exists(f32):
        env = dict(os.environ, LD_LIBRARY_PATH=a.llama_bin)
        subprocess.run([os.path.join(a.llama_bin, "llama-quantize"), "--allow-requantize",
                        a.model, f32, "F32"], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([a.bin, "serve", "--model", a.model, "--host", "127.0.0.1",
                               "--port", str(port), "--precision", "exact",
                               "--served-model-name", "smol"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = os.path.join(a.out, "results")
    try:
        wait_ready(base, server)
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        lm_eval = os.path.join(os.path.dirname(sys.executable), "lm_eval")
        subprocess.run([lm_eval, "--model", "local-completions", "--model_args",
                        f"base_url={base}/v1/completions,model=smol,tokenizer_backend=remote,"
                        "num_concurrent=1,max_retries=1",
                        "--tasks", "sloserve_mc", "--include_path", TASK_DIR,
                        "--log_samples", "--output_path", results],
                       check=True, cwd=ROOT, env=env)
    finally:
        server.terminate()
        server.wait(timeout=30)
    t_lmeval = time.time() - t0
    res_file = sorted(glob.glob(os.path.join(results, "**", "results_*.json"), recursive=True),
                      key=os.path.getmtime)[-1]
    samples = sorted(glob.glob(os.path.join(results, "**", "samples_sloserve_mc_*.jsonl"),
                               recursive=True), key=os.path.getmtime)[-1]
    metrics = json.load(open(res_file))["results"]["sloserve_mc"]
    ref = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "lmeval_reference.py"),
                          "--samples", samples, "--llama-server",
                          os.path.join(a.llama_bin, "llama-server"), "--model", f32],
                         check=True, capture_output=True, text=True)
    r = json.loads(ref.stdout.strip().splitlines()[-1])
    acc, acc_norm = metrics["acc,none"], metrics["acc_norm,none"]
    print(json.dumps({"lm_eval_acc": acc, "lm_eval_acc_norm": acc_norm, **r,
                      "lm_eval_secs": round(t_lmeval, 1),
                      "total_secs": round(time.time() - t0, 1)}))
    checks = [
        ("acc equals llama.cpp's", abs(acc - r["llamacpp_acc"]) < 1e-9),
        ("acc_norm equals llama.cpp's", abs(acc_norm - r["llamacpp_acc_norm"]) < 1e-9),
        ("every choice's loglikelihood within 2e-3 of llama.cpp's",
         r["max_loglikelihood_diff"] < 2e-3),
    ]
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    print(f"python: {len(checks) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
