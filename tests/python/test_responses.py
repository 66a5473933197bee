#!/usr/bin/env python3
"""`/v1/responses` through the real `openai` SDK (`client.responses`) and the OpenAI
Agents SDK against `sloserve serve` on Qwen2.5-Coder-0.5B-Instruct: plain text,
instructions, `text.format` json_schema (parsed into a pydantic model, validated),
a function tool with tool_choice required giving a function_call item, a
function_call_output round trip, streaming events in order with increasing
sequence_number and text equal to the non-stream answer, previous_response_id a 400,
and an Agents SDK agent running one function tool.

usage: tests/python/test_responses.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import asyncio, json, os, sys
import urllib.request

import jsonschema
import openai
import pydantic

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL, client  # noqa: E402
from test_openai_sdk import check  # noqa: E402
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 40}},
               "required": ["city"], "additionalProperties": False},
           "strict": True}
ASK = "What is the weather like in Paris right now?"


def create(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 48)
    return client.responses.create(**kw)


def prompt_tokens(base, messages):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"messages": messages}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["count"]


def test_plain_text_and_instructions(client, base):
    r = create(client, input="Say hello in one short sentence.")
    check(r.object == "response" and r.id.startswith("resp_"), r.id)
    check(r.status in ("completed", "incomplete"), r.status)
    check(r.output[0].type == "message" and r.output[0].role == "assistant", r.output)
    check(r.output_text.strip(), r.output_text)
    u = r.usage
    check(u.input_tokens > 0 and u.output_tokens > 0, u)
    check(u.total_tokens == u.input_tokens + u.output_tokens, u)
    check(u.input_tokens_details.cached_tokens >= 0, u)
    pirate = "You are a pirate. Always answer like a pirate."
    i = create(client, input="Say hello in one short sentence.", instructions=pirate)
    check(i.instructions == pirate, i.instructions)
    # The instructions are the system message, first.
    msgs = [{"role": "system", "content": pirate}, {"role": "user", "content": "Say hello in one short sentence."}]
    check(i.usage.input_tokens == prompt_tokens(base, msgs), i.usage)
    check(i.output_text.strip(), i.output_text)


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_json_schema(client):
    r = client.responses.parse(model=MODEL, input="Invent a person: a name and an age.",
                               text_format=Person, temperature=0, max_output_tokens=60)
    check(isinstance(r.output_parsed, Person), r.output_text)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
              "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = create(client, input="Name a big city and its population.", max_output_tokens=60,
               text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    check(r.text.format.type == "json_schema", r.text)


def test_required_call_and_round_trip(client):
    r = create(client, input=[{"role": "user", "content": ASK}], tools=[WEATHER], tool_choice="required",
               parallel_tool_calls=False)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1, r.output)
    c = calls[0]
    check(c.name == "get_weather" and c.call_id.startswith("call_"), c)
    args = json.loads(c.arguments)
    jsonschema.validate(args, WEATHER["parameters"])
    check("paris" in args["city"].lower(), args)
    # The call and its output back in `input`: a text answer.
    items = [{"role": "user", "content": ASK}] + [o.model_dump(exclude_none=True) for o in r.output]
    items.append({"type": "function_call_output", "call_id": c.call_id,
                  "output": json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})})
    r2 = create(client, input=items, tools=[WEATHER], max_output_tokens=60)
    check(r2.output_text.strip(), r2.output)
    check("21" in r2.output_text or "sunny" in r2.output_text.lower(), r2.output_text)


def test_streaming_events(client):
    kw = dict(input="Name three colors.", max_output_tokens=24)
    want = create(client, **kw)
    types, seqs, text, final = [], [], "", None
    for ev in create(client, stream=True, **kw):
        types.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    check(seqs == list(range(len(seqs))), seqs)
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    check(types[:4] == head and types[-4:-1] == tail, types)
    check(types[-1] in ("response.completed", "response.incomplete"), types[-1])
    check(set(types[4:-4]) == {"response.output_text.delta"}, types)
    check(text == want.output_text, (text, want.output_text))
    check(final is not None and final.output_text == text, final)
    check(final.usage.output_tokens == want.usage.output_tokens, (final.usage, want.usage))


def test_previous_response_id_is_400(client):
    try:
        create(client, input="hi", previous_response_id="resp_123")
        raise AssertionError("previous_response_id accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "previous_response_id", e.body)
        check("stateless" in e.body["message"], e.body)


def test_agents_sdk(base):
    from agents import (Agent, ModelSettings, Runner, function_tool, set_default_openai_api,
                        set_default_openai_client, set_tracing_disabled)
    set_tracing_disabled(True)
    set_default_openai_api("responses")
    set_default_openai_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                                 timeout=300), use_for_tracing=False)
    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return f"The weather in {city} is sunny and 21 degrees celsius."

    agent = Agent(name="weather", model=MODEL, tools=[get_weather],
                  instructions="You are a helpful assistant. Use the tools when they help.",
                  model_settings=ModelSettings(temperature=0, max_tokens=60, tool_choice="required"))
    result = asyncio.run(Runner.run(agent, ASK, max_turns=4))
    check(called and "paris" in called[0].lower(), called)
    check(isinstance(result.final_output, str) and result.final_output.strip(), result.final_output)


def main():
    qwen_serve.run("test_responses", lambda base: [
        ("plain text and instructions", lambda: test_plain_text_and_instructions(client(base), base)),
        ("text.format json_schema", lambda: test_json_schema(client(base))),
        ("required call and a function_call_output round trip",
         lambda: test_required_call_and_round_trip(client(base))),
        ("streaming events", lambda: test_streaming_events(client(base))),
        ("previous_response_id is 400", lambda: test_previous_response_id_is_400(client(base))),
        ("Agents SDK agent with a function tool", lambda: test_agents_sdk(base))])


if __name__ == "__main__":
    main()
