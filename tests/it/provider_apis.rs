//! OpenAI's compaction APIs, as Codex CLI's built-in `openai` provider uses them, behind
//! a server that lacks them (the fake provider: a 404 for `/responses/compact`, a 400 for
//! `compaction` and `compaction_trigger` items): abridge answers them itself and expands
//! its own `compaction` items before a later request goes on; behind a provider that has
//! them (`native`), everything passes untouched.

use abridge::config::{Config, ProviderCompaction};
use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider, Recorded};
use serde_json::{Value, json};

use crate::common::redis::RedisServer;
use crate::common::{Proxy, client, config_for};

pub(crate) fn serving(url: &str) -> Config {
    let mut config = config_for(url);
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    config
}

pub(crate) fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// A Codex-like history: instructions, an ask, a tool round, an answer.
pub(crate) fn history() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]}),
        user("Make the parser in src/parser.rs accept trailing commas"),
        json!({"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"cargo\",\"test\"]}"}),
        json!({"type": "function_call_output", "call_id": "call_1", "output": "test parser::commas ... FAILED"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The parser now accepts trailing commas; tests pass."}]}),
    ]
}

pub(crate) async fn post(proxy: &Proxy, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(proxy.url(path))
        .bearer_auth("sk-codex")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The compaction items of an output array.
pub(crate) fn compactions(output: &[Value]) -> Vec<&Value> {
    output
        .iter()
        .filter(|i| i["type"] == "compaction")
        .collect()
}

/// The events of an SSE body: (name, data).
pub(crate) fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

/// Codex's v2 trigger through `proxy`: the one compaction item it answers with.
async fn triggered(proxy: &Proxy, stream: bool) -> Value {
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let body = json!({"model": "local-model", "input": input, "stream": stream, "store": false});
    let answer = post(proxy, "/v1/responses", &body).await;
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    let response = if stream {
        let events = events(&text);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (n, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], name.as_str());
            assert_eq!(data["sequence_number"], n);
        }
        assert_eq!(events[3].1["item"]["type"], "compaction");
        events[4].1["response"].clone()
    } else {
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(compactions(output).len(), 1);
    assert!(response["usage"]["input_tokens"].is_u64());
    output[0].clone()
}

/// The next turn, as Codex sends it: the kept messages, the item, a new ask.
async fn next_turn(proxy: &Proxy, item: &Value) -> reqwest::Response {
    let input = json!([history()[0], history()[1], item, user("Now document it")]);
    post(
        proxy,
        "/v1/responses",
        &json!({"model": "local-model", "input": input, "store": false}),
    )
    .await
}

pub(crate) fn last_responses(provider: &FakeProvider) -> Recorded {
    provider
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.uri.path().ends_with("/responses"))
        .unwrap()
}

#[tokio::test]
async fn v1_compact_answers_with_kept_user_messages_and_one_item() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let body = json!({"model": "local-model", "input": history(), "instructions": "Be brief.",
        "tools": [], "parallel_tool_calls": true, "reasoning": null, "prompt_cache_key": "thread-1"});
    let answer = post(&proxy, "/v1/responses/compact", &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["object"], "response.compaction");
    assert!(answer["id"].as_str().unwrap().starts_with("cmp_"));
    assert!(answer["created_at"].is_u64());
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{answer}");
    assert_eq!(output[0], history()[1], "the user message, as sent");
    assert_eq!(compactions(output).len(), 1);
    assert_eq!(output[1]["type"], "compaction");
    assert!(
        output[1]["encrypted_content"]
            .as_str()
            .unwrap()
            .starts_with("abridge.v1.")
    );
    assert!(
        provider.requests().is_empty(),
        "nothing forwarded: {:?}",
        provider.requests()
    );

    // Later turns: expanded, and the provider gets a valid request with the summary.
    let answer = next_turn(&proxy, &output[1]).await;
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    let sent = last_responses(&provider).json();
    let text = sent.to_string();
    assert!(!text.contains("\"compaction\""), "{text}");
    assert!(text.contains("src/parser.rs"), "the summary: {text}");
    assert!(text.contains("Now document it"));
}

