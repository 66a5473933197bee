"""`sloserve inspect --export-tokenizer DIR` checked with Hugging Face's own `tokenizers`
library (pinned in tests/python/requirements-tokenizer.txt): for every llama.cpp test
vocabulary in crates/model/tests/data/vocab, the folder is exported, loaded with
`tokenizers.Tokenizer.from_file` and each test text encoded (no special tokens added,
control-token texts as plain text, as the `.out` ids were made) and compared with the
ids in its `.out` file (which sloserve matches exactly: crates/model/tests/llamacpp_vocab.rs),
and the `.out` ids decoded back to the text (not for WordPiece, which is lossy).
For the real models in models/, the ids come from `sloserve serve`'s /tokenize: every
test text of every vocabulary and 400 paragraphs of README.md and docs/*.md, as plain
text, and a few prompts with special tokens parsed and BOS added. With --transformers, `transformers.AutoTokenizer.from_pretrained`
must load each folder and encode as `tokenizers` does.

Prints one line per vocabulary (matching lines / lines) and exits 1 unless all match
(or --allow-mismatch)."""
import argparse, gzip, json, os, shutil, socket, subprocess, sys, tempfile, time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB_DIR = os.path.join(ROOT, "crates", "model", "tests", "data", "vocab")
MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
]
SEP = "\n__ggml_vocab_test__\n"

# Prompts encoded with special tokens parsed and BOS added (where the GGUF says add_bos).
SPECIAL_PROMPTS = [
    "Hello world",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<|endoftext|>text after an end token",
    "  leading spaces and\ttabs\n\nand newlines ",
]

# A conversation rendered by the chat template (sloserve's /tokenize and transformers').
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three primes."},
    {"role": "assistant", "content": "2, 3, 5."},
    {"role": "user", "content": "And the next one?"},
]


