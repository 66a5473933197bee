"""Helpers for tests/gateway: starting and stopping the deploy/local stack, reading a
replica's /metrics, and the three request kinds sent through Envoy with the openai SDK."""

import json
import os
import random
import subprocess
import sys
import time
import urllib.request

import openai

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GATEWAY = os.path.join(ROOT, "deploy", "local", "gateway.py")


def stack_up(bin_path, model, run_dir, mode, extra=()):
    """`gateway.py up` on a random base port (tried again on a port clash); the stack's
    stack.json as a dict."""
    for attempt in range(5):
        base = random.randrange(20000, 40000, 100)
        cmd = [sys.executable, GATEWAY, "up", "--bin", bin_path, "--model", model, "--run-dir", run_dir,
               "--base-port", str(base), "--mode", mode, *extra]
        r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode == 0:
            with open(os.path.join(run_dir, "stack.json")) as f:
                return json.load(f)
        if "ports in use" not in r.stderr:
            raise RuntimeError(f"gateway.py up failed (exit {r.returncode}); logs in {run_dir}/logs")
    raise RuntimeError("no free base port in 5 tries")


def stack_down(run_dir):
    subprocess.run([sys.executable, GATEWAY, "down", "--run-dir", run_dir], check=True)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def metrics(port, timeout=5):
    """The replica's /metrics as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def family_sum(m, name):
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def served(port):
    """Requests the replica finished, any class and reason."""
    return family_sum(metrics(port), "sloserve:request_success_total")


def wait_idle(ports, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if all(family_sum(metrics(p), "vllm:num_requests_running") == 0
               and family_sum(metrics(p), "vllm:num_requests_waiting") == 0 for p in ports):
            return
        time.sleep(0.2)
    raise AssertionError(f"replicas not idle after {timeout} s")


def client(stack, timeout=60.0, retries=0):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{stack['ports']['envoy']}/v1", api_key="none",
                         timeout=timeout, max_retries=retries)


def chat(c, model, text, max_tokens=12, **kw):
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                  max_tokens=max_tokens, temperature=0, **kw)
    assert r.choices and r.choices[0].message.content, r
    assert r.usage.completion_tokens > 0, r.usage
    return r


def chat_stream(c, model, text, max_tokens=12, **kw):
    stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                       max_tokens=max_tokens, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, **kw)
    content, finish, usage = "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert content and finish in ("stop", "length"), (content, finish)
    assert usage is not None and usage.completion_tokens > 0, usage
    return content


def completion(c, model, text, max_tokens=12, **kw):
    r = c.completions.create(model=model, prompt=text, max_tokens=max_tokens, temperature=0, **kw)
    assert r.choices and r.choices[0].text, r
    return r


KINDS = (chat, chat_stream, completion)


def access_log(run_dir):
    """Envoy's access log lines as (unix time, path, status, picked endpoint)."""
    from datetime import datetime
    rows = []
    with open(os.path.join(run_dir, "logs", "envoy-access.log")) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6:
                continue
            t = datetime.strptime(parts[0].replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
            picked = next((p[len("picked="):] for p in parts if p.startswith("picked=")), "-")
            rows.append((t, parts[2], parts[3], picked))
    return rows
