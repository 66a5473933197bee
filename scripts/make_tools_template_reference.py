#!/usr/bin/env python3
"""Renders tool conversations with the Qwen2.5-Coder 0.5B GGUF's own chat template the way
Hugging Face transformers' `apply_chat_template` does (jinja2 sandbox, trim_blocks,
lstrip_blocks, `tojson` = json.dumps(ensure_ascii=False)), with the calls' arguments given
as objects as vLLM and llama.cpp pass them. Writes crates/model/tests/data/hf-tools-qwen0.5b.jsonl,
the reference of crates/model/tests/chat_tools_reference.rs.

usage: scripts/make_tools_template_reference.py [GGUF]   (needs jinja2; standard library otherwise)
"""
import json, os, struct, sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
OUT = os.path.join(ROOT, "crates", "model", "tests", "data", "hf-tools-qwen0.5b.jsonl")


def chat_template(path):
    """The string value of tokenizer.chat_template (GGUF metadata type 8: u64 length + bytes)."""
    with open(path, "rb") as f:
        data = f.read(32 << 20)
    key = b"tokenizer.chat_template"
    i = data.index(key) + len(key)
    assert struct.unpack("<I", data[i:i + 4])[0] == 8
    n = struct.unpack("<Q", data[i + 4:i + 12])[0]
    return data[i + 12:i + 12 + n].decode()


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    e.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return e


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False},
    "strict": True}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}

CASES = [
    ("tools_only", [{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER, ADD]),
    ("round_trip", [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Weather in Paris, in celsius?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}], [WEATHER]),
    ("parallel_results", [
        {"role": "user", "content": "Add 2 and 3, and 4 and 5."},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": {"a": 4, "b": 5}}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "9"},
        {"role": "assistant", "content": "5 and 9."},
        {"role": "user", "content": "Thanks"}], [ADD]),
    ("history_without_tools", [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "5"}], None),
]


def main():
    tmpl = env().from_string(chat_template(GGUF))
    with open(OUT, "w") as f:
        for name, messages, tools in CASES:
            rendered = tmpl.render(messages=messages, tools=tools, add_generation_prompt=True,
                                   bos_token="", eos_token="<|im_end|>")
            f.write(json.dumps({"id": name, "messages": messages, "tools": tools, "rendered": rendered},
                               ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} records to {OUT} (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    main()
