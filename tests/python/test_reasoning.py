#!/usr/bin/env python3
"""A thinking model's reasoning through the real `openai` SDK: Qwen2.5-Coder-0.5B-Instruct served
with a DeepSeek-R1 distill's chat template (llama.cpp's copy in crates/model/tests/data/templates,
`--chat-template-file`), whose generation prompt opens `<think>`, so the answer starts inside the
reasoning. The JSON answer puts it in `message.reasoning_content` (and `reasoning`), not in
`content`; the stream sends it as `delta.reasoning_content` pieces that add up to the same text;
`chat_template_kwargs: {"enable_thinking": false}` closes the block in the prompt, and the answer
is all content.

usage: tests/python/test_reasoning.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import os, sys

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL, client  # noqa: E402
from test_openai_sdk import ROOT, check  # noqa: E402

TEMPLATE = os.path.join(ROOT, "crates", "model", "tests", "data", "templates",
                        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
ASK = [{"role": "user", "content": "Is 7 a prime number? Think, then answer yes or no."}]


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

    return [("json answer has reasoning apart", json_answer_has_reasoning_apart),
            ("stream sends reasoning deltas", stream_sends_reasoning_deltas),
            ("enable_thinking false is all content", enable_thinking_false_is_all_content)]


if __name__ == "__main__":
    qwen_serve.run("test_reasoning", make_tests, extra_args=("--chat-template-file", TEMPLATE))
