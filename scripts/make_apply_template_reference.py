#!/usr/bin/env python3
"""Records how llama.cpp renders a real chat template: llama-server with `--jinja
--chat-template-file TEMPLATE` on a generated model (its bos/eos tokens are the ones the template
sees), `/apply-template` of each request below, and the `prompt` it answers. Writes
crates/model/tests/data/llamacpp-apply-template-<name>.jsonl, one `{"request", "prompt"}` a line,
for tests that render the same requests with sloserve's template engine.

Templates (crates/model/tests/data/templates/, copied from llama.cpp's models/templates/):
  phi3  microsoft-Phi-3.5-mini-instruct.jinja on models/generated/phi3.gguf

Standard library only; talks to llama-server on 127.0.0.1 only.

Usage: make_apply_template_reference.py --bin <llama.cpp build/bin> [names...]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from make_qwen_reference import post, start_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "crates", "model", "tests", "data")

PHI3_REQUESTS = [
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello! How can I help?"},
                  {"role": "user", "content": "Name a prime.\nJust one."}]},
    # An empty system message is left out by the template.
    {"messages": [{"role": "system", "content": ""},
                  {"role": "user", "content": "Déjà vu: «quotes», emoji 🙂, tabs\tand  spaces  "}]},
    # Without the generation prompt the template ends with the eos token. (Not after an assistant
    # message: llama-server takes a last assistant message as a prefill to continue and splices
    # the rendering, `...<|end|>\n<|im_end|>assistant|>\nYes.` here.)
    {"messages": [{"role": "user", "content": "Say yes."}],
     "add_generation_prompt": False},
]

SETS = {
    "phi3": ("phi3", "microsoft-Phi-3.5-mini-instruct.jinja", PHI3_REQUESTS),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", default=os.path.join(ROOT, "models", "generated"))
    ap.add_argument("names", nargs="*", default=list(SETS))
    a = ap.parse_args()
    for name in a.names:
        model, template, requests = SETS[name]
        path = os.path.join(a.models, f"{model}.gguf")
        tpl = os.path.join(DATA, "templates", template)
        proc, port = start_server(a.bin, path, ["--jinja", "--chat-template-file", tpl])
        try:
            recs = [{"request": r, "prompt": post(port, "/apply-template", r)["prompt"]} for r in requests]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        out = os.path.join(DATA, f"llamacpp-apply-template-{name}.jsonl")
        with open(out, "w") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
