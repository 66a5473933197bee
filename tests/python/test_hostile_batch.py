#!/usr/bin/env python3
"""The Batch API against a hostile second tenant (issue 30): `sloserve serve` with
three API keys and --prefix-cache-scope per-key, driven through the real `openai`
SDK and raw HTTP on loopback. Each attack is bounded in seconds:

- key B gets 404 on key A's file (retrieve, content, delete), batch (retrieve,
  cancel) and on a batch over A's file, and sees none of A's objects in lists;
- key B sending A's batch prompt gets cached_tokens 0 (A itself gets a hit, so
  the batch line really ran under A's cache scope);
- a line over --max-body-bytes fails validation with its line number;
- a row that does not decode does not make the listings fail;
- the per-key upload quota refuses with 413 quota_exceeded.

usage: tests/python/test_hostile_batch.py [--bin BINARY]
Ends with a line 'python hostile batch: N passed, M failed'; exits non-zero on any failure.
"""
import argparse, io, json, os, sqlite3, sys, tempfile, time, traceback
import urllib.error, urllib.request

import openai

sys.path.insert(0, os.path.dirname(__file__))
from test_openai_sdk import ROOT, check  # noqa: E402
from test_batch_api import MODEL, SERVE_FLAGS, Server, chat_line, jsonl, wait_batch  # noqa: E402

KEYS = {"a": "sk-hostile-alice-0123456789", "b": "sk-hostile-bob-0123456789",
        "c": "sk-hostile-carol-0123456789"}
MAX_BODY = 64 << 10
QUOTA = 200_000
# About 200 tokens: many cache blocks, so a shared cache would show.
SECRET = " ".join(f"alice's private record {i} says the vault code is {i * 7919 % 10007}."
                  for i in range(16))


def client(srv, who):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=KEYS[who], max_retries=0, timeout=60)


def raw(srv, method, path, who=None, body=None):
    """(status, parsed JSON or text) of one request with `who`'s key."""
    headers = {"content-type": "application/json"}
    if who:
        headers["authorization"] = f"Bearer {KEYS[who]}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def upload(c, lines, name="in.jsonl"):
    return c.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="batch")


def expect_404(what, fn):
    try:
        fn()
    except openai.NotFoundError:
        return
    except openai.APIStatusError as e:
        raise AssertionError(f"{what}: status {e.status_code}, not 404: {e.response.text}")
    raise AssertionError(f"{what}: succeeded for another key")


class State:
    """A's objects, made once by the first test."""
    file = batch = output = None


