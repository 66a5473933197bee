#!/usr/bin/env python3
"""The live SLO page (GET /slo) in headless Chromium, driven by Selenium.

Starts `sloserve serve` with an API key on a free loopback port, starts a Batch API
job, loads the page and checks: it asks for the key (its data route is closed) and
works once given it; both SLO class rows render with numbers; a chat message streams
into the answer token by token, and the browser-measured TTFT and TPOT appear; the
interactive row then shows TTFT percentiles; the batch job shows with its progress.
Saves a screenshot (default target/slo-page.png; `make slo-screenshot` writes docs/images/slo-page.png). Stops the server with SIGTERM
and expects a clean exit.

usage: tests/python/test_slo_page.py [--bin BINARY] [--screenshot PNG]
Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian's chromium, chromium-driver)
and selenium (tests/python/requirements-browser.txt). Ends with
'python: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, json, os, signal, socket, subprocess, sys, tempfile, time, traceback
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KEY = "page-test-key"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")


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


def api(base, path, body=None, content_type="application/json"):
    req = urllib.request.Request(base + path, data=body,
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def start_batch(base, lines=120):
    """A Batch API job of `lines` short chats, so the page has one running."""
    rows = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"Count from {i} to {i + 20}."}],
                      "max_tokens": 48}} for i in range(lines)]
    data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    f = api(base, "/v1/files", body, f"multipart/form-data; boundary={boundary}")
    b = api(base, "/v1/batches", json.dumps({"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                              "completion_window": "24h"}).encode())
    return b["id"]


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def cells(drv, cls):
    """A class row's cell texts, read in one go (the page redraws its rows each poll)."""
    return drv.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), td => td.textContent)",
        f"#class-{cls} td")


def test_asks_for_the_key(drv, base, _batch):
    drv.get(base + "/slo")
    wait = WebDriverWait(drv, 15)
    wait.until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    check("key" in drv.find_element(By.ID, "conn").text.lower(), drv.find_element(By.ID, "conn").text)
    check(not drv.find_elements(By.CSS_SELECTOR, "#class-interactive"), "data shown without a key")
    drv.find_element(By.ID, "key-input").send_keys(KEY + "\n")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#class-interactive"))
    check(not drv.find_element(By.ID, "key-form").is_displayed(), "key form still shown")
    check(drv.execute_script("return sessionStorage.getItem('sloserve-api-key')") == KEY, "key not kept")


def test_class_rows_have_numbers(drv, base, _batch):
    for cls in ("interactive", "batch"):
        c = cells(drv, cls)
        check(len(c) == 12 and c[0] == cls, f"{cls} row: {c}")
        # running, waiting, predicted wait, finished, rejected are numbers
        for i in (6, 7, 10, 11):
            check(c[i].isdigit(), f"{cls} cell {i} is not a number: {c}")
        check(c[8].endswith(" ms") or c[8].endswith(" s"), f"{cls} predicted wait: {c[8]}")
    check(cells(drv, "interactive")[2] == "2000 ms", f"TTFT target: {cells(drv, 'interactive')}")
    check("blocks in use" in drv.find_element(By.ID, "kv").text, drv.find_element(By.ID, "kv").text)


def test_chat_streams_with_ttft(drv, base, _batch):
    # Record the answer's length at each change, to see it grow token by token.
    drv.execute_script("""
        window.growth = [];
        new MutationObserver(() => {
          const all = document.querySelectorAll('.msg.assistant');
          if (all.length) window.growth.push(all[all.length - 1].textContent.length);
        }).observe(document.getElementById('chat-log'),
                   {subtree: true, childList: true, characterData: true});""")
    box = drv.find_element(By.ID, "chat-input")
    box.send_keys("Write four short sentences about the sea.\n")
    wait = WebDriverWait(drv, 120, poll_frequency=0.05)
    timing = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".timing"))
    wait.until(lambda d: "TTFT" in timing.text)
    wait.until(lambda d: timing.get_attribute("data-done") == "1")
    answer = drv.find_element(By.CSS_SELECTOR, ".msg.assistant").text
    growth = [n for n in drv.execute_script("return window.growth") if n > 0]
    check(len(answer) > 10 and "error" not in answer, f"answer: {answer!r}")
    check(len(set(growth)) >= 5, f"the answer did not stream: lengths {growth}")
    check("TTFT" in timing.text and "TPOT" in timing.text and "tokens" in timing.text, timing.text)
    check(timing.text.split("TTFT ")[1][0].isdigit(), timing.text)
    # The server saw it too: the interactive row's TTFT percentiles fill in.
    WebDriverWait(drv, 10).until(lambda d: cells(d, "interactive")[1][0].isdigit())
    check(int(cells(drv, "interactive")[10]) >= 1, f"finished: {cells(drv, 'interactive')}")


def test_batch_job_shows(drv, base, batch):
    wait = WebDriverWait(drv, 30)
    wait.until(lambda d: batch in d.find_element(By.ID, "batch-counts").text
               or batch in d.find_element(By.ID, "batches").text
               or "completed" in d.find_element(By.ID, "batch-counts").text)
    rows = drv.find_element(By.ID, "batches").text
    counts = drv.find_element(By.ID, "batch-counts").text
    check(batch in rows or "1 completed" in counts, f"batch {batch} missing: {rows!r} / {counts!r}")


TESTS = [test_asks_for_the_key, test_class_rows_have_numbers, test_chat_streams_with_ttft,
         test_batch_job_shows]


def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    # docs/images/slo-page.png is written on purpose (make slo-screenshot), never by make test.
    ap.add_argument("--screenshot", default=os.path.join(target, "slo-page.png"))
    args = ap.parse_args()
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not os.access(tool, os.X_OK):
            sys.exit(f"{tool} not found: install Debian's chromium and chromium-driver (make test-browser does)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="sloserve-page-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "--port", str(port), "--api-key", KEY,
           "--data-dir", tempfile.mkdtemp(prefix="sloserve-page-data-"),
           "--max-model-len", "2048", "--kv-cache-memory", "128MiB", "--default-ttft-slo-ms", "2000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    passed, failed, drv = 0, 0, None
    try:
        wait_ready(base, proc)
        batch = start_batch(base)
        drv = browser()
        for t in TESTS:
            t0 = time.time()
            try:
                t(drv, base, batch)
                passed += 1
                print(f"ok   {t.__name__} ({time.time() - t0:.1f}s)")
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}")
                traceback.print_exc()
        time.sleep(1.2)  # one more poll, so the screenshot shows the chat in the table
        os.makedirs(os.path.dirname(args.screenshot), exist_ok=True)
        drv.save_screenshot(args.screenshot)
        print(f"screenshot: {os.path.relpath(args.screenshot, ROOT)}")
        logs = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"
                and "/slo/status" not in e["message"]]  # the 401 before the key is expected
        if logs:
            failed += 1
            print("FAIL browser console errors:", logs)
    finally:
        if drv is not None:
            drv.quit()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed"
        if rc != 0:
            failed += 1
            print(f"FAIL server exit code {rc}")
        if failed:
            print(open(log.name, encoding="utf-8", errors="replace").read()[-3000:])
    print(f"python: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
