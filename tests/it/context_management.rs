//! Responses `context_management` (OpenAI's server-side compaction) behind a server that
//! lacks it (the fake provider ignores the field): abridge does not forward it; over the
//! client's `compact_threshold` it compacts, forwards the compacted input and answers
//! with its `compaction` item first, whole and streamed; the item sent back next turn is
//! expanded (by another replica on the same Redis, or after a restart); behind a
//! provider that has it (`native`) everything passes untouched.

use abridge::config::ProviderCompaction;
use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::redis::RedisServer;
use crate::common::{Proxy, client, config_for};
use crate::provider_apis::{compactions, events, history, last_responses, post, serving, user};

fn managed(threshold: u64) -> Value {
    json!([{"type": "compaction", "compact_threshold": threshold}])
}

/// The history and a new ask, with `context_management` at `threshold`.
fn request(threshold: u64, stream: bool) -> Value {
    let mut input = history();
    input.push(user("Now document it"));
    json!({"model": "local-model", "input": input, "stream": stream, "store": false,
        "context_management": managed(threshold)})
}

/// What the provider got: no `context_management`, and its input.
fn forwarded(provider: &FakeProvider) -> Vec<Value> {
    let sent = last_responses(provider).json();
    assert!(sent.get("context_management").is_none(), "{sent}");
    sent["input"].as_array().unwrap().clone()
}

#[tokio::test]
async fn over_the_threshold_the_item_comes_first_and_the_input_is_compacted() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let answer = post(&proxy, "/v1/responses", &request(50, false)).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["x-abridge-compaction"],
        "served by abridge"
    );
    let answer: Value = answer.json().await.unwrap();
    let output = answer["output"].as_array().unwrap().clone();
    assert_eq!(output[0]["type"], "compaction", "{answer}");
    assert_eq!(compactions(&output).len(), 1);
    assert_eq!(
        output[1]["type"], "message",
        "the provider's answer after it"
    );

    // Forwarded: the instructions and the earlier ask, the summary, the new ask.
    let input = forwarded(&provider);
    assert_eq!(input.len(), 4, "{input:?}");
    assert_eq!(input[0], history()[0]);
    assert_eq!(input[1], history()[1]);
    let summary = input[2]["content"][0]["text"].as_str().unwrap();
    assert!(summary.contains("src/parser.rs"), "{summary}");
    assert_eq!(input[3], user("Now document it"));

    // Next turn, under the threshold: the item sent back is expanded, nothing new made.
    let mut input = history();
    input.extend([
        user("Now document it"),
        output[0].clone(),
        output[1].clone(),
    ]);
    input.push(user("And add a test"));
    let body =
        json!({"model": "local-model", "input": input, "context_management": managed(1_000_000)});
    let answer = post(&proxy, "/v1/responses", &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert!(compactions(answer["output"].as_array().unwrap()).is_empty());
    let sent = forwarded(&provider);
    let text = Value::from(sent.clone()).to_string();
    assert!(!text.contains("\"compaction\""), "{text}");
    assert!(text.contains("compacted by abridge") && text.contains("And add a test"));
    assert!(
        !text.contains("call_1"),
        "what the item summarised is not sent again: {text}"
    );
}

#[tokio::test]
async fn streamed_the_items_events_come_first_and_the_providers_shift_by_one() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let answer = post(&proxy, "/v1/responses", &request(50, true)).await;
    assert_eq!(answer.status(), 200);
    let events = events(&answer.text().await.unwrap());
    for (n, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], n, "{name}");
    }
    let first = events
        .iter()
        .position(|(_, d)| d.get("output_index").is_some())
        .unwrap();
    assert_eq!(events[first].0, "response.output_item.added");
    assert_eq!(events[first].1["item"]["type"], "compaction");
    assert_eq!(events[first + 1].0, "response.output_item.done");
    assert_eq!(events[first + 1].1["output_index"], 0);
    assert!(
        events[first + 2..]
            .iter()
            .filter_map(|(_, d)| d["output_index"].as_u64())
            .all(|i| i >= 1),
        "the provider's items come after the compaction"
    );
    let (name, done) = events.last().unwrap();
    assert_eq!(name, "response.completed");
    let output = done["response"]["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "compaction");
    assert_eq!(compactions(output).len(), 1);
    assert!(output.len() >= 2);
    assert_eq!(forwarded(&provider).len(), 4);
}

