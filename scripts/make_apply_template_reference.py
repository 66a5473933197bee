#!/usr/bin/env python3
"""Records how llama.cpp renders a real chat template: llama-server with `--jinja
--chat-template-file TEMPLATE` on a generated model (its bos/eos tokens are the ones the template
sees), `/apply-template` of each request below, and the `prompt` it answers. Writes
crates/model/tests/data/llamacpp-apply-template-<name>.jsonl, one `{"request", "prompt"}` a line,
for tests that render the same requests with sloserve's template engine.

Templates (crates/model/tests/data/templates/, copied from llama.cpp's models/templates/):
  phi3  microsoft-Phi-3.5-mini-instruct.jinja on models/generated/phi3.gguf
  the tool-calling templates (Llama 3.x, Mistral Nemo / Small 3.2 / Devstral, Qwen2.5, Qwen3,
  Qwen3-Coder, Hermes 2 Pro) and the R1 distill's on SmolLM2's vocabulary: plain turns, tools
  offered, a call and its result; for the thinking templates (Qwen3, QwQ, the R1 distills,
  Ministral 3 Reasoning) also assistant turns that carry `reasoning_content` (gpt-oss's
  reasoning turns: make_harmony_template_reference.py). A request the template refuses is
  recorded with its error.

Standard library only; talks to llama-server on 127.0.0.1 only.

Usage: make_apply_template_reference.py --bin <llama.cpp build/bin> [names...]
"""

import argparse
import json
import os
import sys
import urllib.error

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

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

# One conversation set for every tool-calling template: a system prompt, several turns, tools
# offered, and a call with its result (ids of nine alphanumerics: Mistral's templates insist).
TOOL_REQUESTS = [
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello! How can I help?"},
                  {"role": "user", "content": "Name a prime.\nJust one."}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "call12345", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp_c\": 21}"}],
     "tools": [WEATHER]},
]

# Reasoning turns: assistant history that carries `reasoning_content` (as clients send a
# thinking model's answers back), plain and around a call with its result.
REASONING_REQUESTS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4.",
                   "reasoning_content": "Two plus two.\nThat is 4."},
                  {"role": "user", "content": "And 3+3?"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
                   "tool_calls": [
                      {"id": "call12345", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp_c\": 21}"},
                  {"role": "assistant", "content": "It is 21 C.", "reasoning_content": "21 C is mild."},
                  {"role": "user", "content": "Thanks!"}],
     "tools": [WEATHER]},    # After the last user turn (Qwen3 renders only these turns' reasoning).
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.",
                   "reasoning_content": "I should call the tool.",
                   "tool_calls": [
                      {"id": "call12345", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp_c\": 21}"}],
     "tools": [WEATHER]},
]

# The default model's vocabulary (SmolLM2) for the templates of families with no generated file:
# both sides give the template its bos/eos texts.
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

SETS = {
    "phi3": ("phi3", "microsoft-Phi-3.5-mini-instruct.jinja", PHI3_REQUESTS),
    "llama3.1": (SMOLLM2, "meta-llama-Llama-3.1-8B-Instruct.jinja", TOOL_REQUESTS),
    "llama3.2": (SMOLLM2, "meta-llama-Llama-3.2-3B-Instruct.jinja", TOOL_REQUESTS),
    "llama3.3": (SMOLLM2, "meta-llama-Llama-3.3-70B-Instruct.jinja", TOOL_REQUESTS),
    "mistral-nemo": (SMOLLM2, "mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOL_REQUESTS),
    "mistral-small-3.2": (SMOLLM2, "Mistral-Small-3.2-24B-Instruct-2506.jinja", TOOL_REQUESTS),
    "devstral": (SMOLLM2, "unsloth-mistral-Devstral-Small-2507.jinja", TOOL_REQUESTS),
    "qwen2.5": (SMOLLM2, "Qwen-Qwen2.5-7B-Instruct.jinja", TOOL_REQUESTS),
    "qwen3": (SMOLLM2, "Qwen-Qwen3-0.6B.jinja", TOOL_REQUESTS + REASONING_REQUESTS),
    "qwen3-coder": (SMOLLM2, "Qwen3-Coder.jinja", TOOL_REQUESTS),
    "hermes-2-pro": (SMOLLM2, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", TOOL_REQUESTS),
    "r1-distill": (SMOLLM2, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                   TOOL_REQUESTS[:2] + REASONING_REQUESTS[:1]),
    "r1-distill-llama": (SMOLLM2, "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
                         TOOL_REQUESTS[:2] + REASONING_REQUESTS[:1]),
    "hermes-3": (SMOLLM2, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", TOOL_REQUESTS),
    "qwq": (SMOLLM2, "Qwen-QwQ-32B.jinja", TOOL_REQUESTS + REASONING_REQUESTS),
    "ministral-3-reasoning": (SMOLLM2, "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                              TOOL_REQUESTS + REASONING_REQUESTS),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", default=os.path.join(ROOT, "models", "generated"))
    ap.add_argument("names", nargs="*", default=list(SETS))
    a = ap.parse_args()
    for name in a.names:
        model, template, requests = SETS[name]
        path = model if os.path.isabs(model) else os.path.join(a.models, f"{model}.gguf")
        tpl = os.path.join(DATA, "templates", template)
        proc, port = start_server(a.bin, path, ["--jinja", "--chat-template-file", tpl])
        try:
            recs = []
            for r in requests:
                try:
                    recs.append({"request": r, "prompt": post(port, "/apply-template", r)["prompt"]})
                except urllib.error.HTTPError as e:
                    # The template refuses this conversation: recorded, sloserve must refuse too.
                    recs.append({"request": r, "error": e.read().decode(errors="replace")[:300]})
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
