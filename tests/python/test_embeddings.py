#!/usr/bin/env python3
"""The real `openai` Python SDK's `client.embeddings.create` against `sloserve serve
--pooling mean` on the default model: one text, several, token ids (the SDK asks for base64 by
default and decodes it; floats asked explicitly give the same vectors), `dimensions`, and an
OpenAI error for a bad request. Also `/v1/rerank` and `/score` through the SDK's raw POST.

usage: tests/python/test_embeddings.py [--bin BINARY]
Ends with a line 'python: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, math, os, signal, subprocess, sys, tempfile

import openai

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, check, free_port, wait_ready  # noqa: E402

MODEL = "smol"


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def test_embeddings(client):
    texts = ["The capital of France is Paris.", "Bananas are yellow."]
    r = client.embeddings.create(model=MODEL, input=texts)
    check(r.object == "list" and len(r.data) == 2, r)
    check([d.index for d in r.data] == [0, 1], r.data)
    check(all(len(d.embedding) == 576 and abs(norm(d.embedding) - 1) < 1e-4 for d in r.data), "576 unit floats")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens, r.usage)
    floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    check(cosine(floats.data[0].embedding, r.data[0].embedding) > 0.999999, "base64 and float differ")
    root = client.with_options(base_url=str(client.base_url).removesuffix("v1/"))
    ids = root.post("/tokenize", body={"prompt": texts[0]}, cast_to=object)["tokens"]
    by_ids = client.embeddings.create(model=MODEL, input=[ids])
    check(cosine(by_ids.data[0].embedding, r.data[0].embedding) > 0.999999, "token ids differ")
    short = client.embeddings.create(model=MODEL, input=texts[0], dimensions=32)
    check(len(short.data[0].embedding) == 32 and abs(norm(short.data[0].embedding) - 1) < 1e-4, "dimensions")


def test_errors(client):
    for kwargs, param in [(dict(input=[]), "input"), (dict(input="a", dimensions=100000), "dimensions")]:
        try:
            client.embeddings.create(model=MODEL, **kwargs)
            raise AssertionError(f"{kwargs}: no error")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body.get("param") == param, e.body)


def test_rerank_and_score(client):
    docs = ["Paris is the capital of France.", "Bananas are yellow."]
    r = client.post("/rerank", body={"model": MODEL, "query": "capital of France", "documents": docs},
                    cast_to=object)
    scores = [x["relevance_score"] for x in r["results"]]
    check(len(scores) == 2 and scores[0] >= scores[1], r)
    root = client.with_options(base_url=str(client.base_url).removesuffix("v1/"))
    s = root.post("/score", body={"text_1": "capital of France", "text_2": docs}, cast_to=object)
    by_index = {x["index"]: x["relevance_score"] for x in r["results"]}
    check(all(abs(d["score"] - by_index[d["index"]]) < 1e-6 for d in s["data"]), s)


def main():
    ap = argparse.ArgumentParser()
    target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="sloserve-embed-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "--port", str(port), "--served-model-name", MODEL, "--pooling", "mean",
           "--data-dir", tempfile.mkdtemp(prefix="sloserve-embed-data-"),
           "--max-model-len", "1024", "--kv-cache-memory", "64MiB"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    passed, failed = 0, 0
    try:
        wait_ready(base, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        for t in [test_embeddings, test_errors, test_rerank_and_score]:
            try:
                t(client)
                passed += 1
                print(f"ok   {t.__name__}")
            except Exception as e:
                failed += 1
                print(f"FAIL {t.__name__}: {e!r}")
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        if code != 0:
            failed += 1
            print(f"FAIL server exit code {code} (log {log.name})")
    print(f"python: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
