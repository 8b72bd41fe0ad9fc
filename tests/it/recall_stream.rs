//! Recall on streamed answers, in all three formats: the client reads one well-formed
//! stream with the elided fact in it, never the call; every round's usage is in its last
//! usage; a failed follow-up still ends in an answer; the client's own calls reach it.

use serde_json::{Value, json};

use crate::common::claude::from_stream;
use crate::common::client;
use crate::common::responses::terminal_response;
use crate::recall::{
    ADMIN_TOKEN, FACT, QUESTION, Wire, compacted_chat, post, recalls_shown, rounds_since, setup,
    setup_of, setup_with,
};

/// The `data:` payloads of a stream, in order.
fn payloads(sse: &str) -> Vec<String> {
    sse.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

/// A chat stream read as a client reads it: its chunks, checked to be well formed (one
/// `[DONE]`, last), the text, and the tool calls' names by index.
pub(super) fn chat_stream(sse: &str) -> (Vec<Value>, String, Vec<String>) {
    let payloads = payloads(sse);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"), "{sse}");
    assert_eq!(
        payloads.iter().filter(|p| *p == "[DONE]").count(),
        1,
        "{sse}"
    );
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    let mut text = String::new();
    let mut calls: Vec<String> = Vec::new();
    for chunk in &chunks {
        let delta = &chunk["choices"][0]["delta"];
        text.push_str(delta["content"].as_str().unwrap_or(""));
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                assert_eq!(index, calls.len(), "tool calls numbered from 0: {sse}");
                calls.push(name.to_owned());
            }
        }
    }
    (chunks, text, calls)
}

fn streamed(messages: &[Value], usage: bool) -> Value {
    let mut body = json!({"model": "fake-model", "messages": messages, "stream": true});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[tokio::test]
async fn a_streamed_chat_recalls_within_one_stream() {
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let response = post(&proxy, "sk-recall", &streamed(&messages, true), &[]).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["x-abridge-compacted"], "true");
    let sse = response.text().await.unwrap();
    assert!(
        !sse.contains("abridge_recall"),
        "the call never reaches the client: {sse}"
    );
    let (chunks, text, calls) = chat_stream(&sse);
    assert!(text.contains("port 6543"), "{sse}");
    assert!(calls.is_empty(), "{sse}");
    let finishes: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("stop")], "{sse}");

    // Two streamed rounds at the provider; the client's usage is both.
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2, "{rounds:?}");
    assert_eq!(rounds[1]["stream"], true);
    let result = rounds[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        result["content"].as_str().unwrap().contains(FACT),
        "{result}"
    );
    let prompt = |r: &Value| fake_provider::count_tokens(r["messages"].as_array().unwrap());
    let usage: Vec<&Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1, "{sse}");
    assert_eq!(
        usage[0]["usage"]["prompt_tokens"].as_u64().unwrap(),
        prompt(&rounds[0]) + prompt(&rounds[1])
    );
    assert_eq!(proxy.stats().recalls, 1);
    assert_eq!(proxy.stats().recall_input_tokens, prompt(&rounds[1]));
    let id = headers["x-abridge-conversation"]
        .to_str()
        .unwrap()
        .to_owned();
    let shown = recalls_shown(&proxy, &id, 1).await;
    assert_eq!(shown["state"]["recalls"], 1, "{shown}");

    // A client that did not ask for usage gets none (abridge asked on its behalf).
    let response = post(&proxy, "sk-recall", &streamed(&messages, false), &[]).await;
    let sse = response.text().await.unwrap();
    let (chunks, text, _) = chat_stream(&sse);
    assert!(text.contains("port 6543"), "{sse}");
    assert!(
        !sse.contains("abridge_recall") && !sse.contains("\"usage\""),
        "{sse}"
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"].as_array().is_some_and(|c| !c.is_empty()))
    );
}

