#!/usr/bin/env python3
"""Records llama.cpp's tokenization and greedy continuations (top-5 logprobs every step) on
Qwen2.5-Coder-0.5B-Instruct, from the F32 file (the exact reference) and from the Q4_K_M file as
shipped (llama.cpp's fast path). Standard library only; run by scripts/make-qwen-reference.sh,
which builds llama.cpp and makes the F32 file. Talks to llama-server on 127.0.0.1 only."""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

# Texts for /tokenize: code, unicode, whitespace runs, digits, the chat control tokens.
TOKENIZE_TEXTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "const x = await fetch(`/api/v1/items?id=${id}&q=${encodeURIComponent(q)}`);",
    "<div class=\"row\"><span id='a'>&nbsp;&lt;b&gt;</span></div>",
    "1234567890 3.14159 -2.5e-10 0xDEADBEEF 1,000,000 2024-06-01T12:34:56Z",
    "12345678901234567890123456789",
    "    four spaces\n\ttab\n\t\t two tabs\n        eight spaces",
    "a  b   c    d     e      f       g\n\n\n\nend",
    "trailing spaces   \n   \n\n \t \n",
    "   leading and trailing   ",
    "\n",
    " ",
    "",
    "naïve café résumé façade Ångström Zürich",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 🦀🐍🚀 👨‍👩‍👧‍👦 ✅ ❤️ 🇫🇷",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी",
    "mathematics: ∀x ∈ ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2 ≠ ∞",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
    "<|repo_name|>sloserve<|file_sep|>src/main.rs\nfn main() {}",
    "<|im_start|><|im_end|><|im_start|>",
    "not special: <|im_start and im_end|> <| |>",
    "I'm sure they're right, we've seen it, you'll see, he'd know, it's THEIR'S",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "// TODO(alice): fix this!!! ??? ... --- === +++ *** ###",
    "https://example.com/path/to/file.tar.gz?x=1#frag user@example.org",
]

SYSTEM = "You are a helpful coding assistant. Answer briefly."

# (id, kind, input, n_predict): completion prompts are text; chat prompts are message lists.
SHORT_PROMPTS = [
    ("s1", "completion", "def quicksort(arr):\n", 32),
    ("s2", "completion", "The capital of France is", 32),
    ("s3", "chat", [{"role": "user", "content": "Write a Python function that reverses a string."}], 32),
    ("s4", "completion", "// Rust: sum of the squares of a slice\nfn sum_squares(xs: &[i64]) -> i64 {\n", 32),
    ("s5", "chat", [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "What does `git rebase -i HEAD~3` do?"}], 32),
    ("s6", "completion", "Ünïcödé and 日本語: 1 2 3 4 5 6 7 8 9", 32),
    ("s7", "chat", [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Hello! How can I help you today?"},
                    {"role": "user", "content": "Give me a SQL query that counts rows in a table named users."}], 32),
]


def long_prompt(src_root):
    """A chat prompt over 2,000 tokens: a slice of llama.cpp's own sampler source (the vendored
    copy of the version built, so the text is fixed) with a question."""
    path = os.path.join(src_root, "src", "llama-sampler.cpp")
    with open(path, encoding="utf-8") as f:
        code = f.read()[:7800]
    question = "Here is some C++ code:\n\n```cpp\n" + code + "\n```\n\nWhat does the first function in this code do?"
    return ("l1", "chat", [{"role": "user", "content": question}], 16)


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bin_dir, model, extra):
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-t", "2", "-np", "1", "-c", "4096"] + extra
    print("+", " ".join(cmd), file=sys.stderr)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open("/tmp/qwen-ref-server.log", "w"))
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}); see /tmp/qwen-ref-server.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(1)
    proc.kill()
    sys.exit("llama-server did not become healthy in 300 s")


def tokenize(port, text, add_special):
    return post(port, "/tokenize", {"content": text, "add_special": add_special, "parse_special": True})["tokens"]


def greedy_record(port, pid, kind, inp, n_predict):
    if kind == "chat":
        rendered = post(port, "/apply-template", {"messages": inp})["prompt"]
    else:
        rendered = inp
    ids = tokenize(port, rendered, True)
    out = post(port, "/completion", {
        "prompt": ids, "n_predict": n_predict, "temperature": 0, "n_probs": 5,
        "post_sampling_probs": False, "cache_prompt": False, "seed": 0,
    })
    probs = out["completion_probabilities"]
    assert out["tokens_evaluated"] == len(ids), (pid, out["tokens_evaluated"], len(ids))
    return {
        "id": pid, "kind": kind, "input": inp, "rendered_prompt": rendered,
        "prompt_token_ids": ids,
        "greedy_token_ids": [p["id"] for p in probs],
        "greedy_text": out["content"],
        "stop_type": out["stop_type"],
        "top5_logprobs_per_step": [
            [{"id": t["id"], "piece": t["token"], "logprob": t["logprob"]} for t in p["top_logprobs"]]
            for p in probs
        ],
    }


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(records)} records)", file=sys.stderr)


def compare(exact, fast):
    """What llama.cpp's own Q4_K_M path differs by against the exact records."""
    argmax_equal, errs, agree = 0, [], []
    for e, f in zip(exact, fast):
        assert e["id"] == f["id"]
        argmax_equal += e["greedy_token_ids"][0] == f["greedy_token_ids"][0]
        theirs = {t["id"]: t["logprob"] for t in f["top5_logprobs_per_step"][0]}
        errs.append(max((abs(theirs[t["id"]] - t["logprob"]) for t in e["top5_logprobs_per_step"][0]
                         if t["id"] in theirs), default=0.0))
        n = 0
        for a, b in zip(e["greedy_token_ids"], f["greedy_token_ids"]):
            if a != b:
                break
            n += 1
        agree.append(n)
    return {"step0_argmax_equal": f"{argmax_equal}/{len(exact)}", "mean_max_top5_diff": sum(errs) / len(errs),
            "max_top5_diff_per_prompt": [round(x, 4) for x in errs], "greedy_agreement_lengths": agree}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="llama.cpp's bin folder")
    ap.add_argument("--src", required=True, help="llama.cpp's source root (for the long prompt's text)")
    ap.add_argument("--q4", required=True)
    ap.add_argument("--f32", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    prompts = SHORT_PROMPTS + [long_prompt(args.src)]
    runs = [("f32", args.f32, ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]), ("q4_k_m", args.q4, [])]
    results = {}
    for name, model, extra in runs:
        proc, port = start_server(args.bin, model, extra)
        try:
            if name == "f32":
                toks = [{"text": t, "token_ids": tokenize(port, t, False)} for t in TOKENIZE_TEXTS]
                write_jsonl(os.path.join(args.out, "llamacpp-tokenize-qwen0.5b.jsonl"), toks)
            recs = []
            for pid, kind, inp, n in prompts:
                t0 = time.time()
                recs.append(greedy_record(port, pid, kind, inp, n))
                print(f"{name} {pid}: {len(recs[-1]['prompt_token_ids'])} prompt tokens, "
                      f"{len(recs[-1]['greedy_token_ids'])} generated, {time.time() - t0:.1f} s", file=sys.stderr)
            assert max(len(r["prompt_token_ids"]) for r in recs) > 2000
            write_jsonl(os.path.join(args.out, f"llamacpp-{name}-greedy-qwen0.5b.jsonl"), recs)
            results[name] = recs
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps(compare(results["f32"], results["q4_k_m"]), indent=1))


if __name__ == "__main__":
    main()