#[tokio::test]
async fn under_the_threshold_only_the_field_is_dropped() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(serving(&provider.url())).await;
    let answer = post(&proxy, "/v1/responses", &request(1_000_000, false)).await;
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("x-abridge-compaction").is_none());
    let answer: Value = answer.json().await.unwrap();
    assert!(compactions(answer["output"].as_array().unwrap()).is_empty());
    let input = forwarded(&provider);
    assert_eq!(input.len(), history().len() + 1, "{input:?}");
}

/// The output `proxy` answers a request over its threshold with, whole or streamed: the
/// compaction item first, then the provider's.
async fn output_from(proxy: &Proxy, stream: bool) -> Vec<Value> {
    let answer = post(proxy, "/v1/responses", &request(50, stream)).await;
    assert_eq!(answer.status(), 200);
    let response = match stream {
        true => events(&answer.text().await.unwrap()).pop().unwrap().1["response"].clone(),
        false => answer.json().await.unwrap(),
    };
    let output = response["output"].as_array().unwrap().clone();
    assert_eq!(output[0]["type"], "compaction", "{response}");
    let token = output[0]["encrypted_content"].as_str().unwrap();
    assert!(token.starts_with("abridge.v1."), "{token}");
    output
}

/// `output` sent back to `proxy` after the history, with a new ask: the answer's note,
/// and the input that reached the provider.
async fn sent_back(proxy: &Proxy, provider: &FakeProvider, output: &[Value]) -> (String, String) {
    let mut input = history();
    input.push(user("Now document it"));
    input.extend(output.iter().cloned());
    input.push(user("And add a test"));
    let body =
        json!({"model": "local-model", "input": input, "context_management": managed(1_000_000)});
    let answer = post(proxy, "/v1/responses", &body).await;
    assert_eq!(answer.status(), 200, "the fake refuses a compaction item");
    let note = answer.headers().get("x-abridge-note");
    let note = note.map_or(String::new(), |n| n.to_str().unwrap().to_owned());
    (note, Value::from(forwarded(provider)).to_string())
}

/// The item expanded into its summary, what it summarised dropped, nothing of the
/// compaction API forwarded (`forwarded` checks `context_management` is gone).
fn assert_expanded(sent: &str) {
    assert!(!sent.contains("\"compaction\""), "{sent}");
    assert!(!sent.contains("call_1"), "what the item summarised: {sent}");
    assert!(
        sent.contains("compacted by abridge") && sent.contains("src/parser.rs"),
        "{sent}"
    );
    assert!(sent.contains("And add a test"));
}

#[tokio::test]
async fn the_item_is_read_on_another_replica_and_after_a_restart() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // Two replicas on one Redis (the secret the first published): B reads A's item.
    let redis = RedisServer::start();
    let mut shared = serving(&provider.url());
    shared.store.redis_url = Some(Secret::new(redis.url()));
    let a = Proxy::start_with(shared.clone()).await;
    let b = Proxy::start_with(shared).await;
    for stream in [false, true] {
        let output = output_from(&a, stream).await;
        let (note, sent) = sent_back(&b, &provider, &output).await;
        assert!(
            !note.contains("did not make"),
            "opened as abridge's own: {note}"
        );
        assert_expanded(&sent);
    }

    // In-process store, a configured secret: a restarted proxy reads it.
    let mut alone = serving(&provider.url());
    alone.identity.secret = Some(Secret::new("the deployment's identity secret"));
    let before = Proxy::start_with(alone.clone()).await;
    let outputs = [
        output_from(&before, false).await,
        output_from(&before, true).await,
    ];
    before.shutdown().await.unwrap();
    let after = Proxy::start_with(alone).await;
    for output in &outputs {
        let (note, sent) = sent_back(&after, &provider, output).await;
        assert!(
            !note.contains("did not make"),
            "opened after the restart: {note}"
        );
        assert_expanded(&sent);
    }
    // Without one, a restart makes another secret: the item is dropped, the client told.
    let stranger = Proxy::start_with(serving(&provider.url())).await;
    let (note, sent) = sent_back(&stranger, &provider, &outputs[0]).await;
    assert!(note.contains("did not make"), "{note}");
    assert!(!sent.contains("\"compaction\"") && !sent.contains("compacted by abridge"));
}

#[tokio::test]
async fn native_forwards_context_management_untouched() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Native;
    let proxy = Proxy::start_with(config).await;
    let body = request(50, false).to_string();
    let answer = client()
        .post(proxy.url("/v1/responses"))
        .bearer_auth("sk-codex")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(provider.last_request().unwrap().body, body.as_bytes());
}
