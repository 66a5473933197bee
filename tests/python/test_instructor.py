#!/usr/bin/env python3
"""`instructor` (pinned in tests/python/requirements-instructor.txt, its own venv:
instructor 1.17 wants jiter < 0.15, which openai 3.57 of requirements.txt does not
allow) against `sloserve serve` on Qwen2.5-Coder-0.5B-Instruct: a pydantic model
returned through tool calling (instructor's default TOOLS mode: a named
tool_choice) and through response_format json_schema (JSON_SCHEMA mode).

usage: tests/python/test_instructor.py [--bin BINARY] [--model GGUF]
Ends with 'python: N passed, M failed'.
"""
import os, sys

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field

sys.path.insert(0, os.path.dirname(__file__))
import qwen_serve  # noqa: E402
from qwen_serve import MODEL  # noqa: E402
from test_openai_sdk import check  # noqa: E402


class City(BaseModel):
    """A city and the country it is in."""
    name: str = Field(description="the city's name")
    country: str = Field(description="the country it is in")
    population_millions: float = Field(ge=0, description="its population in millions")


def test_extract(base, mode):
    client = instructor.from_openai(OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                           timeout=600), mode=mode)
    # repetition_penalty as the schema suite uses it (the greedy 0.5B otherwise
    # repeats a digit inside a number until max_tokens). No retries: the first
    # answer must validate.
    out = client.chat.completions.create(
        model=MODEL, response_model=City, max_retries=0, temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": "Describe Paris as a city record."}],
        extra_body={"repetition_penalty": 1.2})
    check(isinstance(out, City), out)
    check(out.name.lower().startswith("paris"), out)
    check("france" in out.country.lower(), out)


def main():
    qwen_serve.run("test_instructor", lambda base: [
        ("instructor TOOLS mode", lambda: test_extract(base, instructor.Mode.TOOLS)),
        ("instructor JSON_SCHEMA mode", lambda: test_extract(base, instructor.Mode.JSON_SCHEMA))])


if __name__ == "__main__":
    main()
