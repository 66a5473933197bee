#!/usr/bin/env python3
"""N-gram speculation, end to end over HTTP: sloserve with it off and on, beside
llama-server without and with its own draftless speculation, on the same GGUF file
and machine, in one sitting.

Workloads (each streamed through /v1/chat/completions, greedy, by this script's own
client):
- edit (c=1): the prompt holds a 60-110-line source file of this repository
  (`scripts/data/spec_edit_files.jsonl`, a snapshot, so the workload does not drift
  with the code) and asks for it back with one change: rename a function, add a doc
  comment, add type hints / an attribute. Little for a model to invent, much to copy:
  what prompt-lookup drafts are for.
- chat (c=1): short questions with nothing to copy (drafts rarely pay: the scheduler
  should leave them out).
- batch16 (c=16, sloserve only): chat prompts, 64 tokens each, EOS ignored: a large
  batch, where the step-time model should switch drafts off.

The figure per request is its decode rate, (completion tokens - 1) / (last token -
first token); a run's figure is the total over its requests (tokens over seconds);
rounds alternate the configurations and the result is each one's median over rounds.

usage: scripts/bench_spec.py [--model FILE] [--rounds 3] [--threads 2]
         [--workloads edit,chat,batch16] [--llama-bin DIR | --no-llama]
         [--llama-spec ngram-simple,ngram-map-k,ngram-mod] [--edit-requests 20] [--only CFG,..]
         [--out target/bench/spec-<stem>.json] [--plot PNG]
       scripts/bench_spec.py --from-json FILE [--plot PNG]
       scripts/bench_spec.py --make-files   (rewrites the snapshot from the working tree)
"""
import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fleet_common import pyplot  # noqa: E402

DEFAULT_MODEL = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
FILES = os.path.join(ROOT, "scripts/data/spec_edit_files.jsonl")
LLAMA_BIN = os.path.expanduser("~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")

# The snapshot's sources: files of 60-110 lines from the crates, tests and scripts.
SNAPSHOT_PATHS = [
    "crates/api/src/tokenize.rs", "crates/batch/src/error.rs", "crates/batch/src/metrics.rs",
    "crates/bench/src/progress.rs", "crates/bench/src/record.rs", "crates/engine/src/cached_index.rs",
    "crates/engine/src/departures.rs", "crates/engine/src/profile.rs", "crates/engine/src/supervisor.rs",
    "crates/grammar/src/formats.rs", "crates/grammar/src/tools.rs", "crates/model/src/detokenizer.rs",
    "crates/model/src/kernels/exp.rs", "crates/model/src/kv_cache.rs", "crates/model/src/llama/mlp.rs",
    "crates/model/src/rope.rs", "crates/router/src/owners.rs", "crates/server/src/chat.rs",
    "crates/server/src/prompt_bound.rs", "crates/slo/src/class.rs", "crates/slo/src/resolve.rs",
    "scripts/callgrind_ops.py", "scripts/fleet_demo.py", "scripts/make_tools_template_reference.py",
]

