// The official `openai` Node SDK's Responses API (`client.responses.create`), pointed once
// straight at the provider and once at abridge: every scenario must give the same result
// both ways (ids and timestamps aside), and a long stateless conversation through abridge
// is compacted without the client noticing anything but the x-abridge-* headers.
//
// Usage: node responses_check.mjs DIRECT_BASE_URL ABRIDGE_BASE_URL
// Prints one line per scenario; exits 1 on the first difference, showing both results.

import { isDeepStrictEqual } from "node:util";
import OpenAI from "openai";

const [direct, via] = process.argv.slice(2);
const MODEL = "gpt-4o-mini";
const INSTRUCTIONS = "You are terse.";
const ASK = [{ role: "user", content: "Name three rivers in Portugal." }];
const TOOLS = [
  {
    type: "function",
    name: "read_file",
    description: "Read a file",
    parameters: { type: "object", properties: { path: { type: "string" } } },
  },
];
// `output_text` is a convenience the SDK adds to a non-streamed response only.
const VOLATILE = new Set(["id", "created_at", "item_id", "call_id", "response_id", "_request_id", "output_text"]);

const client = (baseURL) => new OpenAI({ baseURL, apiKey: "sk-sdk-responses-key", maxRetries: 0, timeout: 20000 });

function stable(value) {
  if (Array.isArray(value)) return value.map(stable);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([k]) => !VOLATILE.has(k))
        .map(([k, v]) => [k, stable(v)]),
    );
  }
  return value;
}

async function collect(stream) {
  const out = [];
  for await (const event of stream) out.push(event);
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
  plain: (c) => c.responses.create({ model: MODEL, instructions: INSTRUCTIONS, input: ASK, store: false }),
  string_input: (c) => c.responses.create({ model: MODEL, input: "Name a river.", store: false }),
  streamed: async (c) =>
    collect(await c.responses.create({ model: MODEL, instructions: INSTRUCTIONS, input: ASK, stream: true, store: false })),
  tool_round_trip: async (c) => {
    const first = await c.responses.create({ model: MODEL, input: ASK, tools: TOOLS, store: false });
    const call = first.output.find((item) => item.type === "function_call");
    const second = await c.responses.create({
      model: MODEL,
      tools: TOOLS,
      store: false,
      input: [...ASK, call, { type: "function_call_output", call_id: call.call_id, output: "Tejo, Douro, Mondego" }],
    });
    return [first, second];
  },
  provider_error: (c) =>
    failure(c.responses.create({ model: MODEL, input: ASK }, { headers: { "x-fake-status": "429" } })),
  invalid_input: (c) =>
    failure(c.responses.create({ model: MODEL, input: [...ASK, { type: "function_call_output", call_id: "call_nowhere", output: "x" }] })),
};

function mismatch(name, expected, got) {
  console.log(`MISMATCH ${name}`);
  console.log("direct:", JSON.stringify(expected, null, 1));
  console.log("abridge:", JSON.stringify(got, null, 1));
  process.exit(1);
}

async function longConversation() {
  const [d, v] = [client(direct), client(via)];
  const items = [{ role: "user", content: "Let us plan a long river trip." }];
  let compacted = 0;
  for (let n = 0; n < 24; n++) {
    items.push({ role: "user", content: `Step ${n}: ` + "tell me more about the next river. ".repeat(12) });
    const stream = n % 2 === 1;
    const params = { model: MODEL, instructions: INSTRUCTIONS, input: items, store: false };
    const { data, response } = await v.responses.create({ ...params, stream }).withResponse();
    const got = stream ? (await collect(data)).find((e) => e.type === "response.completed").response : data;
    const expected = await d.responses.create(params);
    if (response.headers.get("x-abridge-compacted") === "true") {
      compacted++;
      if (!(got.usage.input_tokens < expected.usage.input_tokens)) mismatch(`usage at step ${n}`, expected.usage, got.usage);
    }
    const [g, e] = [stable({ ...got, usage: null }), stable({ ...expected, usage: null })];
    if (!isDeepStrictEqual(g, e)) mismatch(`long_conversation step ${n}`, e, g);
    items.push({ role: "assistant", content: got.output[0].content[0].text });
  }
  if (compacted === 0) mismatch("long_conversation", "compacted turns", "none");
  console.log(`ok long_conversation (${compacted} compacted turns)`);
}

const [d, v] = [client(direct), client(via)];
for (const [name, scenario] of Object.entries(scenarios)) {
  const expected = stable(JSON.parse(JSON.stringify(await scenario(d))));
  const got = stable(JSON.parse(JSON.stringify(await scenario(v))));
  if (!isDeepStrictEqual(expected, got)) mismatch(name, expected, got);
  console.log(`ok ${name}`);
}
await longConversation();
