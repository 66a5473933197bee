#!/usr/bin/env python3
"""`instructor` (pinned in tests/python/requirements-instructor.txt, its own venv:
instructor 1.17 wants jiter < 0.15, which openai 3.57 of requirements.txt does not
allow) against `sloserve serve` on Qwen2.5-Coder-0.5B-Instruct: a pydantic model
returned through tool calling (instructor's default TOOLS mode: a named
tool_choice) and through response_format json_schema (JSON_SCHEMA mode).

usage: tests/python/test_instructor.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import argparse, os, signal, subprocess, sys, time, traceback

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, check, free_port, wait_ready  # noqa: E402

MODEL = "qwen"


class City(BaseModel):
    """A city and the country it is in."""
    name: str = Field(description="the city's name")
    country: str = Field(description="the country it is in")
    population_millions: float = Field(ge=0, description="its population in millions")


def test_extract(base, mode):
    client = instructor.from_openai(OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                           timeout=600), mode=mode)
    # repetition_penalty as the schema suite uses it (the greedy 0.5B otherwise
    # repeats a digit inside a number until max_tokens). No retries: the first
    # answer must validate.
    out = client.chat.completions.create(
        model=MODEL, response_model=City, max_retries=0, temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": "Describe Paris as a city record."}],
        extra_body={"repetition_penalty": 1.2})
    check(isinstance(out, City), out)
    check(out.name.lower().startswith("paris"), out)
    check("france" in out.country.lower(), out)


def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    log = open(os.path.join(ROOT, "target", "test_instructor.log"), "w")
    proc = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", str(port),
                             "--served-model-name", MODEL, "--no-batch-api"],
                            stdout=log, stderr=subprocess.STDOUT)
    passed = failed = 0
    try:
        wait_ready(base, proc, timeout=300)
        tests = [("instructor TOOLS mode", lambda: test_extract(base, instructor.Mode.TOOLS)),
                 ("instructor JSON_SCHEMA mode", lambda: test_extract(base, instructor.Mode.JSON_SCHEMA))]
        for name, t in tests:
            t0 = time.time()
            try:
                t()
                passed += 1
                print(f"ok   {name} ({time.time() - t0:.1f}s)")
            except Exception:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}\n{traceback.format_exc()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"python: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