def test_a_batch_runs_and_b_cannot_reach_it(srv):
    a, b = client(srv, "a"), client(srv, "b")
    f = upload(a, [chat_line("secret", SECRET, max_tokens=1)])
    bt = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_batch(a, bt.id, timeout=60)
    check(done.status == "completed" and done.output_file_id, f"A's batch: {done}")
    State.file, State.batch, State.output = f.id, bt.id, done.output_file_id
    for oid in (f.id, done.output_file_id):
        expect_404(f"B retrieves file {oid}", lambda: b.files.retrieve(oid))
        expect_404(f"B downloads file {oid}", lambda: b.files.content(oid))
        expect_404(f"B deletes file {oid}", lambda: b.files.delete(oid))
    expect_404("B retrieves A's batch", lambda: b.batches.retrieve(bt.id))
    expect_404("B cancels A's batch", lambda: b.batches.cancel(bt.id))
    expect_404("B starts a batch on A's file", lambda: b.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"))
    mine = {x.id for x in b.files.list()} | {x.id for x in b.batches.list()}
    theirs = {f.id, done.output_file_id, bt.id}
    check(not (mine & theirs), f"B lists A's objects: {mine & theirs}")
    # Paging from A's id is no cursor for B (it would confirm the id exists).
    status, _ = raw(srv, "GET", f"/v1/batches?after={bt.id}", "b")
    check(status == 400, f"B paging after A's batch id: {status}")
    # Nothing of A's was touched, and A sees all of it; no key at all is a 401.
    check(a.batches.retrieve(bt.id).status == "completed", "A's batch changed")
    check("secret" in a.files.content(done.output_file_id).text, "A's output is gone")
    check({f.id, done.output_file_id} <= {x.id for x in a.files.list()}, "A does not list its files")
    check(bt.id in {x.id for x in a.batches.list()}, "A does not list its batch")
    status, _ = raw(srv, "GET", "/v1/files")
    check(status == 401, f"no key lists files: {status}")


def cached_tokens(srv, who):
    status, r = raw(srv, "POST", "/v1/chat/completions", who, {
        "model": MODEL, "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "user", "content": SECRET}]})
    check(status == 200, f"{who}'s chat: {status} {r}")
    return r["usage"]["prompt_tokens"], (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_b_gets_no_cache_hit_on_a_batch_prompt(srv):
    check(State.batch, "needs A's batch")
    prompt, cached_b = cached_tokens(srv, "b")
    check(prompt > 120, f"the prompt is only {prompt} tokens")
    check(cached_b == 0, f"B repeating A's batch prompt got cached_tokens {cached_b} of {prompt}")
    # A's own repeat hits the blocks A's batch line left: the line ran as A.
    _, cached_a = cached_tokens(srv, "a")
    check(cached_a >= prompt // 2, f"A repeating its own batch prompt got cached_tokens {cached_a}")


def test_an_oversize_line_is_refused_with_its_number(srv):
    c = client(srv, "b")
    big = chat_line("big", "x" * (MAX_BODY + 1000), max_tokens=1)
    f = upload(c, [chat_line("ok1", "hi", max_tokens=1), big, chat_line("ok3", "hi", max_tokens=1)])
    t0 = time.time()
    bt = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_batch(c, bt.id, timeout=30)
    check(done.status == "failed", f"status {done.status}")
    errs = [(e.code, e.line, e.message) for e in done.errors.data]
    check(len(errs) == 1 and errs[0][0] == "line_too_large" and errs[0][1] == 2, f"errors: {errs}")
    check("line 2" in errs[0][2] and str(MAX_BODY) in errs[0][2], errs[0][2])
    check(time.time() - t0 < 10, f"validation took {time.time() - t0:.1f} s")


def test_listings_survive_a_row_that_does_not_decode(srv):
    check(State.batch, "needs A's batch")
    db = sqlite3.connect(os.path.join(srv.data_dir, "batches.sqlite3"), timeout=10)
    with db:
        db.execute("INSERT INTO files (id, json, owner) SELECT 'file-corrupt', '{not json', owner "
                   "FROM files WHERE id = ?", (State.file,))
        db.execute("INSERT INTO batches (id, status, created_at, json, owner) SELECT 'batch_corrupt', "
                   "'completed', 0, '[', owner FROM batches WHERE id = ?", (State.batch,))
        n = db.execute("SELECT COUNT(*) FROM files WHERE id = 'file-corrupt' AND owner IS NOT NULL").fetchone()[0]
    db.close()
    check(n == 1, "the corrupt row was not given A's owner")
    a = client(srv, "a")
    files = {x.id for x in a.files.list()}
    check(State.file in files and "file-corrupt" not in files, f"files: {files}")
    batches = {x.id for x in a.batches.list()}
    check(State.batch in batches and "batch_corrupt" not in batches, f"batches: {batches}")


def test_the_upload_quota_is_per_key(srv):
    c = client(srv, "c")
    pad = lambda n: [chat_line(f"p{i}", "y" * 900, max_tokens=1) for i in range(n)]
    first = upload(c, pad(150))  # ~150 KB of the 200 KB quota
    try:
        upload(c, pad(80))
        raise AssertionError("an upload past the quota was accepted")
    except openai.APIStatusError as e:
        body = e.response.json()["error"]
        check(e.status_code == 413 and body["code"] == "quota_exceeded", f"{e.status_code} {body}")
        check(str(QUOTA) in body["message"], body["message"])
    # Another key's quota is its own; deleting makes room.
    upload(client(srv, "b"), pad(80))
    c.files.delete(first.id)
    upload(c, pad(80))


def main():
    ap = argparse.ArgumentParser()
    target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "sloserve"))
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="sloserve-hostile-data-")
    os.environ.pop("SLOSERVE_API_KEY", None)
    keys = [f"--api-key={k}" for k in KEYS.values()]
    srv = Server(args.bin, data, [*keys, "--prefix-cache-scope", "per-key",
                                  "--max-body-bytes", str(MAX_BODY),
                                  "--batch-quota-bytes-per-key", str(QUOTA)])
    srv.data_dir = data
    passed = failed = 0
    tests = [test_a_batch_runs_and_b_cannot_reach_it, test_b_gets_no_cache_hit_on_a_batch_prompt,
             test_an_oversize_line_is_refused_with_its_number,
             test_listings_survive_a_row_that_does_not_decode, test_the_upload_quota_is_per_key]
    try:
        for t in tests:
            t0 = time.time()
            try:
                t(srv)
                passed += 1
                print(f"ok   {t.__name__} ({time.time() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", flush=True)
                traceback.print_exc()
    finally:
        code = srv.stop()
        if code != 0:
            failed += 1
            print(f"FAIL server exit code {code}\n{srv.tail()}")
        if failed:
            print(srv.tail())
    print(f"python hostile batch: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
