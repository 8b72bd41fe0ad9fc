"""The official `anthropic` Python SDK's compaction and context-management betas
(`compact-2026-01-12`, `context-management-2025-06-27`) against abridge in front of a
server that lacks them: the answers parse as the SDK's own types, a compaction block
comes first (whole and streamed), a paused compaction stops with `compaction`, the block
sent back on the next turn is taken, an invalid edit is the SDK's BadRequestError, and
cleared tool uses are reported in `context_management.applied_edits`.

Usage: python anthropic_compaction.py ABRIDGE_BASE_URL [TIMEOUT_SECS] [--count]  (no /v1:
the SDK adds it; the timeout of each call, 60 s unless given: a real model on a small
machine needs minutes; --count: also count tokens with a block sent back and an edit,
for a server that answers /v1/messages/count_tokens)
Prints one line per scenario; exits 1 on the first failure.
"""

import sys

from anthropic import Anthropic, BadRequestError

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
VIA = ARGS[0]
TIMEOUT = float(ARGS[1]) if len(ARGS) > 1 else 60
COUNT = "--count" in sys.argv
MODEL = "claude-sonnet-4-5"
BETAS = ["compact-2026-01-12", "context-management-2025-06-27"]
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
COMPACT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}}


def client():
    return Anthropic(base_url=VIA, api_key="sk-ant-sdk-compaction", max_retries=0, timeout=TIMEOUT)


def history(reads):
    """An agent's conversation: one ask, then `reads` file reads of about 2,500 tokens each."""
    messages = [{"role": "user", "content": "Review the parser in src/ and list its bugs."}]
    for n in range(reads):
        call = f"toolu_{n:04}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading file {n}."},
                    {"type": "tool_use", "id": call, "name": "read_file",
                     "input": {"path": f"src/parser_{n}.rs"}},
                ],
            }
        )
        body = f"// src/parser_{n}.rs\n" + f"fn parse_{n}(input: &str) -> Result<Ast, Error> {{ todo!() }}\n" * 160
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": body}]}
        )
    return messages


def check(name, ok, detail):
    if not ok:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok {name}")


def main():
    c = client()
    long = history(30)

    whole = c.beta.messages.create(
        model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=long,
        context_management={"edits": [COMPACT]},
    )
    first = whole.content[0]
    check("compaction_whole", first.type == "compaction" and bool(first.content)
          and any(b.type != "compaction" for b in whole.content[1:]), whole.model_dump())

    # The block sent back with the next ask: taken, and the conversation goes on below
    # the trigger (everything before the block is dropped).
    after = long + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
        {"role": "user", "content": "Which of those bugs is the worst?"},
    ]
    nxt = c.beta.messages.create(
        model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=after,
        context_management={"edits": [COMPACT]},
    )
    check("block_sent_back", nxt.content and nxt.content[0].type != "compaction", nxt.model_dump())

    if COUNT:
        # Counted as /v1/messages forwards it: the block expanded, the edit applied, and
        # the count before the edit reported as Anthropic's own type.
        counted = c.beta.messages.count_tokens(
            model=MODEL, betas=BETAS, tools=TOOLS, messages=after,
            context_management={"edits": [{
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 1000},
                "keep": {"type": "tool_uses", "value": 1},
            }]},
        )
        management = counted.context_management
        check("count_tokens_served", counted.input_tokens > 0 and management is not None
              and management.original_input_tokens >= counted.input_tokens, counted.model_dump())

    with c.beta.messages.stream(
        model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=long,
        context_management={"edits": [COMPACT]},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    check("compaction_streamed", final.content[0].type == "compaction"
          and bool(final.content[0].content) and "message_stop" in kinds, final.model_dump())

    paused = c.beta.messages.create(
        model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=long,
        context_management={"edits": [dict(COMPACT, pause_after_compaction=True)]},
    )
    check("paused", paused.stop_reason == "compaction" and len(paused.content) == 1
          and paused.content[0].type == "compaction", paused.model_dump())

    try:
        c.beta.messages.create(
            model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=long,
            context_management={"edits": [dict(COMPACT, trigger={"type": "input_tokens", "value": 1000})]},
        )
        check("invalid_edit", False, "accepted a trigger under 50,000")
    except BadRequestError as e:
        check("invalid_edit", e.status_code == 400 and "trigger" in str(e), str(e))

    cleared = c.beta.messages.create(
        model=MODEL, max_tokens=256, betas=BETAS, tools=TOOLS, messages=history(8),
        context_management={"edits": [{
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 5000},
            "keep": {"type": "tool_uses", "value": 2},
        }]},
    )
    edits = cleared.context_management.applied_edits if cleared.context_management else []
    check("clear_tool_uses", len(edits) == 1 and edits[0].type == "clear_tool_uses_20250919"
          and edits[0].cleared_tool_uses == 6, cleared.model_dump())


main()
