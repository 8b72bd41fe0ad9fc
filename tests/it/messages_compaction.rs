//! Anthropic's compaction (`compact_20260112`) and context editing
//! (`clear_thinking_20251015`, `clear_tool_uses_20250919`) on `POST /v1/messages`, as the
//! Anthropic SDKs and Claude Code send them, behind a server that lacks them (the fake
//! provider: `context_management` ignored, a `compaction` block refused with a 400):
//! abridge checks the edits, applies them to what it forwards, compacts over the
//! trigger, expands its block when it comes back (to another replica on the same Redis,
//! or after a restart), and answers as Anthropic does; behind a provider that has them
//! (`native`), everything passes untouched.

use abridge::config::{CompactionMode, Config, ProviderCompaction};
use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider, Recorded, thinking_signature};
use serde_json::{Value, json};

use crate::common::redis::RedisServer;
use crate::common::{Proxy, client, config_for};
use crate::provider_apis::events;

pub(crate) fn config(url: &str, mode: ProviderCompaction) -> Config {
    let mut config = config_for(url);
    config.provider_apis.messages_compaction = mode;
    // Only the provider API is under test: abridge's own compaction stays out.
    config.compaction.mode = CompactionMode::Off;
    config
}

async fn setup(mode: ProviderCompaction) -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url(), mode)).await;
    (provider, proxy)
}

pub(crate) async fn post(proxy: &Proxy, body: &Value) -> reqwest::Response {
    client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "compact-2026-01-12,context-management-2025-06-27",
        )
        .json(body)
        .send()
        .await
        .unwrap()
}

pub(crate) fn request(messages: &[Value], edits: Value, stream: bool) -> Value {
    json!({"model": "local-model", "max_tokens": 64, "stream": stream, "messages": messages,
        "context_management": {"edits": edits}})
}

fn forwarded(provider: &FakeProvider) -> Vec<Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/messages"))
        .collect()
}

fn ask(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn thinking(text: &str) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": thinking_signature(text)})
}

/// A tool round: the call (after its thinking) and its result.
fn tool_round(n: u32, output: &str) -> [Value; 2] {
    let id = format!("toolu_{n}");
    [
        json!({"role": "assistant", "content": [thinking(&format!("read f{n}")),
            {"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("/f{n}")}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": output}]}),
    ]
}

#[tokio::test]
async fn an_invalid_edit_is_refused_in_anthropics_words_and_nothing_is_forwarded() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let edits = json!([{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]);
    let answer = post(&proxy, &request(&[ask("hi")], edits, false)).await;
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(
        body["error"]["message"],
        "context_management.edits.1: `clear_thinking_20251015` must be the first strategy in `context_management.edits`"
    );
    let edits =
        json!([{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 10}}]);
    let answer = post(&proxy, &request(&[ask("hi")], edits, false)).await;
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "context_management.edits.0.trigger.value: Input should be greater than or equal to 50000"
    );
    assert!(forwarded(&provider).is_empty());
}