CHAT = [
    "What is the difference between a process and a thread? Answer briefly.",
    "Give three tips for writing readable commit messages.",
    "Explain what a hash map is to a beginner.",
    "Why might a program run slower on a machine with more cores?",
    "What does the acronym REST stand for and what does it mean?",
    "Suggest a name for a coffee shop run by programmers.",
    "How do I choose between a list and a tuple in Python?",
    "What is tail call optimisation?",
    "Describe the CAP theorem in two sentences.",
    "What are the trade-offs of using an ORM?",
    "Write a haiku about compilers.",
    "When should I use a mutex instead of an atomic?",
    "What is the purpose of a load balancer?",
    "Explain big-O notation with an everyday example.",
    "What is a memory leak, and how can one happen in a garbage-collected language?",
    "Why are floating point numbers not exact?",
    "What is the difference between TCP and UDP?",
    "Give a short definition of technical debt.",
    "How does public key cryptography let two strangers agree on a secret?",
    "What makes a good unit test?",
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- the workload --------------------------------------------------------------------------

def make_files():
    rows = []
    for p in SNAPSHOT_PATHS:
        with open(os.path.join(ROOT, p)) as f:
            rows.append({"path": p, "text": f.read()})
    os.makedirs(os.path.dirname(FILES), exist_ok=True)
    with open(FILES, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    log(f"wrote {len(rows)} files to {FILES}")


def edit_instruction(path, text, i):
    """One change to ask for, on the file's first function (cycling the kind)."""
    py = path.endswith(".py")
    m = re.search(r"^\s*def (\w+)" if py else r"^\s*(?:pub(?:\([a-z]+\))? )?fn (\w+)", text, re.M)
    name = m.group(1) if m else None
    lang = "python" if py else "rust"
    if name is None:
        return lang, "Add a one-line comment at the top of this file saying what it is for."
    kinds = [
        f"Rename the function `{name}` to `{name}_v2` everywhere in this file.",
        f"Add a one-line {'docstring' if py else 'doc comment'} to the function `{name}`.",
        f"Add type hints to the parameters and the return value of `{name}`." if py
        else f"Add `#[inline]` above the function `{name}`.",
    ]
    return lang, kinds[i % len(kinds)]


def edit_requests(n, max_tokens):
    with open(FILES) as f:
        files = [json.loads(l) for l in f if l.strip()]
    out = []
    for i in range(n):
        row = files[i % len(files)]
        lang, ask = edit_instruction(row["path"], row["text"], i + i // len(files))
        content = (f"{ask} Reply with the whole updated file in one code block and nothing else."
                   f"\n\n```{lang}\n{row['text']}```")
        out.append({"id": f"{row['path']}#{i}", "messages": [{"role": "user", "content": content}],
                    "max_tokens": max_tokens})
    return out


def chat_requests(n, max_tokens, ignore_eos=False):
    return [{"id": f"chat#{i}", "messages": [{"role": "user", "content": CHAT[i % len(CHAT)]}],
             "max_tokens": max_tokens, "ignore_eos": ignore_eos} for i in range(n)]


# --- the client ----------------------------------------------------------------------------

def stream_chat(port, body, rid, headers=None):
    """POSTs one streamed chat completion; returns (t0, [(time, content piece)], completion
    tokens) with perf_counter times. Exits on an HTTP error or a reply with no tokens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"request {rid}: HTTP {resp.status}: {resp.read()[:300]!r}")
    pieces, n_out = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        ev = json.loads(payload)
        if ev.get("usage"):
            n_out = ev["usage"].get("completion_tokens")
        if ev.get("timings") and n_out is None:
            n_out = ev["timings"].get("predicted_n")
        for ch in ev.get("choices") or []:
            t = (ch.get("delta") or {}).get("content")
            if t:
                pieces.append((time.perf_counter(), t))
    conn.close()
    if not pieces or not n_out:
        raise SystemExit(f"request {rid}: no tokens")
    return t0, pieces, n_out


def one(port, model, req):
    body = {"model": model, "messages": req["messages"], "max_tokens": req["max_tokens"],
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if req.get("ignore_eos"):
        body["ignore_eos"] = True
    t0, pieces, n_out = stream_chat(port, body, req["id"])
    first, last = pieces[0][0], pieces[-1][0]
    return {"id": req["id"], "ttft": first - t0, "decode_s": last - first, "tokens": n_out,
            "e2e": last - t0, "text": "".join(t for _, t in pieces)}


def run_load(port, model, reqs, concurrency):
    t0 = time.perf_counter()
    done = [0]
    lock = threading.Lock()

    def go(r):
        res = one(port, model, r)
        with lock:
            done[0] += 1
            if done[0] % max(1, len(reqs) // 5) == 0 or done[0] == len(reqs):
                log(f"    {done[0]}/{len(reqs)} ({time.perf_counter() - t0:.0f} s)")
        return res

    with ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(go, reqs))
    wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in res)
    dec = sum(r["tokens"] - 1 for r in res) / max(1e-9, sum(r["decode_s"] for r in res))
    return {"decode_tok_s": dec, "output_tok_s": toks / wall, "tokens": toks, "wall_s": wall,
            "ttft_p50": statistics.median(r["ttft"] for r in res),
            "per_request_tok_s": [(r["tokens"] - 1) / max(1e-9, r["decode_s"]) for r in res],
            "texts": [r["text"] for r in res]}


# --- the servers ---------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, path):
    t0 = time.time()
    while time.time() - t0 < 300:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except Exception:
            pass
        time.sleep(0.3)
    raise SystemExit("server not ready after 300 s")


class Server:
    def __init__(self, cmd, env, ready_path, log_path):
        self.port = free_port()
        cmd = [c.replace("{port}", str(self.port)) for c in cmd]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, **env), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.ready_s = wait_ready(self.port, self.proc, ready_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5) as r:
            self.model = json.load(r)["data"][0]["id"]

    def metrics(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                return r.read().decode()
        except Exception:
            return ""

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def configs(args):
    model, t = args.model, str(args.threads)
    ctx = "8192"
    out = {
        "sloserve": (["target/release/sloserve", "serve", "--model", model, "--port", "{port}",
                      "--threads", t, "--spec-max-draft", "0"], {}, "/ready"),
        "sloserve+spec": (["target/release/sloserve", "serve", "--model", model, "--port", "{port}",
                           "--threads", t], {}, "/ready"),
    }
    if args.llama_bin:
        base = [f"{args.llama_bin}/llama-server", "-m", model, "--port", "{port}", "-t", t,
                "-c", ctx, "-np", "1", "--no-webui"]
        env = {"LD_LIBRARY_PATH": args.llama_bin}
        out["llama-server"] = (base, env, "/health")
        for s in args.llama_spec.split(","):
            if s:
                out[f"llama-server+{s}"] = (base + ["--spec-type", s], env, "/health")
    return out


def spec_counters(metrics):
    got = {}
    for line in metrics.splitlines():
        m = re.match(r'sloserve:spec_decode_num_(\w+)_total\{.*slo_class="interactive"\} (\S+)', line)
        if m:
            got[m.group(1)] = float(m.group(2))
        m = re.match(r"sloserve:(engine_steps|generation_tokens)_total\{[^}]*\} (\S+)", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got


def workload(name, args):
    if name == "edit":
        return edit_requests(args.edit_requests, args.edit_max_tokens), 1
    if name == "chat":
        return chat_requests(20, 128), 1
    if name == "batch16":
        return chat_requests(32, 64, ignore_eos=True), 16
    raise SystemExit(f"unknown workload {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="edit,chat,batch16")
    ap.add_argument("--edit-requests", type=int, default=20)
    ap.add_argument("--edit-max-tokens", type=int, default=256)
    ap.add_argument("--llama-bin", default=LLAMA_BIN if os.path.exists(LLAMA_BIN) else None)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-spec", default="ngram-simple,ngram-map-k,ngram-mod")
    ap.add_argument("--only", help="comma-separated configurations to run (default: all)")
    ap.add_argument("--out")
    ap.add_argument("--plot")
    ap.add_argument("--from-json")
    ap.add_argument("--make-files", action="store_true")
    args = ap.parse_args()
    if args.make_files:
        return make_files()
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        if args.no_llama:
            args.llama_bin = None
        result = measure(args)
        stem = os.path.splitext(os.path.basename(args.model))[0]
        out = args.out or os.path.join(ROOT, f"target/bench/spec-{stem}.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {out}")
    table(result)
    if args.plot:
        plot(result, args.plot)


def measure(args):
    cfgs = configs(args)
    if args.only:
        cfgs = {c: v for c, v in cfgs.items() if c in args.only.split(",")}
    names = args.workloads.split(",")
    runs = {w: {c: [] for c in cfgs} for w in names}
    counters = {w: {c: [] for c in cfgs} for w in names}
    logs = os.path.join(ROOT, "target/bench/spec-logs")
    os.makedirs(logs, exist_ok=True)
    for r in range(args.rounds):
        for c, (cmd, env, ready) in cfgs.items():
            todo = [w for w in names if not (w == "batch16" and not c.startswith("sloserve"))]
            if not todo:
                continue
            log(f"round {r + 1}/{args.rounds}: {c} (load {load()})")
            srv = Server(cmd, env, ready, os.path.join(logs, f"{c}.log"))
            try:
                for w in todo:
                    reqs, conc = workload(w, args)
                    before = spec_counters(srv.metrics())
                    res = run_load(srv.port, srv.model, reqs, conc)
                    after = spec_counters(srv.metrics())
                    res["counters"] = {k: after[k] - before.get(k, 0) for k in after}
                    res["load"] = load()
                    res["ready_s"] = srv.ready_s
                    log(f"  {w}: {res['decode_tok_s']:.1f} tok/s decode, {res['output_tok_s']:.1f} out,"
                        f" ttft p50 {res['ttft_p50']:.2f} s {res['counters'] or ''}")
                    runs[w][c].append(res)
            finally:
                srv.stop()
    return {"model": args.model, "threads": args.threads, "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip(),
            "cpu": cpu(), "edit_requests": args.edit_requests, "edit_max_tokens": args.edit_max_tokens,
            "runs": runs}


def cpu():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    name = re.search(r"model name\s*:\s*(.*)", info)
    flags = re.search(r"flags\s*:\s*(.*)", info).group(1).split()
    isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2"
    return f"{name.group(1) if name else '?'}, {os.cpu_count()} cores, {isa}"


def medians(result):
    """{workload: {config: (median decode tok/s, per-round list, acceptance)}}"""
    out = {}
    for w, by in result["runs"].items():
        out[w] = {}
        for c, rs in by.items():
            if not rs:
                continue
            dec = [r["decode_tok_s"] for r in rs]
            key = "output_tok_s" if w == "batch16" else "decode_tok_s"
            vals = [r[key] for r in rs]
            acc = None
            cs = [r.get("counters") or {} for r in rs]
            drafted = sum(x.get("draft_tokens", 0) for x in cs)
            if drafted:
                acc = sum(x.get("accepted_tokens", 0) for x in cs) / drafted
            steps = sum(x.get("engine_steps", 0) for x in cs)
            tps = sum(x.get("generation_tokens", 0) for x in cs) / steps if steps else None
            out[w][c] = {"median": statistics.median(vals), "rounds": vals, "acceptance": acc,
                         "tokens_per_step": tps, "decode_median": statistics.median(dec)}
    return out


def table(result):
    print(f"model {result['model']}, {result['threads']} threads, {result['cpu']}, {result['date']},"
          f" commit {result['commit']}, medians of {result['rounds']} rounds")
    for w, by in medians(result).items():
        unit = "output tok/s (c=16)" if w == "batch16" else "decode tok/s (c=1)"
        base = by.get("sloserve", {}).get("median")
        llama = by.get("llama-server", {}).get("median")
        print(f"\n{w}: {unit}")
        print(f"{'config':26} {'median':>8} {'vs sloserve':>12} {'vs llama':>9} {'accept':>7} {'tok/step':>8}  rounds")
        for c, m in by.items():
            rel = f"{m['median'] / base:.2f}x" if base else ""
            rl = f"{m['median'] / llama:.2f}x" if llama else ""
            acc = f"{m['acceptance']:.2f}" if m["acceptance"] is not None else ""
            tps = f"{m['tokens_per_step']:.2f}" if m["tokens_per_step"] else ""
            rounds = " ".join(f"{v:.1f}" for v in m["rounds"])
            print(f"{c:26} {m['median']:8.1f} {rel:>12} {rl:>9} {acc:>7} {tps:>8}  {rounds}")


def plot(result, path):
    plt = pyplot()
    if plt is None:
        return
    meds = medians(result)
    fig, axes = plt.subplots(1, len(meds), figsize=(4.5 * len(meds), 4))
    if len(meds) == 1:
        axes = [axes]
    for ax, (w, by) in zip(axes, meds.items()):
        names = list(by)
        vals = [by[c]["median"] for c in names]
        colors = ["tab:blue" if c.startswith("sloserve") else "tab:gray" for c in names]
        ax.bar(range(len(names)), vals, color=colors)
        for i, c in enumerate(names):
            ax.plot([i] * len(by[c]["rounds"]), by[c]["rounds"], "k.", ms=4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{w} ({'output tok/s, c=16' if w == 'batch16' else 'decode tok/s, c=1'})")
    fig.suptitle(f"{os.path.basename(result['model'])}: n-gram speculation ({result['cpu']}, {result['date']})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
