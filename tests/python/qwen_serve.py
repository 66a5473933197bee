"""The run of a client suite against `sloserve serve` on Qwen2.5-Coder-0.5B-Instruct:
the flags (--bin, --model), the server on a free loopback port (log in target/),
each test timed and reported, SIGTERM at the end, 'python: N passed, M failed'
and the exit status."""
import argparse, os, signal, subprocess, sys, time, traceback

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, free_port, wait_ready  # noqa: E402

# The name the suites send in `model`.
MODEL = "qwen"


def client(base):
    """The `openai` client the suites use: no retries, a debug build's patience."""
    import openai
    return openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=600, max_retries=0)


def run(suite, make_tests, extra_args=()):
    """Serves the model (with `extra_args` added to `serve`'s flags), runs
    `make_tests(base_url)`'s (name, callable) pairs and exits 1 if any failed.
    `suite` names the server's log file."""
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    log = open(os.path.join(ROOT, "target", f"{suite}.log"), "w")
    proc = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", str(port),
                             "--served-model-name", MODEL, "--no-batch-api", *extra_args],
                            stdout=log, stderr=subprocess.STDOUT)
    passed = failed = 0
    try:
        wait_ready(base, proc, timeout=300)
        for name, t in make_tests(base):
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
