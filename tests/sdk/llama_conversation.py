"""A conversation with a real model (llama.cpp's llama-server) through abridge, with the
official `openai` Python SDK: it grows past abridge's threshold and must keep working.

Usage: python llama_conversation.py ABRIDGE_BASE_URL THRESHOLD TURNS
Prints one JSON object per turn, then a JSON summary line; exits 1 if a check fails:
- every turn gets a real (non-empty) answer, streamed every third turn;
- after the first compacted turn the provider-reported prompt_tokens drops and every
  later turn stays under the threshold.
"""

import json
import sys

from openai import OpenAI

BASE, THRESHOLD, TURNS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = OpenAI(base_url=BASE, api_key="sk-local", max_retries=0, timeout=300)
TOPICS = ["rivers", "mountains", "castles", "bridges", "islands", "forests", "harbours", "lighthouses"]

messages = [{"role": "system", "content": "You are a concise travel guide. Answer in one short sentence."}]
turns = []
for n in range(TURNS):
    topic = TOPICS[n % len(TOPICS)]
    messages.append({
        "role": "user",
        "content": f"Question {n + 1}: name one famous place in Portugal known for its {topic}. "
        + "Background for this question: I am planning a slow trip by train and bus, staying "
        + "two nights in each town, and I care about walking routes and local food. " * 2,
    })
    streamed = n % 3 == 2
    if streamed:
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2", messages=messages, max_tokens=16, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage:
                usage = chunk.usage
        prompt_tokens = usage.prompt_tokens if usage else None
    else:
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2", messages=messages, max_tokens=16, temperature=0,
        )
        reply = raw.parse()
        text, prompt_tokens = reply.choices[0].message.content or "", reply.usage.prompt_tokens
    headers = raw.headers
    turn = {
        "turn": n + 1,
        "streamed": streamed,
        "prompt_tokens": prompt_tokens,
        "compacted": headers.get("x-abridge-compacted") == "true",
        "strategy": headers.get("x-abridge-strategy"),
        "note": headers.get("x-abridge-note"),
        "answer": text.strip()[:80],
    }
    print(json.dumps(turn), flush=True)
    turns.append(turn)
    messages.append({"role": "assistant", "content": text or "(no answer)"})

failures = []
if any(not t["answer"] for t in turns):
    failures.append("a turn got no answer")
compacted = [i for i, t in enumerate(turns) if t["compacted"]]
if not compacted:
    failures.append("never compacted")
else:
    first = compacted[0]
    peak = max(t["prompt_tokens"] or 0 for t in turns[:first]) if first else 0
    after = [t["prompt_tokens"] for t in turns[first:] if t["prompt_tokens"] is not None]
    if first and after and after[0] >= peak:
        failures.append(f"prompt_tokens did not drop at the first compaction ({peak} -> {after[0]})")
    over = [t for t in turns[first:] if t["prompt_tokens"] is not None and t["prompt_tokens"] > THRESHOLD]
    if over:
        failures.append(f"over the threshold after compaction: {over}")
    if not all(t["compacted"] for t in turns[first:]):
        failures.append("a turn after the first compaction was not compacted")
if any(t["prompt_tokens"] is None for t in turns):
    failures.append("a turn reported no usage")
print(json.dumps({"failures": failures, "compacted_turns": len(compacted),
                  "strategies": sorted({t["strategy"] for t in turns if t["strategy"]}),
                  "notes": sorted({t["note"] for t in turns if t["note"]})}))
sys.exit(1 if failures else 0)
