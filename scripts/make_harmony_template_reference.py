#!/usr/bin/env python3
"""Records how llama.cpp renders gpt-oss's harmony template: llama-server (`--jinja
--chat-template-file crates/model/tests/data/templates/openai-gpt-oss-120b.jinja`, on the generated
`models/generated/gpt-oss.gguf`) answers `/apply-template` for each request below, and each
request with its `prompt` is a line of crates/model/tests/data/llamacpp-apply-template-gpt-oss.jsonl,
the reference of crates/model/tests/reasoning_templates.rs. The requests: a system prompt (the
developer message), `reasoning_effort: high`, tools offered, and a tool-call round trip (an
assistant call with its analysis in `reasoning_content`, which llama.cpp passes to the template as
`thinking`; the tool's result; a final answer; a second question).

usage: scripts/make_harmony_template_reference.py [LLAMA_BIN_DIR]
(default: llama-cpp-python 0.3.36's llama.cpp build under ~/.cache/sloserve-peers). Talks to
llama-server on 127.0.0.1 only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_qwen_reference import post, start_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
MODEL = os.path.join(ROOT, "models", "generated", "gpt-oss.gguf")
TEMPLATE = os.path.join(ROOT, "crates", "model", "tests", "data", "templates", "openai-gpt-oss-120b.jinja")
OUT = os.path.join(ROOT, "crates", "model", "tests", "data", "llamacpp-apply-template-gpt-oss.jsonl")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer"}}, "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}

REQUESTS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                  {"role": "user", "content": "Name a prime."}],
     "chat_template_kwargs": {"reasoning_effort": "high"}},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
                   "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
     "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
                  {"role": "assistant", "content": "Sunny, 21 C."},
                  {"role": "user", "content": "And London?"}],
     "tools": [WEATHER]},
]


def main():
    proc, port = start_server(BIN, MODEL, ["--jinja", "--chat-template-file", TEMPLATE])
    try:
        with open(OUT, "w", encoding="utf-8") as f:
            for req in REQUESTS:
                prompt = post(port, "/apply-template", req)["prompt"]
                f.write(json.dumps({"request": req, "prompt": prompt}, ensure_ascii=False) + "\n")
        print(f"wrote {OUT} ({len(REQUESTS)} records)", file=sys.stderr)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
