#!/usr/bin/env python3
"""Structured output end to end (issue #32): the decode rate of json_schema requests
against the same requests unconstrained, at batch 1 and 8, and a constrained
interactive stream beside a batch-class flood, over HTTP on one `sloserve serve`.

Requests: for each of 8 schemas of the suite (crates/grammar/tests/schemas) a chat
prompt asking for one JSON document about a topic; greedy, repetition_penalty 1.1,
max_tokens 128. "constrained" sends it with response_format json_schema (strict);
"unconstrained" sends the same messages without it (the model writes JSON of its own
shape, or prose). Configurations:
- sloserve: the defaults (grammar fast-forward on, 16 forced tokens);
- sloserve-ff0: `--grammar-max-forced 0` (every token a step: the mask's own cost).

Workloads:
- b1: the 8 requests one after another;
- b8: 16 requests, 8 at a time;
- flood: one interactive stream (the 8 requests in turn) beside 4 batch-class
  streams (`x-slo-class: batch`, 96 tokens each, EOS ignored) for as long as the
  stream runs; the stream's TPOT p50/p95 is the figure.

Constrained replies are parsed and validated against their schema (with `jsonschema`, as
in .venv). A request's decode rate is (completion tokens - 1) / (last chunk - first chunk); a run's
is the total over its requests. Rounds alternate the configurations; each figure is
the median over rounds.

usage: scripts/bench_structured.py [--model FILE] [--rounds 3] [--threads 2]
         [--workloads b1,b8,flood] [--out target/bench/structured-<stem>.json]
       scripts/bench_structured.py --from-json FILE
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from bench_spec import Server, cpu, load, log, stream_chat  # noqa: E402

try:  # the test venv has it (.venv/bin/python); without it replies are only parsed
    import jsonschema
except ImportError:
    jsonschema = None

DEFAULT_MODEL = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SCHEMAS = os.path.join(ROOT, "crates/grammar/tests/schemas")
# (schema file stem, what the document is about)
CASES = [
    ("03_nested_objects", "a customer with their shipping address"),
    ("05_array_min_max_items", "a short shopping list"),
    ("10_anyof_objects", "a payment made by card"),
    ("14_format_date_time", "a meeting on the team calendar"),
    ("23_array_of_objects", "three books on a reading list"),
    ("28_deep_nesting", "a small company's organisation"),
    ("31_openai_strict_style", "how to compute 17 * 23 step by step"),
    ("32_weather_tool_args", "the weather query for Lisbon"),
]


def requests():
    out = []
    for stem, topic in CASES:
        with open(os.path.join(SCHEMAS, stem + ".json")) as f:
            schema = json.load(f)
        prompt = (f"Write one JSON document about {topic}. It must follow this JSON schema:\n"
                  f"{json.dumps(schema)}\nReply with the JSON only.")
        out.append({"id": stem, "schema": schema,
                    "messages": [{"role": "user", "content": prompt}]})
    return out


def one(port, model, req, constrained, extra_headers=None, max_tokens=128, ignore_eos=False):
    body = {"model": model, "messages": req["messages"], "max_tokens": max_tokens,
            "temperature": 0.0, "repetition_penalty": 1.1, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "doc", "schema": req["schema"], "strict": True}}
    t0, pieces, n_out = stream_chat(port, body, req["id"], extra_headers)
    first, last = pieces[0][0], pieces[-1][0]
    text = "".join(t for _, t in pieces)
    valid = None
    if constrained:
        try:
            doc = json.loads(text)
            valid = True
            if jsonschema is not None:
                jsonschema.validate(doc, req["schema"],
                                    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError if jsonschema else ValueError):
            valid = False
    return {"id": req["id"], "ttft": first - t0, "decode_s": last - first, "tokens": n_out,
            "valid": valid, "tpot": (last - first) / max(1, n_out - 1), "text": text}


def summarize(res, wall):
    toks = sum(r["tokens"] for r in res)
    return {"decode_tok_s": sum(r["tokens"] - 1 for r in res) / max(1e-9, sum(r["decode_s"] for r in res)),
            "output_tok_s": toks / wall, "tokens": toks, "wall_s": wall,
            "ttft_p50": statistics.median(r["ttft"] for r in res),
            "tpot_p50": statistics.median(r["tpot"] for r in res),
            "tpot_p95": sorted(r["tpot"] for r in res)[int(0.95 * (len(res) - 1))],
            "valid": [r["valid"] for r in res if r["valid"] is not None],
            "texts": [r["text"] for r in res]}


def run_batch(srv, reqs, constrained, conc):
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as ex:
        res = list(ex.map(lambda r: one(srv.port, srv.model, r, constrained), reqs))
    return summarize(res, time.perf_counter() - t0)


def run_flood(srv, reqs, constrained, flood_streams=4):
    """The interactive requests in turn, beside `flood_streams` batch-class streams."""
    stop = threading.Event()
    flood_tokens = [0]
    lock = threading.Lock()

    def flood(i):
        while not stop.is_set():
            r = one(srv.port, srv.model, reqs[i % len(reqs)], False,
                    {"x-slo-class": "batch"}, max_tokens=96, ignore_eos=True)
            with lock:
                flood_tokens[0] += r["tokens"]

    with ThreadPoolExecutor(flood_streams) as ex:
        fs = [ex.submit(flood, i) for i in range(flood_streams)]
        time.sleep(3)  # the flood is running before the stream starts
        t0 = time.perf_counter()
        res = [one(srv.port, srv.model, r, constrained) for r in reqs]
        wall = time.perf_counter() - t0
        stop.set()
        for f in fs:
            f.result()
    out = summarize(res, wall)
    out["flood_tok_s"] = flood_tokens[0] / wall
    return out


def configs(args):
    base = ["target/release/sloserve", "serve", "--model", args.model, "--port", "{port}",
            "--threads", str(args.threads)]
    return {"sloserve": base, "sloserve-ff0": base + ["--grammar-max-forced", "0"]}


def measure(args):
    reqs = requests()
    names = args.workloads.split(",")
    cfgs = configs(args)
    runs = {w: {} for w in names}
    logs = os.path.join(ROOT, "target/bench/structured-logs")
    os.makedirs(logs, exist_ok=True)
    for rnd in range(args.rounds):
        for c, cmd in cfgs.items():
            log(f"round {rnd + 1}/{args.rounds}: {c} (load {load()})")
            srv = Server(cmd, {}, "/ready", os.path.join(logs, f"{c}.log"))
            try:
                # The grammar engine is built on the first constrained request: warm it.
                one(srv.port, srv.model, reqs[0], True, max_tokens=4)
                for w in names:
                    # ff0 differs only for constrained requests.
                    for constrained in ([True] if c == "sloserve-ff0" else [False, True]):
                        key = f"{c}/{'json_schema' if constrained else 'unconstrained'}"
                        if w == "b1":
                            res = run_batch(srv, reqs, constrained, 1)
                        elif w == "b8":
                            res = run_batch(srv, reqs + reqs, constrained, 8)
                        elif w == "flood":
                            res = run_flood(srv, reqs, constrained)
                        else:
                            raise SystemExit(f"unknown workload {w}")
                        res["load"] = load()
                        runs[w].setdefault(key, []).append(res)
                        bad = res["valid"].count(False)
                        log(f"  {w} {key}: decode {res['decode_tok_s']:.1f} tok/s, out {res['output_tok_s']:.1f},"
                            f" tpot p50 {res['tpot_p50'] * 1e3:.0f} ms"
                            + (f", flood {res['flood_tok_s']:.1f} tok/s" if "flood_tok_s" in res else "")
                            + (f", {bad} INVALID" if bad else ""))
            finally:
                srv.stop()
    return {"model": args.model, "threads": args.threads, "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip(),
            "cpu": cpu(), "runs": runs}


def table(result):
    print(f"model {result['model']}, {result['threads']} threads, {result['cpu']}, {result['date']},"
          f" commit {result['commit']}, medians of {result['rounds']} rounds")
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    for w, by in result["runs"].items():
        print(f"\n{w}: decode tok/s per stream (ratio to unconstrained), output tok/s, TPOT p50 / p95 ms"
              f"{', batch flood tok/s' if w == 'flood' else ''}, schema-valid replies")
        base = by.get("sloserve/unconstrained")
        for k, rs in by.items():
            m = med(rs, "decode_tok_s")
            ratio = f"{m / med(base, 'decode_tok_s'):.2f}x" if base else "-"
            valid = [v for r in rs for v in r["valid"]]
            line = (f"  {k:<28} {m:6.1f} ({ratio})  out {med(rs, 'output_tok_s'):5.1f}"
                    f"  TPOT {med(rs, 'tpot_p50') * 1e3:4.0f} / {med(rs, 'tpot_p95') * 1e3:4.0f}")
            if w == "flood":
                line += f"  flood {med(rs, 'flood_tok_s'):5.1f}"
            if valid:
                line += f"  valid {sum(valid)}/{len(valid)}"
            rounds = ", ".join(f"{r['decode_tok_s']:.1f}" for r in rs)
            print(line + f"  rounds {rounds}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="b1,b8,flood")
    ap.add_argument("--out")
    ap.add_argument("--from-json")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        result = measure(args)
        stem = os.path.splitext(os.path.basename(args.model))[0]
        out = args.out or os.path.join(ROOT, f"target/bench/structured-{stem}.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {out}")
    table(result)


if __name__ == "__main__":
    main()