#[tokio::test]
async fn old_thinking_is_cleared_before_forwarding_and_reported() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let mut messages = vec![ask("read the files")];
    messages.extend(tool_round(1, "one"));
    messages.push(json!({"role": "assistant", "content": [thinking("done"), {"type": "text", "text": "Read."}]}));
    messages.push(ask("and the next"));
    messages.extend(tool_round(2, "two"));
    let edits = json!([{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]);
    let answer = post(&proxy, &request(&messages, edits, false)).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    let applied = &answer["context_management"]["applied_edits"];
    assert_eq!(applied[0]["type"], "clear_thinking_20251015", "{answer}");
    assert_eq!(applied[0]["cleared_thinking_turns"], 1);
    assert!(applied[0]["cleared_input_tokens"].as_u64().unwrap() > 0);
    let sent = forwarded(&provider).pop().unwrap().json();
    assert!(sent.get("context_management").is_none(), "not forwarded");
    let thinking = |m: &Value| m["content"].to_string().contains("\"thinking\"");
    let sent = sent["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), messages.len());
    assert!(
        !thinking(&sent[1]) && !thinking(&sent[3]),
        "the earlier turn's cleared"
    );
    assert_eq!(
        sent[5], messages[5],
        "the current tool loop keeps its thinking"
    );
}

#[tokio::test]
async fn old_tool_results_are_cleared_with_pairs_intact_and_reported_when_streamed() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let mut messages = vec![ask("read them all")];
    for n in 1..=4 {
        messages.extend(tool_round(n, &format!("contents of f{n} ").repeat(40)));
    }
    let edits = json!([{"type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 1}}]);
    let answer = post(&proxy, &request(&messages, edits, true)).await;
    assert_eq!(
        answer.status(),
        200,
        "the fake accepts the pairs as forwarded"
    );
    let events = events(&answer.text().await.unwrap());
    let (_, delta) = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    let applied = &delta["context_management"]["applied_edits"];
    assert_eq!(applied[0]["type"], "clear_tool_uses_20250919", "{delta}");
    assert_eq!(applied[0]["cleared_tool_uses"], 3);
    assert_eq!(events.last().unwrap().0, "message_stop");
    let sent = forwarded(&provider).pop().unwrap().json();
    let sent = sent["messages"].as_array().unwrap();
    for n in 1..=4usize {
        let result = &sent[2 * n]["content"][0];
        assert_eq!(result["tool_use_id"], format!("toolu_{n}"));
        let kept = result["content"].as_str().unwrap().contains("contents of");
        assert_eq!(kept, n == 4, "tool result {n}: {result}");
    }
}

/// A history over 50,000 input tokens: an early ask, many long tool rounds, a newest ask.
pub(crate) fn long_history() -> Vec<Value> {
    let mut messages = vec![ask("Port the parser in src/parser.rs to the new lexer")];
    for n in 1..=24 {
        messages.extend(tool_round(
            n,
            &format!("fn parse_{n}() {{ lexer.next(); }} ").repeat(400),
        ));
    }
    messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Ported every function."}]}));
    messages.push(ask("Now run the tests"));
    messages
}

pub(crate) fn compact_edit(pause: bool) -> Value {
    json!([{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000},
        "pause_after_compaction": pause, "instructions": "Keep the file names."}])
}

/// What the fake was asked after a compaction: the summary, then the newest ask.
fn assert_compacted(sent: &Value) {
    let messages = sent["messages"].as_array().unwrap();
    let text = sent["messages"].to_string();
    assert!(
        !text.contains("tool_result"),
        "the history is not forwarded"
    );
    assert!(text.len() < 20_000, "{} bytes forwarded", text.len());
    assert!(
        messages[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Summary of the earlier conversation"),
        "{}",
        messages[0]
    );
    assert_eq!(messages.last().unwrap(), &ask("Now run the tests"));
    assert!(sent.get("context_management").is_none());
}

#[tokio::test]
async fn over_the_trigger_the_answer_starts_with_a_compaction_block() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let answer = post(
        &proxy,
        &request(&long_history(), compact_edit(false), false),
    )
    .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["x-abridge-compaction"],
        "served by abridge"
    );
    let answer: Value = answer.json().await.unwrap();
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "compaction", "{answer}");
    let summary = content[0]["content"].as_str().unwrap();
    assert!(
        summary.contains("Keep the file names."),
        "instructions passed: {summary}"
    );
    assert!(
        content[0]["encrypted_content"]
            .as_str()
            .unwrap()
            .starts_with("abridge.v1.")
    );
    assert_eq!(content[1]["type"], "text");
    assert_eq!(answer["stop_reason"], "end_turn");
    let iterations = answer["usage"]["iterations"].as_array().unwrap();
    assert_eq!(iterations[0]["type"], "compaction");
    assert_eq!(iterations[1]["type"], "message");
    assert_eq!(
        iterations[1]["input_tokens"],
        answer["usage"]["input_tokens"]
    );
    assert_eq!(answer["context_management"]["applied_edits"], json!([]));
    assert_compacted(&forwarded(&provider).pop().unwrap().json());
}

#[tokio::test]
async fn a_streamed_compaction_comes_first_and_the_upstreams_blocks_shift() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let answer = post(&proxy, &request(&long_history(), compact_edit(false), true)).await;
    assert_eq!(answer.status(), 200);
    let events = events(&answer.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..5],
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start"
        ]
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "compaction", "content": null})
    );
    let delta = &events[2].1["delta"];
    assert_eq!(delta["type"], "compaction_delta");
    assert!(
        delta["content"]
            .as_str()
            .unwrap()
            .contains("Keep the file names.")
    );
    assert!(
        delta["encrypted_content"]
            .as_str()
            .unwrap()
            .starts_with("abridge.v1.")
    );
    for (name, data) in &events[4..] {
        if name.starts_with("content_block") {
            assert!(data["index"].as_u64().unwrap() >= 1, "shifted: {data}");
        }
    }
    let (_, end) = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    let iterations = end["usage"]["iterations"].as_array().unwrap();
    assert_eq!(iterations.len(), 2);
    assert_eq!(iterations[0]["type"], "compaction");
    assert_eq!(
        iterations[1]["output_tokens"],
        end["usage"]["output_tokens"]
    );
    assert_compacted(&forwarded(&provider).pop().unwrap().json());
}