#[tokio::test]
async fn streamed_responses_and_messages_recall_within_one_stream() {
    // A thinking model's reasoning item (or block) comes before the call: relayed as it
    // came, and the next round's items numbered after it.
    for (wire, thinking) in [
        (Wire::Responses, false),
        (Wire::Messages, false),
        (Wire::Responses, true),
        (Wire::Messages, true),
    ] {
        let (provider, proxy) = setup_of(3, thinking).await;
        let history = crate::recall::compacted_history(&proxy, wire).await;
        let before = provider.requests().len();
        let mut body = wire.body(&history);
        body["stream"] = json!(true);
        let response = client()
            .post(proxy.url(wire.path()))
            .bearer_auth("sk-recall")
            .header("x-api-key", "sk-ant-recall")
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let sse = response.text().await.unwrap();
        assert!(!sse.contains("abridge_recall"), "{wire:?}: {sse}");
        let events: Vec<Value> = payloads(&sse)
            .iter()
            .map(|p| serde_json::from_str(p).unwrap())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let rounds = rounds_since(&provider, before);
        assert_eq!(rounds.len(), 2, "{wire:?}");
        let answer = match wire {
            Wire::Responses => {
                assert_eq!(kinds.first(), Some(&"response.created"), "{sse}");
                assert_eq!(
                    kinds.iter().filter(|k| **k == "response.created").count(),
                    1
                );
                assert_eq!(kinds.last(), Some(&"response.completed"), "{sse}");
                assert_eq!(
                    kinds.iter().filter(|k| **k == "response.completed").count(),
                    1
                );
                // Numbered as one stream: sequence numbers one after another, items
                // from 0.
                let seq: Vec<u64> = events
                    .iter()
                    .map(|e| e["sequence_number"].as_u64().unwrap())
                    .collect();
                assert!(seq.windows(2).all(|w| w[1] == w[0] + 1), "{seq:?}");
                let added: Vec<u64> = events
                    .iter()
                    .filter(|e| e["type"] == "response.output_item.added")
                    .map(|e| e["output_index"].as_u64().unwrap())
                    .collect();
                assert_eq!(added, (0..added.len() as u64).collect::<Vec<_>>(), "{sse}");
                let response = terminal_response(&sse);
                assert_eq!(response["tools"], json!([]), "{response}");
                assert_eq!(response["tool_choice"], "auto", "{response}");
                assert_eq!(response["output"].as_array().unwrap().len(), added.len());
                response
            }
            Wire::Messages => {
                assert_eq!(kinds.first(), Some(&"message_start"), "{sse}");
                assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1);
                assert_eq!(kinds.last(), Some(&"message_stop"), "{sse}");
                let starts: Vec<u64> = events
                    .iter()
                    .filter(|e| e["type"] == "content_block_start")
                    .map(|e| e["index"].as_u64().unwrap())
                    .collect();
                assert_eq!(
                    starts,
                    (0..starts.len() as u64).collect::<Vec<_>>(),
                    "{sse}"
                );
                let message = from_stream(&sse);
                assert_eq!(message["stop_reason"], "end_turn", "{message}");
                message
            }
        };
        let (text, calls) = wire.text(&answer);
        assert!(text.contains("port 6543"), "{wire:?}: {sse}");
        if thinking {
            let first = match wire {
                Wire::Responses => &answer["output"][0]["type"],
                Wire::Messages => &answer["content"][0]["type"],
            };
            assert!(first == "reasoning" || first == "thinking", "{answer}");
        }
        assert!(!calls, "{wire:?}: {answer}");
        assert_eq!(
            wire.reported_input(&answer),
            wire.input_tokens(&rounds[0]) + wire.input_tokens(&rounds[1]),
            "{wire:?}: the usage of both rounds"
        );
    }
}

#[tokio::test]
async fn a_failed_streamed_follow_up_still_ends_in_an_answer() {
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let failing = [("x-fake-fail-follow-ups", "1")];
    let response = post(&proxy, "sk-recall", &streamed(&messages, true), &failing).await;
    assert_eq!(response.status(), 200);
    let sse = response.text().await.unwrap();
    assert!(!sse.contains("abridge_recall"), "{sse}");
    let (chunks, text, calls) = chat_stream(&sse);
    assert!(!text.is_empty() && calls.is_empty(), "{sse}");
    // The round with the call, the follow-up refused, the request without the tool.
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 3, "{rounds:?}");
    assert!(rounds[2].get("tools").is_none(), "{}", rounds[2]);
    assert_eq!(proxy.stats().recall_failures, 1);
    let usage: Vec<&Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1, "{sse}");
}

#[tokio::test]
async fn the_clients_own_streamed_calls_reach_it_whole() {
    let (provider, proxy) = setup_with(1).await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": "Tell me more about the harbour lighthouse."}));
    let shell = json!({"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}});
    let mut body = streamed(&messages, true);
    body["tools"] = json!([shell]);
    let response = post(&proxy, "sk-recall", &body, &[]).await;
    assert_eq!(response.headers()["x-abridge-compacted"], "true");
    let sse = response.text().await.unwrap();
    let (chunks, _, calls) = chat_stream(&sse);
    assert_eq!(calls, ["shell"], "{sse}");
    let arguments: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, r#"{"path":"/tmp/fake.txt"}"#);
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
    let tools = provider.last_request().unwrap().json()["tools"].clone();
    assert_eq!(tools[1]["function"]["name"], "abridge_recall");
}

#[tokio::test]
async fn a_restarted_abridge_on_redis_recalls_through_the_checkpoint_it_kept() {
    use abridge::secret::Secret;
    use abridge::strategies::Strategy;
    let redis = crate::common::redis::RedisServer::start();
    let provider = fake_provider::FakeProvider::start(fake_provider::Behavior {
        uses_recall: true,
        ..fake_provider::Behavior::default()
    })
    .await
    .unwrap();
    let config = || {
        let mut config = crate::common::compacting(&provider.url(), Strategy::Recency, 3000);
        config.compaction.background = false;
        config.store.redis_url = Some(Secret::new(redis.url()));
        config.admin.token = Some(Secret::new(ADMIN_TOKEN));
        config
    };
    let first = crate::common::Proxy::start_with(config()).await;
    let mut messages = compacted_chat(&first).await;
    drop(first);

    // Another process, the same Redis: the checkpoint is read back, the fact recalled.
    let second = crate::common::Proxy::start_with(config()).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let response = post(&second, "sk-recall", &streamed(&messages, true), &[]).await;
    assert_eq!(response.headers()["x-abridge-compacted"], "true");
    let id = response.headers()["x-abridge-conversation"]
        .to_str()
        .unwrap()
        .to_owned();
    let sse = response.text().await.unwrap();
    let (_, text, _) = chat_stream(&sse);
    assert!(text.contains("port 6543"), "{sse}");
    assert!(!sse.contains("abridge_recall"), "{sse}");
    let shown = recalls_shown(&second, &id, 1).await;
    assert_eq!(shown["state"]["recalls"], 1, "counted in Redis: {shown}");
}
