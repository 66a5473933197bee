#!/usr/bin/env python3
"""Structured output through the real `openai` SDK against `sloserve serve` on
Qwen2.5-Coder-0.5B-Instruct: `response_format` json_schema (strict) for each schema
of the suite in crates/grammar/tests/schemas (the reply must parse and validate
with the `jsonschema` package, formats checked), `json_object`, streaming, and
clear 400s for constraints that cannot run.

usage: tests/python/test_structured_output.py [--bin BINARY] [--model GGUF] [--all]
Without --all a fixed sample of the suite runs (make test); --all runs every
schema (make test-structured). Ends with 'python: N passed, M failed'.
"""
import argparse, concurrent.futures, glob, json, os, signal, subprocess, sys, time, traceback

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, check, free_port, wait_ready  # noqa: E402

MODEL = "qwen"
SCHEMAS = os.path.join(ROOT, "crates", "grammar", "tests", "schemas")
# The sample make test runs: nested objects, bounded arrays, enums, anyOf, $ref,
# a string format, number bounds, an OpenAI-strict-style schema.
SAMPLE = ["03_nested_objects", "05_array_min_max_items", "06_string_enum", "10_anyof_objects",
          "11_ref_defs", "13_format_date", "18_integer_bounds", "31_openai_strict_style"]


def schemas(all_):
    out = []
    for path in sorted(glob.glob(os.path.join(SCHEMAS, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if all_ or name in SAMPLE:
            with open(path) as f:
                out.append((name, json.load(f)))
    return out


def ask_schema(client, name, schema):
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=400,
        messages=[{"role": "system", "content": "Reply with one small JSON value: short strings, "
                   "at most two items in any list, nesting at most two levels deep."},
                  {"role": "user", "content": f"Give a small example value for the schema '{name}'."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": name[:64], "schema": schema, "strict": True}},
        # Greedy decoding of a 0.5B model loops (endless digits, endless recursion);
        # the grammar keeps every prefix valid, a mild penalty lets the value end.
        extra_body={"repetition_penalty": 1.2})
    text = r.choices[0].message.content
    check(r.choices[0].finish_reason == "stop", f"{name}: finish {r.choices[0].finish_reason}: {text!r}")
    value = json.loads(text)
    # The 2020-12 checker: a bare FormatChecker() mixes drafts ('time' as draft 3's).
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator,
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return value


def test_schema_suite(client, all_):
    suite = schemas(all_)
    check(len(suite) >= (30 if all_ else len(SAMPLE)), f"{len(suite)} schemas")
    failures = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = {pool.submit(ask_schema, client, n, s): n for n, s in suite}
        for f in concurrent.futures.as_completed(futs):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                failures.append(f"{futs[f]}: {e}")
    check(not failures, f"{len(failures)}/{len(suite)} invalid:\n" + "\n".join(failures))
    print(f"  {len(suite)} schemas: every reply parsed and validated")


def test_json_object_and_streaming(client):
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        response_format={"type": "json_object"})
    check(isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content)
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    text, finish = "", None
    for chunk in client.chat.completions.create(
            model=MODEL, temperature=0.8, seed=3, max_tokens=100, stream=True,
            messages=[{"role": "user", "content": "Pick a colour and a count."}],
            response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    jsonschema.validate(json.loads(text), schema)
    check(finish == "stop", finish)
    # Plain text is still plain text.
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8,
                                       messages=[{"role": "user", "content": "Say hi."}],
                                       response_format={"type": "text"})
    check(r.choices[0].message.content, "no text")


def test_bad_constraints_are_400(client):
    for rf, why in [
        ({"type": "xml"}, "type"),
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}, "strin"),
        ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name"),
        ("json", "object"),
    ]:
        try:
            client.chat.completions.create(model=MODEL, max_tokens=4, response_format=rf,
                                           messages=[{"role": "user", "content": "x"}])
        except openai.BadRequestError as e:
            body = e.body or {}
            check(body.get("param") == "response_format", body)
            check(why in body.get("message", ""), f"{why!r} not in {body.get('message')!r}")
        else:
            raise AssertionError(f"{rf} was accepted")


def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--all", action="store_true", help="every schema of the suite")
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(ROOT, "target", "test_structured_output.log"), "w")
    proc = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", str(port),
                             "--served-model-name", MODEL, "--no-batch-api"],
                            stdout=log, stderr=subprocess.STDOUT)
    passed = failed = 0
    try:
        wait_ready(base, proc, timeout=300)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=600, max_retries=0)
        tests = [("schema suite", lambda: test_schema_suite(client, args.all)),
                 ("json_object and streaming", lambda: test_json_object_and_streaming(client)),
                 ("bad constraints are 400", lambda: test_bad_constraints_are_400(client))]
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
