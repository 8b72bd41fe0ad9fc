"""The official `openai` Python SDK's Responses API (`client.responses.create`), pointed
once straight at the provider and once at abridge: every scenario must give the same
result both ways (ids and timestamps aside), and a long stateless conversation through
abridge is compacted without the client noticing anything but the x-abridge-* headers.

Usage: python responses_check.py DIRECT_BASE_URL ABRIDGE_BASE_URL
Prints one line per scenario; exits 1 on the first difference, showing both results.
"""

import json
import sys

from openai import APIStatusError, OpenAI

DIRECT, VIA = sys.argv[1], sys.argv[2]
KEY = "sk-sdk-responses-key"
MODEL = "gpt-4o-mini"
INSTRUCTIONS = "You are terse."
ASK = [{"role": "user", "content": "Name three rivers in Portugal."}]
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
VOLATILE = {"id", "created_at", "item_id", "call_id", "response_id"}


def client(base_url):
    return OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=20)


def stable(value):
    """The value without the fields that differ between two identical requests."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def plain(c):
    return c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, store=False).model_dump()


def string_input(c):
    return c.responses.create(model=MODEL, input="Name a river.", store=False).model_dump()


def streamed(c):
    events = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, stream=True, store=False)
    return [event.model_dump() for event in events]


def tool_round_trip(c):
    first = c.responses.create(model=MODEL, input=ASK, tools=TOOLS, store=False)
    call = next(item for item in first.output if item.type == "function_call")
    followup = ASK + [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Tejo, Douro, Mondego"},
    ]
    second = c.responses.create(model=MODEL, input=followup, tools=TOOLS, store=False)
    return [first.model_dump(), second.model_dump()]


def provider_error(c):
    try:
        c.responses.create(model=MODEL, input=ASK, extra_headers={"x-fake-status": "429"})
    except APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "type": type(e).__name__}
    return {"status": "no error"}


def invalid_input(c):
    try:
        c.responses.create(
            model=MODEL,
            input=ASK + [{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}],
        )
    except APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "type": type(e).__name__}
    return {"status": "no error"}


SCENARIOS = [plain, string_input, streamed, tool_round_trip, provider_error, invalid_input]


def long_conversation():
    """Grows past abridge's threshold (the test sets 2,000 tokens); every answer through
    abridge equals the provider's direct answer to the full input, usage aside."""
    direct, via = client(DIRECT), client(VIA)
    items = [{"role": "user", "content": "Let us plan a long river trip."}]
    compacted = 0
    for n in range(24):
        items.append({"role": "user", "content": f"Step {n}: " + "tell me more about the next river. " * 12})
        stream = n % 2 == 1
        raw = via.responses.with_raw_response.create(
            model=MODEL, instructions=INSTRUCTIONS, input=items, store=False, stream=stream
        )
        if stream:
            events = list(raw.parse())
            got = next(e.response for e in events if e.type == "response.completed").model_dump()
        else:
            got = raw.parse().model_dump()
        expected = direct.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=items, store=False).model_dump()
        if raw.headers.get("x-abridge-compacted") == "true":
            compacted += 1
            assert got["usage"]["input_tokens"] < expected["usage"]["input_tokens"], (got["usage"], expected["usage"])
        got, expected = stable(got), stable(expected)
        for answer in (got, expected):
            answer.pop("usage")
        if got != expected:
            print(f"MISMATCH long_conversation step {n}")
            print("direct:", json.dumps(expected, indent=1, sort_keys=True))
            print("abridge:", json.dumps(got, indent=1, sort_keys=True))
            sys.exit(1)
        items.append({"role": "assistant", "content": got["output"][0]["content"][0]["text"]})
    assert compacted > 0, "the conversation was never compacted"
    print(f"ok long_conversation ({compacted} compacted turns)")


def main():
    direct, via = client(DIRECT), client(VIA)
    for scenario in SCENARIOS:
        expected, got = stable(scenario(direct)), stable(scenario(via))
        if expected != got:
            print(f"MISMATCH {scenario.__name__}")
            print("direct:", json.dumps(expected, indent=1, sort_keys=True))
            print("abridge:", json.dumps(got, indent=1, sort_keys=True))
            sys.exit(1)
        print(f"ok {scenario.__name__}")
    long_conversation()


main()
