// The official `openai` Node SDK, pointed once straight at the provider and once at
// abridge: every scenario must give the same result both ways.
//
// Usage: node check.mjs DIRECT_BASE_URL ABRIDGE_BASE_URL
// Prints one line per scenario; exits 1 on the first difference, showing both results.

import { isDeepStrictEqual } from "node:util";
import OpenAI from "openai";

const [direct, via] = process.argv.slice(2);
const MODEL = "gpt-4o-mini";
const MESSAGES = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Name three rivers in Portugal." },
];
const TOOLS = [
  {
    type: "function",
    function: {
      name: "read_file",
      description: "Read a file",
      parameters: { type: "object", properties: { path: { type: "string" } } },
    },
  },
];

const client = (baseURL) => new OpenAI({ baseURL, apiKey: "sk-sdk-test-key", maxRetries: 0, timeout: 20000 });

async function collect(stream) {
  const out = [];
  for await (const chunk of stream) out.push(chunk);
  return out;
}

async function failure(promise) {
  try {
    await promise;
    return { status: "no error" };
  } catch (e) {
    return { status: e.status, error: e.error, name: e.constructor.name };
  }
}

const scenarios = {
  plain: (c) => c.chat.completions.create({ model: MODEL, messages: MESSAGES }),
  stream_without_usage: async (c) => collect(await c.chat.completions.create({ model: MODEL, messages: MESSAGES, stream: true })),
  stream_with_usage: async (c) =>
    collect(
      await c.chat.completions.create({ model: MODEL, messages: MESSAGES, stream: true, stream_options: { include_usage: true } }),
    ),
  tool_round_trip: async (c) => {
    const first = await c.chat.completions.create({ model: MODEL, messages: MESSAGES, tools: TOOLS });
    const message = first.choices[0].message;
    const second = await c.chat.completions.create({
      model: MODEL,
      tools: TOOLS,
      messages: [...MESSAGES, message, { role: "tool", tool_call_id: message.tool_calls[0].id, content: "Tejo, Douro, Mondego" }],
    });
    return [first, second];
  },
  streamed_tool_call: async (c) => collect(await c.chat.completions.create({ model: MODEL, messages: MESSAGES, tools: TOOLS, stream: true })),
  provider_error: (c) =>
    failure(c.chat.completions.create({ model: MODEL, messages: MESSAGES }, { headers: { "x-fake-status": "429" } })),
  context_error: (c) =>
    failure(
      c.chat.completions.create(
        { model: MODEL, messages: [...MESSAGES, { role: "user", content: "x ".repeat(5000) }] },
        { headers: { "x-fake-window": "100" } },
      ),
    ),
  models: async (c) => {
    const out = [];
    for await (const m of c.models.list()) out.push(m);
    return out;
  },
  embeddings: (c) => c.embeddings.create({ model: "text-embedding-3-small", input: ["alpha", "beta"] }),
};

const d = client(direct);
const v = client(via);
for (const [name, run] of Object.entries(scenarios)) {
  const expected = JSON.parse(JSON.stringify(await run(d)));
  const got = JSON.parse(JSON.stringify(await run(v)));
  if (!isDeepStrictEqual(expected, got)) {
    console.log(`MISMATCH ${name}`);
    console.log("direct:", JSON.stringify(expected, null, 1));
    console.log("abridge:", JSON.stringify(got, null, 1));
    process.exit(1);
  }
  console.log(`ok ${name}`);
}
const chunks = await scenarios.stream_without_usage(v);
if (chunks.some((c) => c.usage) || chunks.some((c) => c.choices.length === 0)) {
  console.log("MISMATCH usage visible", JSON.stringify(chunks));
  process.exit(1);
}
console.log("ok usage invisible");

// A conversation that grows past abridge's threshold (the test sets 2,000 tokens): through
// abridge it is compacted, and the client notices nothing but the x-abridge-* headers —
// each answer equals the provider's direct answer to the full history, apart from the
// usage (fewer prompt tokens) and the id (derived from what was sent).
const messages = [MESSAGES[0], { role: "user", content: "Let us plan a long river trip." }];
let compacted = 0;
for (let n = 0; n < 24; n++) {
  messages.push({ role: "user", content: `Step ${n}: ` + "tell me more about the next river. ".repeat(12) });
  const { data: got, response } = await v.chat.completions.create({ model: MODEL, messages }).withResponse();
  const expected = await d.chat.completions.create({ model: MODEL, messages });
  if (response.headers.get("x-abridge-compacted") === "true") {
    compacted++;
    if (!(got.usage.prompt_tokens < expected.usage.prompt_tokens)) {
      console.log("MISMATCH long_conversation usage", got.usage, expected.usage);
      process.exit(1);
    }
  }
  const strip = ({ usage, id, ...rest }) => JSON.parse(JSON.stringify(rest));
  if (!isDeepStrictEqual(strip(got), strip(expected))) {
    console.log(`MISMATCH long_conversation step ${n}`, JSON.stringify(strip(expected)), JSON.stringify(strip(got)));
    process.exit(1);
  }
  messages.push({ role: "assistant", content: got.choices[0].message.content });
}
if (compacted === 0) {
  console.log("MISMATCH long_conversation never compacted");
  process.exit(1);
}
console.log(`ok long_conversation (${compacted} compacted turns)`);