#[tokio::test]
async fn paused_after_compaction_the_block_is_the_whole_answer() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let answer = post(&proxy, &request(&long_history(), compact_edit(true), false)).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["stop_reason"], "compaction");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 1);
    assert_eq!(content[0]["type"], "compaction");
    let streamed = post(&proxy, &request(&long_history(), compact_edit(true), true)).await;
    let events = events(&streamed.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[4].1["delta"]["stop_reason"], "compaction");
    assert!(
        forwarded(&provider).is_empty(),
        "nothing asked of the upstream"
    );
}

#[tokio::test]
async fn the_block_sent_back_is_expanded_and_what_came_before_it_dropped() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let first = post(
        &proxy,
        &request(&long_history(), compact_edit(false), false),
    )
    .await;
    let first: Value = first.json().await.unwrap();
    // The client appends the answer and asks again, as Anthropic's guide says.
    let mut messages = long_history();
    messages.push(json!({"role": "assistant", "content": first["content"]}));
    messages.push(ask("Commit it"));
    let next = post(&proxy, &request(&messages, compact_edit(false), false)).await;
    assert_eq!(
        next.status(),
        200,
        "the fake refuses a compaction block: none reached it"
    );
    let next: Value = next.json().await.unwrap();
    assert_eq!(
        next["content"][0]["type"], "text",
        "under the trigger now: no new compaction"
    );
    let sent = forwarded(&provider).pop().unwrap().json();
    let text = sent["messages"].to_string();
    assert!(
        !text.contains("\"compaction\"") && !text.contains("tool_result"),
        "{text}"
    );
    let messages = sent["messages"].as_array().unwrap();
    assert!(
        messages[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("compacted by abridge")
    );
    assert_eq!(messages.last().unwrap(), &ask("Commit it"));
}

/// The block `proxy` answers `long_history` over the trigger with, whole or streamed,
/// as the client appends it.
async fn block_from(proxy: &Proxy, stream: bool) -> Value {
    let answer = post(
        proxy,
        &request(&long_history(), compact_edit(false), stream),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let block = match stream {
        true => {
            let events = events(&answer.text().await.unwrap());
            let delta = &events[2].1["delta"];
            assert_eq!(delta["type"], "compaction_delta");
            json!({"type": "compaction", "content": delta["content"],
                "encrypted_content": delta["encrypted_content"]})
        }
        false => answer.json::<Value>().await.unwrap()["content"][0].clone(),
    };
    assert_eq!(block["type"], "compaction");
    let token = block["encrypted_content"].as_str().unwrap();
    assert!(token.starts_with("abridge.v1."), "{token}");
    block
}

/// `block` sent back to `proxy` after the history it replaced, with a new ask: the
/// answer's note, and what reached the upstream.
async fn sent_back(
    proxy: &Proxy,
    provider: &FakeProvider,
    block: &Value,
) -> (Option<String>, Value) {
    let mut messages = long_history();
    messages.push(
        json!({"role": "assistant", "content": [block, {"type": "text", "text": "Ported."}]}),
    );
    messages.push(ask("Commit it"));
    let answer = post(proxy, &request(&messages, compact_edit(false), false)).await;
    assert_eq!(answer.status(), 200, "the fake refuses a compaction block");
    let note = answer.headers().get("x-abridge-note");
    let note = note.map(|n| n.to_str().unwrap().to_owned());
    (note, forwarded(provider).pop().unwrap().json())
}

/// The block expanded into its summary, what came before it dropped, nothing of the
/// beta API forwarded.
fn assert_expanded(sent: &Value) {
    let text = sent.to_string();
    assert!(sent.get("context_management").is_none(), "{text}");
    assert!(!text.contains("\"compaction\""), "{text}");
    assert!(
        !text.contains("tool_result"),
        "what the block replaced: {text}"
    );
    let messages = sent["messages"].as_array().unwrap();
    let summary = messages[0]["content"][0]["text"].as_str().unwrap();
    assert!(summary.contains("compacted by abridge"), "{summary}");
    assert!(summary.contains("Keep the file names."), "{summary}");
    assert!(summary.contains("src/parser.rs"), "{summary}");
    assert_eq!(messages.last().unwrap(), &ask("Commit it"));
}

#[tokio::test]
async fn the_block_is_read_on_another_replica_and_after_a_restart() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let serving = config(&provider.url(), ProviderCompaction::Serve);
    // Two replicas on one Redis (the secret the first published): B reads A's block.
    let redis = RedisServer::start();
    let mut shared = serving.clone();
    shared.store.redis_url = Some(Secret::new(redis.url()));
    // On a busy machine a Redis call can outlast the default 200 ms: the replica that
    // asked for the shared secret would go on unidentified (fail-open) and read the
    // block as plain text. What is tested here is the secret, not the store's deadline.
    shared.store.response_timeout_ms = 5_000;
    let a = Proxy::start_with(shared.clone()).await;
    let b = Proxy::start_with(shared).await;
    for stream in [false, true] {
        let block = block_from(&a, stream).await;
        let (note, sent) = sent_back(&b, &provider, &block).await;
        let note = note.unwrap_or_default();
        assert!(
            !note.contains("plain text"),
            "opened as abridge's own: {note}"
        );
        assert_expanded(&sent);
    }

    // In-process store, a configured secret: a restarted proxy reads it.
    let mut alone = serving.clone();
    alone.identity.secret = Some(Secret::new("the deployment's identity secret"));
    let before = Proxy::start_with(alone.clone()).await;
    let blocks = [
        block_from(&before, false).await,
        block_from(&before, true).await,
    ];
    before.shutdown().await.unwrap();
    let after = Proxy::start_with(alone).await;
    for block in &blocks {
        let (note, sent) = sent_back(&after, &provider, block).await;
        assert!(
            !note.unwrap_or_default().contains("plain text"),
            "opened after the restart"
        );
        assert_expanded(&sent);
    }
    // Without one, a restart makes another secret: the block is read as plain text
    // (its `content`), and the client told.
    let stranger = Proxy::start_with(serving).await;
    let (note, sent) = sent_back(&stranger, &provider, &blocks[0]).await;
    assert!(note.unwrap().contains("plain text"));
    assert!(!sent.to_string().contains("\"compaction\""));
}

