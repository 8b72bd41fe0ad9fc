// The admin dashboard in headless Chromium (Debian's chromium, driven by playwright-core):
// it loads without console errors, shows the same numbers as /admin/stats, drills down
// into a conversation, lists recalls, and leaves a screenshot.
//
// Usage: node check.mjs ADMIN_BASE_URL TOKEN SCREENSHOT_PATH

import { chromium } from "playwright-core";

const [base, token, screenshot] = process.argv.slice(2);
const fail = (message) => {
  console.log("FAIL " + message);
  process.exit(1);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (msg) => { if (msg.type() === "error") errors.push(msg.text()); });
  page.on("pageerror", (err) => errors.push(String(err)));

  await page.goto(base + "/admin/");
  await page.fill("#token", token);
  await page.click("#login-form button");
  await page.waitForSelector("body[data-loaded=true]", { timeout: 10000 });

  // The page refreshes every 2 s; read it right after a refresh and compare with the API.
  const stats = await (await fetch(base + "/admin/stats", { headers: { Authorization: "Bearer " + token } })).json();
  await page.waitForTimeout(2500);
  const shown = await page.$$eval("#cards .card", (cards) =>
    Object.fromEntries(cards.map((c) => [c.dataset.key, c.querySelector(".value").textContent])),
  );
  const c = stats.counters;
  const expected = {
    requests: c.requests,
    chat_requests: c.chat_requests,
    compactions: c.compactions.flat().reduce((a, b) => a + b, 0),
    checkpoints_applied: c.checkpoints_applied,
    tokens_saved: c.tokens_saved,
    client_prompt_tokens: c.client_prompt_tokens,
    prompt_tokens_reported: c.prompt_tokens_reported,
    cached_tokens_reported: c.cached_tokens_reported,
    summary_calls: c.summary_calls,
    summary_tokens: c.summary_input_tokens + c.summary_output_tokens,
    summary_repairs: c.summary_repairs,
    recalls: c.recalls,
    recall_tokens: c.recall_tokens,
    active_conversations: stats.active_conversations,
  };
  for (const [key, value] of Object.entries(expected)) {
    const text = (shown[key] || "").replace(/,/g, "");
    if (text !== String(value)) fail(`card ${key} shows ${shown[key]}, /admin/stats says ${value}`);
    console.log(`ok ${key} = ${value}`);
  }
  // The money cards: /admin/stats' savings, in dollars.
  const usd = (n) => (n < 0 ? "−$" : "$") + Math.abs(n).toFixed(4);
  const s = stats.savings;
  const money = {
    net_saved: s.usd.net_saved,
    cost_direct: s.usd.direct,
    cost_through: s.usd.forwarded + s.usd.summaries + s.usd.recalls,
    cost_summaries: s.usd.summaries,
  };
  for (const [key, value] of Object.entries(money)) {
    if (shown[key] !== usd(value)) fail(`card ${key} shows ${shown[key]}, /admin/stats says ${usd(value)}`);
    console.log(`ok ${key} = ${shown[key]}`);
  }
  if (!(s.usd.direct > 0 && s.usd.forwarded > 0)) fail("the test traffic is priced: " + JSON.stringify(s));
  if (expected.compactions < 1) fail("the test traffic should have compacted something");
  if (expected.recalls < 1) fail("the test traffic should have recalled something");

  // The conversation that recalled shows it in the list.
  const listed = await page.$$eval("#conversations tbody tr", (rows) =>
    rows.map((r) => [...r.children].map((td) => td.textContent)),
  );
  if (!listed.some((cells) => Number(cells[6]) >= 1)) fail("no conversation lists its recalls: " + JSON.stringify(listed));
  console.log("ok recalls listed");

  const rows = await page.$$("#compactions tbody tr");
  if (rows.length < 1) fail("no recent compactions listed");
  // The agent's conversation: the one with the most compactions.
  const most = listed.reduce((best, cells, i) => (Number(cells[4]) > Number(listed[best][4]) ? i : best), 0);
  await (await page.$$("#conversations tbody tr"))[most].click();
  await page.waitForSelector("#detail:not(.hidden) pre", { timeout: 5000 });
  const detail = await page.textContent("#detail");
  if (!/replaced/.test(detail)) fail("conversation detail shows no checkpoint: " + detail);
  if (!/last reported [0-9,]+ prompt tokens for [0-9,]+ messages/.test(detail)) fail("conversation detail shows no usage: " + detail);
  console.log("ok drill-down");
  // Its savings and its plot: the client's prompt against the forwarded one, per request,
  // a dot where a compaction took effect.
  const savings = await page.textContent("#detail-savings");
  if (!/chat · [0-9,]+ requests · clients sent [0-9,]+ prompt tokens, [0-9,]+ forwarded .* net saved −?\$[0-9.]+/.test(savings)) fail("no savings in the detail: " + savings);
  // What was decided for its latest request (the cost model's figures when it priced it).
  const decided = await page.textContent("#detail-decision");
  if (!/^latest request \(.+\): (cost|size) policy, (compacted|not compacted)/.test(decided)) fail("no decision in the detail: " + decided);
  const lines = await page.$$eval("#detail-plot polyline", (ls) => ls.map((l) => [l.getAttribute("class"), l.getAttribute("points").split(" ").length]));
  if (lines.length !== 2 || lines.some(([, n]) => n < 10)) fail("the plot has no two series of the requests: " + JSON.stringify(lines));
  const dots = await page.$$eval("#detail-plot circle.compaction", (d) => d.length);
  if (dots < 1) fail("the plot marks no compaction");
  console.log(`ok plot: ${lines[0][1]} requests, ${dots} compactions marked`);

  await page.screenshot({ path: screenshot, fullPage: true });
  console.log("ok screenshot " + screenshot);
} finally {
  await browser.close();
}
if (errors.length) fail("console errors: " + JSON.stringify(errors));
console.log("ok no console errors");
