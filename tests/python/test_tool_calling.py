#!/usr/bin/env python3
"""Tool calling through the real `openai` SDK against `sloserve serve` on
Qwen2.5-Coder-0.5B-Instruct: tool_choice `required` and a named function (constrained:
the arguments validate against the function's parameters), `auto` on a question that
needs a tool (the model's own <tool_call> parsed into tool_calls; a strict function's
arguments constrained), then a `tool` message
round trip that gives a text answer; streaming deltas reassemble to the non-stream call;
bad tool_choice / tools are 400s naming the field.

usage: tests/python/test_tool_calling.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import json, os, sys

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL, client  # noqa: E402
from test_openai_sdk import check  # noqa: E402
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False},
    "strict": True}}
CALC = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, CALC]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_WEATHER = [{"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
               {"role": "user", "content": "What is the weather like in Paris right now? Answer in celsius."}]


def valid_call(call, name=None):
    check(call.type == "function", call)
    check(call.id.startswith("call_") and len(call.id) > 8, call.id)
    check(call.function.name in SCHEMAS, call.function.name)
    if name:
        check(call.function.name == name, call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def create(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(**kw)


def test_required(client):
    r = create(client, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", c.finish_reason)
    check(c.message.content is None, c.message.content)
    check(len(c.message.tool_calls) == 1, c.message.tool_calls)
    args = valid_call(c.message.tool_calls[0], "get_weather")
    check("paris" in args["city"].lower(), args)


def test_named(client):
    r = create(client, messages=[{"role": "user", "content": "What is 6 times 7?"}], tools=TOOLS,
               tool_choice={"type": "function", "function": {"name": "multiply"}})
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", c.finish_reason)
    args = valid_call(c.message.tool_calls[0], "multiply")
    check(sorted([args["a"], args["b"]]) == [6, 7], args)


def test_auto_round_trip(client):
    r = create(client, messages=ASK_WEATHER, tools=TOOLS)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"{c.finish_reason}: {c.message.content!r}")
    call = c.message.tool_calls[0]
    args = valid_call(call, "get_weather")
    # The call and its result go back; the model answers in text. (A second `auto` turn
    # of this 0.5B model repeats the call, so the final answer is asked for with
    # tool_choice "none", as agent loops do; the mild penalty keeps it from echoing
    # the call.)
    messages = ASK_WEATHER + [
        c.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": f"It is 21 degrees Celsius and sunny in {args['city']}."}]
    r = create(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=60,
               extra_body={"repetition_penalty": 1.2})
    c = r.choices[0]
    check(c.finish_reason == "stop", f"{c.finish_reason}: {c.message}")
    check(not c.message.tool_calls, c.message.tool_calls)
    check("21" in (c.message.content or ""), c.message.content)
    # Without tools the model just answers.
    r = create(client, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, tool_choice="none",
               max_tokens=10)
    check(r.choices[0].message.content and not r.choices[0].message.tool_calls, r.choices[0].message)


def test_auto_strict(client):
    # Under `auto`, a strict function's arguments are constrained: a city of at most
    # 3 characters is what the grammar lets the model write (it writes "Paris" when
    # the function is not strict); a question with no use for the tool still gets text.
    short = json.loads(json.dumps(WEATHER))
    short["function"]["parameters"]["properties"]["city"]["maxLength"] = 3
    loose = json.loads(json.dumps(short))
    loose["function"]["strict"] = False
    cities = {}
    for name, tool in [("strict", short), ("loose", loose)]:
        c = create(client, messages=ASK_WEATHER, tools=[tool, CALC]).choices[0]
        check(c.finish_reason == "tool_calls", f"{name}: {c.finish_reason}: {c.message.content!r}")
        call = c.message.tool_calls[0]
        check(call.function.name == "get_weather", call)
        cities[name] = json.loads(call.function.arguments)["city"]
    jsonschema.validate({"city": cities["strict"], "unit": "celsius"}, short["function"]["parameters"])
    # The bound is what the grammar enforces: the same call, not strict, goes past it.
    check(len(cities["loose"]) > 3 and "paris" in cities["loose"].lower(), cities)
    r = create(client, messages=[{"role": "user", "content": "Say hello to Ann in one short sentence."}],
               tools=[short], max_tokens=20)
    c = r.choices[0]
    check(c.message.content and not c.message.tool_calls, c.message)
    check(c.finish_reason in ("stop", "length"), c.finish_reason)


def test_streaming_matches(client):
    for kw in [dict(tool_choice="auto"), dict(tool_choice="required")]:
        full = create(client, messages=ASK_WEATHER, tools=TOOLS, seed=1, **kw).choices[0]
        calls, content, finish, first = {}, "", None, {}
        for chunk in create(client, messages=ASK_WEATHER, tools=TOOLS, seed=1, stream=True, **kw):
            for ch in chunk.choices:
                d = ch.delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    if tc.index not in calls:
                        # The first delta of a call: id, type, name, empty arguments.
                        check(tc.id and tc.type == "function" and tc.function.name, tc)
                        check(tc.function.arguments == "", tc)
                        calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                        first[tc.index] = True
                    else:
                        check(tc.id is None, tc)
                        calls[tc.index]["arguments"] += tc.function.arguments or ""
                check("<tool_call" not in content and not content.endswith("<"), content)
                finish = ch.finish_reason or finish
        check(finish == full.finish_reason == "tool_calls", (finish, full.finish_reason))
        check(content == (full.message.content or ""), (content, full.message.content))
        got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
        want = [(t.function.name, json.loads(t.function.arguments)) for t in full.message.tool_calls]
        check(got == want, (got, want))


def test_bad_requests_are_400(client):
    cases = [
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice", "get_time"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "sometimes"),
        (dict(tool_choice="required"), "tool_choice", "tool"),
        (dict(tools=[WEATHER, {"type": "function", "function": {"name": "bad name"}}]), "tools[1].function.name", "bad name"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "response_format", "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]), "tools", "128"),
    ]
    for kw, param, why in cases:
        try:
            create(client, messages=[{"role": "user", "content": "x"}], max_tokens=4, **kw)
        except openai.BadRequestError as e:
            body = e.body or {}
            check(body.get("param") == param, (param, body))
            check(why in body.get("message", ""), f"{why!r} not in {body.get('message')!r}")
        else:
            raise AssertionError(f"{kw} was accepted")


def main():
    qwen_serve.run("test_tool_calling", lambda base: [
        ("required", lambda: test_required(client(base))),
        ("named", lambda: test_named(client(base))),
        ("auto and a tool round trip", lambda: test_auto_round_trip(client(base))),
        ("auto with a strict function", lambda: test_auto_strict(client(base))),
        ("streaming deltas match", lambda: test_streaming_matches(client(base))),
        ("bad requests are 400", lambda: test_bad_requests_are_400(client(base)))])


if __name__ == "__main__":
    main()
