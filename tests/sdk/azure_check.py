"""The official `openai` Python SDK's `AzureOpenAI` client, pointed once straight at the
provider (the fake, answering Azure's paths as Azure does) and once at abridge: every
scenario must give the same result both ways, and a long conversation through abridge is
compacted without the client noticing anything but the x-abridge-* headers.

- classic: `AzureOpenAI(azure_endpoint=..., api_version=...)`, which calls
  `/openai/deployments/{model}/chat/completions?api-version=...` with an `api-key` header;
- v1: Azure's `/openai/v1/` base. Microsoft documents it for the standard `OpenAI` client
  (chat completions, the deployment named as the model); `AzureOpenAI(base_url=...)`
  is used for the Responses API there. (`AzureOpenAI` puts `/deployments/{model}` into
  chat paths even on the v1 base, where Azure has no such path: both ways give the same
  404, which is checked too.)

Usage: python azure_check.py DIRECT_ENDPOINT ABRIDGE_ENDPOINT (no /openai: the SDK adds it)
Prints one line per scenario; exits 1 on the first difference, showing both results.
"""

import json
import sys

from openai import APIStatusError, AzureOpenAI, OpenAI

DIRECT, VIA = sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/")
KEY = "azure-sdk-test-key"
VERSION = "2024-10-21"
DEPLOYMENT = "gpt-4o-prod"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three rivers in Portugal."},
]
VOLATILE = {"id", "created_at", "item_id", "response_id"}


def classic(endpoint, version=VERSION):
    return AzureOpenAI(azure_endpoint=endpoint, api_version=version, api_key=KEY, max_retries=0, timeout=20)


def v1_azure(endpoint):
    return AzureOpenAI(
        base_url=f"{endpoint}/openai/v1/", api_version="preview", api_key=KEY, max_retries=0, timeout=20
    )


def v1_openai(endpoint):
    return OpenAI(base_url=f"{endpoint}/openai/v1/", api_key=KEY, max_retries=0, timeout=20)


def stable(value):
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def failure(call):
    try:
        call()
    except APIStatusError as e:
        return {"status": e.status_code, "body": e.body, "type": type(e).__name__}
    return {"status": "no error"}


def same(name, direct, via):
    if direct != via:
        print(f"MISMATCH {name}")
        print("direct:", json.dumps(direct, indent=1, sort_keys=True, default=str))
        print("abridge:", json.dumps(via, indent=1, sort_keys=True, default=str))
        sys.exit(1)
    print(f"ok {name}")


def both(name, scenario, make):
    same(name, scenario(make(DIRECT)), scenario(make(VIA)))


def chat(c):
    return c.chat.completions.create(model=DEPLOYMENT, messages=MESSAGES).model_dump()


def stream(c):
    chunks = c.chat.completions.create(model=DEPLOYMENT, messages=MESSAGES, stream=True)
    return [chunk.model_dump() for chunk in chunks]


def models(c):
    return [m.model_dump() for m in c.models.list()]


def errors(make):
    def run(endpoint):
        told = make(endpoint)
        unsupported = classic(endpoint, version="v2")
        return [
            failure(lambda: told.chat.completions.create(
                model=DEPLOYMENT, messages=MESSAGES, extra_headers={"x-fake-status": "429"}
            )),
            failure(lambda: unsupported.chat.completions.create(model=DEPLOYMENT, messages=MESSAGES)),
        ]

    return run


def responses(c):
    answer = c.responses.create(model=DEPLOYMENT, instructions="Be terse.", input="Name a river.", store=False)
    return stable(answer.model_dump())


def long_conversation(name, make):
    """Grows past abridge's threshold (the test sets 3,000 tokens): each answer equals the
    provider's direct answer to the full history, apart from the usage and the id."""
    direct, via = make(DIRECT), make(VIA)
    messages = [MESSAGES[0], {"role": "user", "content": "Let us plan a long river trip."}]
    compacted = 0
    for n in range(24):
        messages.append({"role": "user", "content": f"Step {n}: " + "tell me more about the next river. " * 12})
        raw = via.chat.completions.with_raw_response.create(model=DEPLOYMENT, messages=messages)
        got = raw.parse().model_dump()
        expected = direct.chat.completions.create(model=DEPLOYMENT, messages=messages).model_dump()
        if raw.headers.get("x-abridge-compacted") == "true":
            compacted += 1
            assert got["usage"]["prompt_tokens"] < expected["usage"]["prompt_tokens"]
        for answer in (got, expected):
            answer.pop("usage")
            answer.pop("id")
        if got != expected:
            same(f"{name} step {n}", expected, got)
        messages.append({"role": "assistant", "content": got["choices"][0]["message"]["content"]})
    assert compacted > 0, f"{name}: the conversation was never compacted"
    print(f"ok {name} ({compacted} compacted turns)")


def main():
    both("classic chat", chat, classic)
    assert chat(classic(VIA))["model"] == DEPLOYMENT, "the deployment is the model"
    both("classic stream", stream, classic)
    both("classic models", models, classic)
    same("classic errors", errors(classic)(DIRECT), errors(classic)(VIA))
    long_conversation("classic compacted", classic)

    both("v1 chat", chat, v1_openai)
    both("v1 responses", responses, v1_azure)
    both("v1 azure-client chat (404 both ways)", lambda c: failure(lambda: chat(c)), v1_azure)
    long_conversation("v1 compacted", v1_openai)


main()
