#!/usr/bin/env python3
"""LangChain's `ChatOpenAI` (langchain-openai, pinned) against `sloserve serve` on
Qwen2.5-Coder-0.5B-Instruct: `bind_tools` with a tool loop (the model calls the tool,
the tool runs, its result goes back as a ToolMessage, the model answers in text), and
`with_structured_output` by json_schema and by function calling, each returning the
pydantic model.

usage: tests/python/test_langchain.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import os, sys

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL  # noqa: E402
from test_openai_sdk import check  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is 18 degrees celsius and sunny in {city}."


class City(BaseModel):
    """A city and the country it is in."""
    name: str = Field(description="the city's name")
    country: str = Field(description="the country it is in")
    population_millions: float = Field(ge=0, description="its population in millions")


def llm(base, **kw):
    return ChatOpenAI(base_url=base + "/v1", api_key="none", model=MODEL, temperature=0,
                      max_tokens=kw.pop("max_tokens", 80), max_retries=0, timeout=600, **kw)


def test_tool_loop(base):
    messages = [SystemMessage("You are a helpful assistant. Use the tools when they help."),
                HumanMessage("What is the weather like in Paris right now?")]
    ai = llm(base).bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke(messages)
    check(len(ai.tool_calls) == 1, ai)
    call = ai.tool_calls[0]
    check(call["name"] == "get_weather" and "paris" in call["args"]["city"].lower(), call)
    result = get_weather.invoke(call["args"])
    messages += [ai, ToolMessage(result, tool_call_id=call["id"])]
    # The answer: the tools stay bound, the model is asked for text (the 0.5B under
    # `auto` tends to call again).
    final = llm(base, max_tokens=60).bind_tools([get_weather], tool_choice="none").invoke(messages)
    check(not final.tool_calls, final)
    check("18" in final.content or "sunny" in final.content.lower(), final.content)


def test_structured(base, method):
    # repetition_penalty as the schema suite uses it: the 0.5B otherwise repeats a
    # digit until max_tokens inside a number (valid JSON never closes).
    out = llm(base, max_tokens=120, extra_body={"repetition_penalty": 1.2}).with_structured_output(
        City, method=method).invoke(
        "Describe Paris as a city record.")
    check(isinstance(out, City), out)
    check(out.name.lower().startswith("paris"), out)
    check(out.population_millions >= 0, out)


def main():
    qwen_serve.run("test_langchain", lambda base: [
        ("bind_tools and a tool loop", lambda: test_tool_loop(base)),
        ("with_structured_output json_schema", lambda: test_structured(base, "json_schema")),
        ("with_structured_output function_calling", lambda: test_structured(base, "function_calling"))])


if __name__ == "__main__":
    main()
