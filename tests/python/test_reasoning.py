#!/usr/bin/env python3
"""A thinking model's reasoning through the real `openai` SDK: Qwen2.5-Coder-0.5B-Instruct served
with a DeepSeek-R1 distill's chat template (llama.cpp's copy in crates/model/tests/data/templates,
`--chat-template-file`), whose generation prompt opens `<think>`, so the answer starts inside the
reasoning. The JSON answer puts it in `message.reasoning_content` (and `reasoning`), not in
`content`; the stream sends it as `delta.reasoning_content` pieces that add up to the same text;
`chat_template_kwargs: {"enable_thinking": false}` closes the block in the prompt, and the answer
is all content. `usage.completion_tokens_details.reasoning_tokens` counts the reasoning (JSON and the
stream's usage chunk); `thinking_token_budget` ends it after that many tokens; the Responses API
returns it as a `reasoning` item (and `response.reasoning_text.delta` events). A second server, the
generated gpt-oss file with its real harmony template, makes a named tool call that the SDK reads
as `tool_calls`, and takes the call and its result back in the history.

usage: tests/python/test_reasoning.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import os, signal, subprocess, sys

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL, client  # noqa: E402
from test_openai_sdk import ROOT, check, free_port, wait_ready  # noqa: E402

TEMPLATE = os.path.join(ROOT, "crates", "model", "tests", "data", "templates",
                        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
ASK = [{"role": "user", "content": "Is 7 a prime number? Think, then answer yes or no."}]
GPT_OSS = os.path.join(ROOT, "models", "generated", "gpt-oss.gguf")
HARMONY = os.path.join(ROOT, "crates", "model", "tests", "data", "templates", "openai-gpt-oss-120b.jinja")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "London"]}},
                          "required": ["city"], "additionalProperties": False}}}


def sloserve_bin():
    """The binary `qwen_serve.run` serves (its --bin flag)."""
    if "--bin" in sys.argv:
        return sys.argv[sys.argv.index("--bin") + 1]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "sloserve")


def extra(obj, name):
    return (obj.model_extra or {}).get(name)


def make_tests(base):
    c = client(base)

    def json_answer_has_reasoning_apart():
        r = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24)
        m = r.choices[0].message
        reasoning = extra(m, "reasoning_content")
        check(isinstance(reasoning, str) and reasoning.strip(), f"reasoning_content {reasoning!r}")
        check(extra(m, "reasoning") == reasoning, "reasoning mirrors reasoning_content")
        check("<think>" not in (m.content or ""), f"no tag in the content {m.content!r}")
        return m

    def stream_sends_reasoning_deltas():
        whole = json_answer_has_reasoning_apart()
        rs, cs = [], []
        for ch in c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24,
                                            stream=True):
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            rs.append(extra(d, "reasoning_content") or "")
            cs.append(d.content or "")
        check("".join(rs) == extra(whole, "reasoning_content"), f"streamed reasoning {''.join(rs)!r}")
        check("".join(cs) == (whole.content or ""), f"streamed content {''.join(cs)!r}")
        check(sum(1 for r in rs if r) > 1, "reasoning came in several deltas")

    def enable_thinking_false_is_all_content():
        r = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=16,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        m = r.choices[0].message
        check(extra(m, "reasoning_content") is None, f"no reasoning: {extra(m, 'reasoning_content')!r}")
        check(m.content and m.content.strip(), f"content {m.content!r}")

    def reasoning_tokens_are_counted():
        r = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24)
        n = r.usage.completion_tokens_details.reasoning_tokens
        check(0 < n <= r.usage.completion_tokens, f"reasoning_tokens {n} of {r.usage.completion_tokens}")
        last = None
        for ch in c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True}):
            last = ch
        check(last.usage.completion_tokens_details.reasoning_tokens == n, f"stream usage {last.usage}")

    def budget_ends_the_reasoning():
        r = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=32,
                                      extra_body={"thinking_token_budget": 3})
        m = r.choices[0].message
        n = r.usage.completion_tokens_details.reasoning_tokens
        check(n == 3, f"reasoning_tokens {n}: {extra(m, 'reasoning_content')!r}")
        check(m.content and m.content.strip(), f"content after the budget {m.content!r}")

    def responses_return_a_reasoning_item():
        whole = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=12)
        r = c.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=12)
        item = r.output[0]
        check(item.type == "reasoning", f"first item {item.type}")
        check(item.content[0].type == "reasoning_text", f"part {item.content[0]}")
        check(item.content[0].text == extra(whole.choices[0].message, "reasoning_content"), "same reasoning")
        check(r.usage.output_tokens_details.reasoning_tokens
              == whole.usage.completion_tokens_details.reasoning_tokens, f"usage {r.usage}")
        deltas, done = [], None
        for ev in c.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=12, stream=True):
            if ev.type == "response.reasoning_text.delta":
                deltas.append(ev.delta)
            elif ev.type == "response.reasoning_text.done":
                done = ev.text
        check("".join(deltas) == item.content[0].text == done, f"streamed reasoning {''.join(deltas)!r}")

    def harmony_tool_call_round_trip():
        port = free_port()
        hb = f"http://127.0.0.1:{port}"
        log = open(os.path.join(ROOT, "target", "test_reasoning_gpt_oss.log"), "w")
        proc = subprocess.Popen([sloserve_bin(), "serve", "--model", GPT_OSS, "--chat-template-file", HARMONY,
                                 "--port", str(port), "--served-model-name", MODEL, "--no-batch-api"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(hb, proc, timeout=300)
            h = client(hb)
            ask = [{"role": "user", "content": "Weather in Paris?"}]
            r = h.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], temperature=0, max_tokens=80,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
            ch = r.choices[0]
            check(ch.finish_reason == "tool_calls", f"finish {ch.finish_reason}: {ch.message}")
            call = ch.message.tool_calls[0]
            check(call.function.name == "get_weather", f"call {call}")
            import json
            check(json.loads(call.function.arguments)["city"] in ("Paris", "London"), f"args {call}")
            history = ask + [ch.message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
            r2 = h.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0,
                                           max_tokens=4)
            check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 10, f"history rendered {r2.usage}")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    return [("json answer has reasoning apart", json_answer_has_reasoning_apart),
            ("reasoning tokens are counted", reasoning_tokens_are_counted),
            ("budget ends the reasoning", budget_ends_the_reasoning),
            ("responses return a reasoning item", responses_return_a_reasoning_item),
            ("harmony tool call round trip", harmony_tool_call_round_trip),
            ("stream sends reasoning deltas", stream_sends_reasoning_deltas),
            ("enable_thinking false is all content", enable_thinking_false_is_all_content)]


if __name__ == "__main__":
    qwen_serve.run("test_reasoning", make_tests, extra_args=("--chat-template-file", TEMPLATE))
