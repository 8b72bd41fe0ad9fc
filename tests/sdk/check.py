"""The official `openai` Python SDK, pointed once straight at the provider and once at
abridge: every scenario must give the same result both ways.

Usage: python check.py DIRECT_BASE_URL ABRIDGE_BASE_URL
Prints one line per scenario; exits 1 on the first difference, showing both results.
"""

import json
import sys

from openai import APIStatusError, OpenAI

DIRECT, VIA = sys.argv[1], sys.argv[2]
KEY = "sk-sdk-test-key"
MODEL = "gpt-4o-mini"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three rivers in Portugal."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def client(base_url):
    return OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=20)


def plain(c):
    return c.chat.completions.create(model=MODEL, messages=MESSAGES).model_dump()


def stream_without_usage(c):
    chunks = c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    return [chunk.model_dump() for chunk in chunks]


def stream_with_usage(c):
    chunks = c.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    return [chunk.model_dump() for chunk in chunks]


def tool_round_trip(c):
    first = c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    followup = MESSAGES + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Tejo, Douro, Mondego"},
    ]
    second = c.chat.completions.create(model=MODEL, messages=followup, tools=TOOLS)
    return [first.model_dump(), second.model_dump()]


def streamed_tool_call(c):
    chunks = c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True)
    return [chunk.model_dump() for chunk in chunks]


def provider_error(c):
    try:
        c.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-fake-status": "429"}
        )
    except APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "type": type(e).__name__}
    return {"status": "no error"}


def context_error(c):
    try:
        c.chat.completions.create(
            model=MODEL,
            messages=MESSAGES + [{"role": "user", "content": "x " * 5000}],
            extra_headers={"x-fake-window": "100"},
        )
    except APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "type": type(e).__name__}
    return {"status": "no error"}


def models(c):
    return [m.model_dump() for m in c.models.list()]


def embeddings(c):
    return c.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"]).model_dump()


SCENARIOS = [
    plain,
    stream_without_usage,
    stream_with_usage,
    tool_round_trip,
    streamed_tool_call,
    provider_error,
    context_error,
    models,
    embeddings,
]


def long_conversation():
    """A conversation that grows past abridge's threshold (the test sets 2,000 tokens):
    through abridge it is compacted, and the client notices nothing but the x-abridge-*
    headers — each answer equals the provider's direct answer to the full history, apart
    from the usage (fewer prompt tokens) and the id (derived from what was sent)."""
    direct, via = client(DIRECT), client(VIA)
    messages = [MESSAGES[0], {"role": "user", "content": "Let us plan a long river trip."}]
    compacted = 0
    for n in range(24):
        messages.append({"role": "user", "content": f"Step {n}: " + "tell me more about the next river. " * 12})
        raw = via.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        got = raw.parse().model_dump()
        expected = direct.chat.completions.create(model=MODEL, messages=messages).model_dump()
        if raw.headers.get("x-abridge-compacted") == "true":
            compacted += 1
            assert got["usage"]["prompt_tokens"] < expected["usage"]["prompt_tokens"]
        for answer in (got, expected):
            answer.pop("usage")
            answer.pop("id")
        if got != expected:
            print(f"MISMATCH long_conversation step {n}")
            print("direct:", json.dumps(expected, indent=1, sort_keys=True))
            print("abridge:", json.dumps(got, indent=1, sort_keys=True))
            sys.exit(1)
        messages.append({"role": "assistant", "content": got["choices"][0]["message"]["content"]})
    assert compacted > 0, "the conversation was never compacted"
    print(f"ok long_conversation ({compacted} compacted turns)")


def main():
    direct, via = client(DIRECT), client(VIA)
    for scenario in SCENARIOS:
        expected, got = scenario(direct), scenario(via)
        if expected != got:
            print(f"MISMATCH {scenario.__name__}")
            print("direct:", json.dumps(expected, indent=1, sort_keys=True))
            print("abridge:", json.dumps(got, indent=1, sort_keys=True))
            sys.exit(1)
        print(f"ok {scenario.__name__}")
    # Streaming without include_usage must not surface usage abridge asked for.
    chunks = stream_without_usage(client(VIA))
    assert all(chunk["usage"] is None for chunk in chunks), chunks
    assert all(chunk["choices"] for chunk in chunks), "no usage-only chunk"
    print("ok usage invisible")
    long_conversation()


main()