#[tokio::test]
async fn v2_trigger_is_answered_whole_and_streamed_and_expanded_next_turn() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let forwarded = |p: &FakeProvider| {
        p.requests()
            .iter()
            .filter(|r| r.uri.path().ends_with("/responses"))
            .count()
    };
    for (turn, stream) in [false, true].into_iter().enumerate() {
        let item = triggered(&proxy, stream).await;
        assert_eq!(forwarded(&provider), turn, "the trigger is not forwarded");
        let answer = next_turn(&proxy, &item).await;
        assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
        let input = last_responses(&provider).json()["input"].clone();
        let input = input.as_array().unwrap();
        assert_eq!(input.len(), 4, "{input:?}");
        assert_eq!(input[0], history()[0]);
        let summary = input[2]["content"][0]["text"].as_str().unwrap();
        assert!(
            summary.starts_with("[abridge: reference material"),
            "{summary}"
        );
        assert!(summary.contains("src/parser.rs"), "{summary}");
        assert!(input.iter().all(|i| i["type"] != "compaction"));
    }
}

#[tokio::test]
async fn a_trigger_not_last_is_refused_in_openais_shape() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let input = json!([user("x"), {"type": "compaction_trigger"}, user("y")]);
    let answer = post(
        &proxy,
        "/v1/responses",
        &json!({"model": "m", "input": input}),
    )
    .await;
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("last"));
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn a_forged_item_is_dropped_with_a_note() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let item = triggered(&proxy, false).await;
    let token = item["encrypted_content"].as_str().unwrap();
    // Another summary under the same tag: not abridge's.
    let forged = json!({"type": "compaction",
        "encrypted_content": token.replacen("abridge.v1.", "abridge.v1.e30", 1)});
    for item in [
        forged,
        json!({"type": "compaction", "encrypted_content": "gAAAAABopenai"}),
    ] {
        let answer = next_turn(&proxy, &item).await;
        assert_eq!(answer.status(), 200);
        let note = answer.headers()["x-abridge-note"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(note.contains("did not make"), "{note}");
        let input = last_responses(&provider).json()["input"].clone();
        let text = input.to_string();
        assert!(!text.contains("compaction"), "{text}");
        assert_eq!(
            input.as_array().unwrap().len(),
            3,
            "the item dropped, the rest kept"
        );
    }
}

#[tokio::test]
async fn another_replica_reads_the_item_with_a_shared_redis_or_secret() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // Shared Redis: the secret the first replica published.
    let redis = RedisServer::start();
    let mut config = serving(&provider.url());
    config.store.redis_url = Some(Secret::new(redis.url()));
    let first = Proxy::start_with(config.clone()).await;
    let item = triggered(&first, true).await;
    first.shutdown().await.unwrap();
    let second = Proxy::start_with(config).await;
    let answer = next_turn(&second, &item).await;
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("x-abridge-note").is_none());
    let text = last_responses(&provider).json()["input"].to_string();
    assert!(
        text.contains("src/parser.rs") && !text.contains("\"compaction\""),
        "{text}"
    );

    // A configured secret, in-process stores: the same.
    let mut config = serving(&provider.url());
    config.identity.secret = Some(Secret::new("a shared secret of the deployment"));
    let one = Proxy::start_with(config.clone()).await;
    let other = Proxy::start_with(config).await;
    let item = triggered(&one, false).await;
    let answer = next_turn(&other, &item).await;
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("x-abridge-note").is_none());
    // A replica with another secret does not trust it.
    let stranger = Proxy::start_with(serving(&provider.url())).await;
    let answer = next_turn(&stranger, &item).await;
    assert!(
        answer.headers()["x-abridge-note"]
            .to_str()
            .unwrap()
            .contains("did not make")
    );
}

#[tokio::test]
async fn native_forwards_every_byte_untouched() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Native;
    let proxy = Proxy::start_with(config).await;
    let compact = json!({"model": "gpt-5", "input": history()}).to_string();
    let mut trigger = history();
    trigger.push(json!({"type": "compaction_trigger"}));
    let trigger = json!({"model": "gpt-5", "input": trigger, "stream": true}).to_string();
    let item = json!([history()[1], {"type": "compaction", "encrypted_content": "gAAAAABopenai"}, user("go")]);
    let item = json!({"model": "gpt-5", "input": item}).to_string();
    for (path, body, status) in [
        ("/v1/responses/compact", compact, 404),
        ("/v1/responses", trigger, 400),
        ("/v1/responses", item, 400),
    ] {
        let answer = client()
            .post(proxy.url(path))
            .bearer_auth("sk-codex")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), status, "{path}: the provider's own answer");
        let sent = provider.last_request().unwrap();
        assert_eq!(sent.uri.path(), path);
        assert_eq!(sent.body, body.as_bytes(), "{path}: byte for byte");
    }
}