def cases(name):
    with open(os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf.inp"), encoding="utf-8", newline="") as f:
        inp = f.read()
    with open(os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf.out"), encoding="utf-8") as f:
        out = [[int(t) for t in line.split()] for line in f.read().splitlines()]
    texts = inp.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()
    assert len(texts) == len(out), f"{name}: {len(texts)} inputs, {len(out)} outputs"
    return list(zip(texts, out))


def doc_paragraphs(limit=400):
    """Real-world text for the real models: the paragraphs (markdown, code, tables) of
    README.md and docs/*.md, in a fixed order."""
    paths = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    paras = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            paras.extend(p for p in f.read().split("\n\n") if p.strip())
    return paras[:limit]


def export(binary, gguf, out_dir):
    t0 = time.time()
    r = subprocess.run([binary, "inspect", "--export-tokenizer", out_dir, gguf],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"export of {gguf} failed: {r.stderr.strip()}")
    return time.time() - t0


def load(dir_):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(dir_, "tokenizer.json"))
    return tok


def plain_ids(tok, text):
    """Control-token texts as plain text, no BOS: as llama.cpp's test and the .out files."""
    tok.encode_special_tokens = True
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False


def compare(label, pairs, encode, failures, show):
    ok = 0
    for text, want in pairs:
        got = encode(text)
        if got == want:
            ok += 1
        elif len(failures) < show:
            failures.append(f"{label}: {text!r}\n  want {want}\n  got  {got}")
    return ok


def check_transformers(dir_, tok, texts, special=(), chat=None):
    """AutoTokenizer loads the folder and encodes as `tokenizers` does, adds BOS as sloserve
    does (`special`: (text, sloserve ids) pairs) and renders the chat template to
    sloserve's ids (`chat`: (messages, sloserve ids)); returns (a note, mismatches)."""
    from transformers import AutoTokenizer
    at = AutoTokenizer.from_pretrained(dir_)
    bad = 0
    for text in texts:
        want = tok.encode(text, add_special_tokens=False).ids
        got = at.encode(text, add_special_tokens=False)
        bad += got != want
    note = f"transformers {type(at).__name__}: {len(texts) - bad}/{len(texts)} same ids"
    if special:
        bad_sp = sum(at.encode(t) != want for t, want in special)
        note += f", {len(special) - bad_sp}/{len(special)} with BOS"
        bad += bad_sp
    if not getattr(at, "chat_template", None):
        note += ", no chat template"
    elif chat:
        messages, want = chat
        got = at.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if hasattr(got, "keys"):
            got = got["input_ids"]
        same = list(got) == want
        bad += not same
        note += ", chat template " + ("renders to sloserve's ids" if same else f"DIFFERS: {list(got)} vs {want}")
    return note, bad


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def serve(binary, model, log):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port),
                             "--no-batch-api", "--threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server not ready in time")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "sloserve"))
    ap.add_argument("--only", action="append", help="a vocabulary or model file name (repeatable)")
    ap.add_argument("--no-models", action="store_true", help="skip the real models in models/")
    ap.add_argument("--transformers", action="store_true",
                    help="also load each folder with transformers.AutoTokenizer")
    ap.add_argument("--keep", help="export into this folder and keep it")
    ap.add_argument("--show", type=int, default=5, help="mismatches to print per vocabulary")
    ap.add_argument("--allow-mismatch", action="store_true", help="report, exit 0")
    args = ap.parse_args()
    t_start = time.time()
    work = args.keep or tempfile.mkdtemp(prefix="sloserve-hf-tok-")
    os.makedirs(work, exist_ok=True)
    names = sorted(f[len("ggml-vocab-"):-len(".gguf.gz")] for f in os.listdir(VOCAB_DIR)
                   if f.endswith(".gguf.gz"))
    all_texts = [t for name in names for t, _ in cases(name)]
    total_bad = 0
    try:
        for name in names:
            if args.only and name not in args.only:
                continue
            gguf = os.path.join(work, f"{name}.gguf")
            with gzip.open(os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf.gz")) as src, \
                    open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out = os.path.join(work, name)
            secs = export(args.bin, gguf, out)
            os.remove(gguf)
            tok = load(out)
            pairs = cases(name)
            failures = []
            ok = compare(name, pairs, lambda t: plain_ids(tok, t), failures, args.show)
            total_bad += len(pairs) - ok
            # The ids decode back to the text (WordPiece loses case, accents and spacing).
            decoded = "decode not checked"
            if not name.startswith("bert"):
                dec_ok = compare(name + " (decode)", [(ids, t) for t, ids in pairs],
                                 lambda ids: tok.decode(ids, skip_special_tokens=False),
                                 failures, args.show)
                total_bad += len(pairs) - dec_ok
                decoded = f"decode {dec_ok}/{len(pairs)}"
            extra = ""
            if args.transformers:
                note, bad = check_transformers(out, tok, [t for t, _ in pairs])
                extra, total_bad = "; " + note, total_bad + bad
            print(f"{name:<16} {ok:>3}/{len(pairs)} lines match, {decoded} (export {secs:.1f}s){extra}",
                  flush=True)
            for f in failures:
                print("  " + f.replace("\n", "\n  "))
        if args.no_models:
            return finish(total_bad, t_start, args)
        seen = set()
        texts = [t for t in all_texts + doc_paragraphs() if not (t in seen or seen.add(t))]
        for model in MODELS:
            path = os.path.join(ROOT, "models", model)
            if args.only and model not in args.only:
                continue
            if not os.path.exists(path):
                print(f"{model:<16} skipped: not in models/ (make model / model-gemma3 / model-qwen0.5b)")
                continue
            out = os.path.join(work, model.split(".gguf")[0])
            secs = export(args.bin, path, out)
            tok = load(out)
            log = open(os.path.join(work, f"{model}.serve.log"), "w")
            proc, base = serve(args.bin, path, log)
            try:
                plain = [(t, post(base, "/tokenize", {"prompt": t, "add_special_tokens": False,
                                                      "split_special_tokens": True})["tokens"])
                         for t in texts]
                special = [(t, post(base, "/tokenize", {"prompt": t})["tokens"])
                           for t in SPECIAL_PROMPTS]
                try:
                    chat = (CHAT, post(base, "/tokenize", {"messages": CHAT})["tokens"])
                except Exception:  # noqa: BLE001 (a model without a chat template)
                    chat = None
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            failures = []
            ok = compare(model, plain, lambda t: plain_ids(tok, t), failures, args.show)
            ok_sp = compare(model + " (special)", special,
                            lambda t: tok.encode(t, add_special_tokens=True).ids, failures, args.show)
            total_bad += len(plain) - ok + len(special) - ok_sp
            extra = ""
            if args.transformers:
                note, bad = check_transformers(out, tok, texts, special, chat)
                extra, total_bad = "; " + note, total_bad + bad
            print(f"{model:<16} {ok}/{len(plain)} texts match, {ok_sp}/{len(special)} prompts "
                  f"with special tokens and BOS (export {secs:.1f}s){extra}", flush=True)
            for f in failures:
                print("  " + f.replace("\n", "\n  "))
        return finish(total_bad, t_start, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def finish(total_bad, t_start, args):
    print(f"export-tokenizer: {total_bad} mismatching lines in all ({time.time() - t_start:.1f}s)")
    return 0 if total_bad == 0 or args.allow_mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