#[tokio::test]
async fn native_forwards_context_management_untouched() {
    let (provider, proxy) = setup(ProviderCompaction::Native).await;
    let edits = json!([{"type": "clear_thinking_20251015"}, {"type": "compact_20260112"}]);
    let body = request(&[ask("hi")], edits, false);
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert!(answer.get("context_management").is_none());
    assert_eq!(forwarded(&provider).pop().unwrap().json(), body);
    // A compaction block goes on too, and this server (lacking it) refuses it.
    let block = json!({"type": "compaction", "content": "earlier", "encrypted_content": "opaque"});
    let messages = [
        ask("hi"),
        json!({"role": "assistant", "content": [block]}),
        ask("again"),
    ];
    let answer = post(&proxy, &request(&messages, json!([]), false)).await;
    assert_eq!(answer.status(), 400);
    let answer: Value = answer.json().await.unwrap();
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Input tag 'compaction'")
    );
}

/// A Claude Code-like `anthropic-beta` over two lines, with both served values.
const BETAS: [&str; 2] = [
    "claude-code-20250219, compact-2026-01-12 ,oauth-2025-04-20",
    "context-management-2025-06-27,interleaved-thinking-2025-05-14",
];

/// `body` posted with `betas` as its `anthropic-beta` lines; the lines the upstream saw.
async fn betas_seen(
    proxy: &Proxy,
    provider: &FakeProvider,
    betas: &[&str],
    body: &Value,
) -> Vec<String> {
    let mut request = client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01");
    for line in betas {
        request = request.header("anthropic-beta", *line);
    }
    let answer = request.json(body).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let seen = forwarded(provider).pop().unwrap();
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    let lines = seen.headers.get_all("anthropic-beta").iter();
    lines.map(|v| v.to_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn serving_them_the_upstream_never_sees_their_betas() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let kept = [
        "claude-code-20250219,oauth-2025-04-20",
        "interleaved-thinking-2025-05-14",
    ];
    // With edits abridge serves, and without any (Claude Code sends the betas always).
    let edits = json!([{"type": "clear_thinking_20251015", "keep": "all"}]);
    let plain = json!({"model": "local-model", "max_tokens": 64, "messages": [ask("hi")]});
    for body in [request(&[ask("hi")], edits, false), plain.clone()] {
        assert_eq!(betas_seen(&proxy, &provider, &BETAS, &body).await, kept);
    }
    // Nothing left: no header at all.
    let only = ["compact-2026-01-12,context-management-2025-06-27"];
    assert!(
        betas_seen(&proxy, &provider, &only, &plain)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn native_forwards_the_betas_untouched() {
    let (provider, proxy) = setup(ProviderCompaction::Native).await;
    let edits = json!([{"type": "compact_20260112"}]);
    let seen = betas_seen(
        &proxy,
        &provider,
        &BETAS,
        &request(&[ask("hi")], edits, false),
    )
    .await;
    assert_eq!(seen, BETAS);
}

mod count;
