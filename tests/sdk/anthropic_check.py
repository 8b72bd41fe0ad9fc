"""The official `anthropic` Python SDK, pointed once straight at the provider and once
at abridge: every scenario must give the same result both ways (ids and usage aside),
and a long conversation through abridge is compacted without the client noticing
anything but the x-abridge-* headers.

Usage: python anthropic_check.py DIRECT_BASE_URL ABRIDGE_BASE_URL  (no /v1: the SDK adds it)
Prints one line per scenario; exits 1 on the first difference, showing both results.
"""

import json
import sys

from anthropic import Anthropic, APIStatusError

DIRECT, VIA = sys.argv[1], sys.argv[2]
KEY = "sk-ant-sdk-test-key"
MODEL = "claude-sonnet-4-5"
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
ASK = [{"role": "user", "content": "Name three rivers in Portugal."}]
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
VOLATILE = {"id", "usage", "request_id", "_request_id"}


def client(base_url):
    return Anthropic(base_url=base_url, api_key=KEY, max_retries=0, timeout=20)


def stable(value):
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def plain(c):
    return c.messages.create(model=MODEL, max_tokens=256, system=SYSTEM, messages=ASK).model_dump()


def streamed(c):
    with c.messages.stream(model=MODEL, max_tokens=256, system=SYSTEM, messages=ASK) as stream:
        events = [event.model_dump() for event in stream]
        final = stream.get_final_message().model_dump()
    return {"events": [e["type"] for e in events], "final": final}


def tool_round_trip(c):
    first = c.messages.create(model=MODEL, max_tokens=256, messages=ASK, tools=TOOLS)
    call = next(b for b in first.content if b.type == "tool_use")
    followup = ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Tejo, Douro"}]},
    ]
    second = c.messages.create(model=MODEL, max_tokens=256, messages=followup, tools=TOOLS)
    return [first.model_dump(), second.model_dump()]


def failure(call):
    try:
        call()
    except APIStatusError as e:
        return {"status": e.status_code, "body": stable(e.body), "type": type(e).__name__}
    return {"status": "no error"}


def provider_error(c):
    return failure(
        lambda: c.messages.create(model=MODEL, max_tokens=16, messages=ASK, extra_headers={"x-fake-status": "429"})
    )


def invalid_input(c):
    lone = ASK + [
        {"role": "assistant", "content": "Let me look."},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "x"}]},
    ]
    return failure(lambda: c.messages.create(model=MODEL, max_tokens=16, messages=lone))


def count_tokens(c):
    return c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK).model_dump()


SCENARIOS = [plain, streamed, tool_round_trip, provider_error, invalid_input, count_tokens]


def long_conversation():
    """Grows past abridge's threshold (the test sets 2,000 tokens); every answer through
    abridge equals the provider's direct answer to the full history, usage aside."""
    direct, via = client(DIRECT), client(VIA)
    messages = [{"role": "user", "content": "Let us plan a long river trip."},
                {"role": "assistant", "content": "Gladly."}]
    compacted = 0
    for n in range(24):
        messages.append({"role": "user", "content": f"Step {n}: " + "tell me more about the next river. " * 12})
        kwargs = dict(model=MODEL, max_tokens=256, system=SYSTEM, messages=messages,
                      extra_headers={"x-fake-strict-alternation": "1"})
        if n % 2 == 1:
            with via.messages.stream(**kwargs) as stream:
                got = stream.get_final_message().model_dump()
                headers = stream.response.headers
        else:
            raw = via.messages.with_raw_response.create(**kwargs)
            got, headers = raw.parse().model_dump(), raw.headers
        expected = direct.messages.create(**kwargs).model_dump()
        if headers.get("x-abridge-compacted") == "true":
            compacted += 1
            total = lambda u: u["input_tokens"] + (u["cache_read_input_tokens"] or 0) + (u["cache_creation_input_tokens"] or 0)
            assert total(got["usage"]) < total(expected["usage"]), (got["usage"], expected["usage"])
        if stable(got) != stable(expected):
            print(f"MISMATCH long_conversation step {n}")
            print("direct:", json.dumps(stable(expected), indent=1, sort_keys=True))
            print("abridge:", json.dumps(stable(got), indent=1, sort_keys=True))
            sys.exit(1)
        messages.append({"role": "assistant", "content": got["content"][0]["text"]})
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
