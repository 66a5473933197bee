#!/usr/bin/env python3
"""The real `openai` Python SDK against `sloserve serve`, plus the README's curl
examples. Starts the server binary on a free loopback port, waits for /ready, runs
the checks, then stops the server with SIGTERM and expects a clean exit (code 0).

usage: tests/python/test_openai_sdk.py [--bin BINARY] [--readme README.md]
(BINARY defaults to $CARGO_TARGET_DIR/debug/sloserve, CARGO_TARGET_DIR defaulting to target/.)
Ends with a line 'python: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, json, os, re, signal, socket, subprocess, sys, tempfile, time, traceback
import urllib.request

import openai

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = "smol"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, proc, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready in time")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def test_streaming_chat(client, base):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are brief."},
                  {"role": "user", "content": "Name three colours."}],
        max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True})
    roles, text, finish, usage = [], "", None, None
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", chunk.object)
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check(roles == ["assistant"], roles)
    check(text.strip(), "no text streamed")
    check(finish in ("stop", "length"), finish)
    check(usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0, usage)
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage)
    slo = usage.model_extra["sloserve"]
    check(slo["ttft_ms"] > 0 and slo["slo_class"] == "interactive", slo)


def test_completion_and_usage(client, base):
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    check(r.object == "text_completion", r.object)
    check(isinstance(r.choices[0].text, str), r.choices)
    check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    u = r.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8, u)
    slo = u.model_extra["sloserve"]
    for k in ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "cached_prompt_tokens", "preemptions"):
        check(k in slo, (k, slo))
    tok = json.loads(urllib.request.urlopen(urllib.request.Request(
        base + "/tokenize", data=json.dumps({"prompt": "The capital of France is"}).encode(),
        headers={"Content-Type": "application/json"})).read())
    check(tok["count"] == u.prompt_tokens, (tok, u))


def test_chat_with_extra_body(client, base):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=6,
        extra_body={"ignore_eos": True, "slo_class": "batch", "top_k": 20}, seed=3, temperature=0.8)
    check(r.choices[0].message.role == "assistant", r)
    check(r.usage.completion_tokens == 6, r.usage)
    check(r.usage.model_extra["sloserve"]["slo_class"] == "batch", r.usage)


def test_errors_are_openai_errors(client, base):
    try:
        client.completions.create(model=MODEL, prompt="x", temperature=5)
        raise AssertionError("temperature 5 accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, e.status_code)
        check(e.body["param"] == "temperature", e.body)
    try:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", e.body)


def tokenize(base, text):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"prompt": text, "add_special_tokens": False}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["tokens"]


def test_logit_bias_bans_and_forces(client, base):
    prompt = "The capital of France is"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    first = tokenize(base, free.choices[0].text)[0]
    # -100 on the greedy first token: another token comes first.
    banned = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                       logit_bias={str(first): -100})
    check(tokenize(base, banned.choices[0].text)[:1] != [first], (free.choices[0].text, banned.choices[0].text))
    # +100 on one token: every token is that one, even sampled.
    forced_id = tokenize(base, " banana")[0]
    forced = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=1.0, seed=1,
                                       logit_bias={str(forced_id): 100})
    check(tokenize(base, forced.choices[0].text) == [forced_id] * 3, forced.choices[0].text)
    try:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, logit_bias={"99999999": 5})
        raise AssertionError("an id outside the vocabulary was accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "logit_bias", e.body)


def test_n_choices(client, base):
    """n=3: three choices (seed + i each), the prompt counted once, streamed by index."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Name an animal."}],
              max_tokens=6, temperature=1.0, seed=11)
    one = client.chat.completions.create(n=1, **kw)
    r = client.chat.completions.create(n=3, **kw)
    check([c.index for c in r.choices] == [0, 1, 2], r.choices)
    check(all(c.finish_reason in ("stop", "length") for c in r.choices), r.choices)
    check(r.usage.prompt_tokens == one.usage.prompt_tokens, (r.usage, one.usage))
    check(r.usage.completion_tokens <= 18, r.usage)
    roles, finishes = [], []
    for chunk in client.chat.completions.create(n=3, stream=True, **kw):
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.index)
            if ch.finish_reason:
                finishes.append(ch.index)
    check(sorted(roles) == [0, 1, 2] and sorted(finishes) == [0, 1, 2], (roles, finishes))


def test_models_list(client, base):
    ids = [m.id for m in client.models.list()]
    check(ids == [MODEL], ids)


def curl_blocks(readme):
    """Fenced ```sh blocks that follow a `<!-- curl-test -->` marker."""
    text = open(readme, encoding="utf-8").read()
    return re.findall(r"<!-- curl-test -->\s*```sh\n(.*?)```", text, re.S)


def check_curl_output(out):
    out = out.strip()
    check(out, "no output")
    if out.startswith("data:"):
        events = [e for e in out.split("\n\n") if e.strip()]
        check(events[-1].strip() == "data: [DONE]", events[-1])
        for e in events[:-1]:
            check(e.startswith("data: "), e)
            v = json.loads(e[len("data: "):])
            check("error" not in v, v)
    elif out.startswith("#") or out.startswith("sloserve:"):
        check("sloserve:time_to_first_token_seconds" in out, out[:200])
    else:
        v = json.loads(out)
        check("error" not in v, v)


def test_readme_curl_examples(client, base, readme=None):
    blocks = curl_blocks(readme)
    check(len(blocks) >= 3, f"expected curl examples in {readme}, found {len(blocks)}")
    port = base.rsplit(":", 1)[1]
    for block in blocks:
        script = block.replace("localhost:8000", f"127.0.0.1:{port}").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"curl example failed ({r.returncode}): {script}\n{r.stderr}")
        try:
            check_curl_output(r.stdout)
            if "response_format" in block:
                reply = json.loads(json.loads(r.stdout)["choices"][0]["message"]["content"])
                check(reply.get("colour") in ("red", "green", "blue"), reply)
        except Exception as e:
            raise AssertionError(f"bad output of README example:\n{script}\n---\n{r.stdout[:500]}\n{e}")


def main():
    ap = argparse.ArgumentParser()
    target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="sloserve-serve-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "--port", str(port), "--served-model-name", MODEL,
           "--data-dir", tempfile.mkdtemp(prefix="sloserve-sdk-data-"),
           "--max-model-len", "2048", "--kv-cache-memory", "128MiB"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    passed, failed = 0, 0
    try:
        wait_ready(base, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        tests = [test_streaming_chat, test_completion_and_usage, test_chat_with_extra_body,
                 test_errors_are_openai_errors, test_models_list, test_logit_bias_bans_and_forces,
                 test_n_choices, lambda c, b: test_readme_curl_examples(c, b, args.readme)]
        names = ["test_streaming_chat", "test_completion_and_usage", "test_chat_with_extra_body",
                 "test_errors_are_openai_errors", "test_models_list", "test_logit_bias_bans_and_forces",
                 "test_n_choices", "test_readme_curl_examples"]
        for name, t in zip(names, tests):
            try:
                t(client, base)
                passed += 1
                print(f"ok   {name}")
            except Exception:
                failed += 1
                print(f"FAIL {name}")
                traceback.print_exc()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        name = "test_sigterm_exits_0"
        if code == 0:
            passed += 1
            print(f"ok   {name}")
        else:
            failed += 1
            print(f"FAIL {name}: exit code {code}; server log {log.name}")
        if failed:
            print(open(log.name, encoding="utf-8", errors="replace").read()[-4000:])
    print(f"python: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
