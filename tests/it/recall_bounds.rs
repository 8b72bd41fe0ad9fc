//! Recall within bounds (issue 41): what one tenant sends never changes recall for
//! another; a client's own tool of the same name stays its own; the calls served per
//! answer are capped; what a streamed round holds is bounded in bytes and time; the
//! follow-ups and the whole answers read for recall count against the body budget; and
//! no call of abridge's tool reaches a client, from a compressed answer or from any
//! choice.

use std::time::Duration;

use abridge::Config;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::{Proxy, client, compacting};
use crate::recall::{FACT, QUESTION, compacted_chat, compacted_chat_of, post, rounds_since};

/// A question about what is still in view: the fake calls the client's first tool.
const IN_VIEW: &str = "Tell me more about the harbour lighthouse.";

/// The fake provider using the recall tool, and abridge as `recall`'s tests set it up
/// with `configure` applied.
async fn start(configure: impl FnOnce(&mut Config)) -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior {
        uses_recall: true,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut config = compacting(&provider.url(), Strategy::Recency, 3000);
    config.compaction.background = false;
    configure(&mut config);
    let proxy = Proxy::start_with(config).await;
    (provider, proxy)
}

/// A client tool named `name`.
fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "The client's own.", "parameters": {"type": "object"}}})
}

/// The chat body of `messages`, streamed or not, with `tools` when given.
fn body(messages: &[Value], stream: bool, tools: Option<Vec<Value>>) -> Value {
    let mut body = json!({"model": "fake-model", "messages": messages, "stream": stream});
    if let Some(tools) = tools {
        body["tools"] = Value::from(tools);
    }
    body
}

/// The names of the tools a forwarded chat body carries.
fn tool_names(forwarded: &Value) -> Vec<String> {
    forwarded["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The text of a chat stream's content deltas.
fn streamed_text(sse: &str) -> String {
    sse.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// A compacted chat of the test's tenant ending in `question`.
async fn asking(proxy: &Proxy, question: &str) -> Vec<Value> {
    let mut messages = compacted_chat(proxy).await;
    messages.push(json!({"role": "user", "content": question}));
    messages
}

#[tokio::test]
async fn what_one_tenant_sends_never_turns_recall_off_for_another() {
    let (_provider, proxy) = start(|_| {}).await;
    // Tenant A: a tool of abridge's tool's name, then 128 tools of its own.
    let notes = "Setup notes for the rollout: the canary stays green overnight.";
    let mut theirs = compacted_chat_of(&proxy, "sk-tenant-a", notes).await;
    theirs.push(json!({"role": "user", "content": IN_VIEW}));
    let own = vec![tool("abridge_recall")];
    let response = post(&proxy, "sk-tenant-a", &body(&theirs, false, Some(own)), &[]).await;
    assert_eq!(response.status(), 200);
    let many: Vec<Value> = (0..128).map(|i| tool(&format!("tool_{i}"))).collect();
    let response = post(
        &proxy,
        "sk-tenant-a",
        &body(&theirs, false, Some(many)),
        &[],
    )
    .await;
    assert_eq!(response.status(), 200);

    // Tenant B still recalls.
    let messages = asking(&proxy, QUESTION).await;
    let response = post(&proxy, "sk-recall", &body(&messages, false, None), &[]).await;
    assert_eq!(response.headers()["x-abridge-recalls"], "1");
    let answer: Value = response.json().await.unwrap();
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("port 6543"), "{answer}");
}

#[tokio::test]
async fn a_clients_own_abridge_recall_is_its_own_and_abridges_tool_is_named_apart() {
    let (provider, proxy) = start(|_| {}).await;
    // A provider that takes tools of one name twice, as some do.
    let lenient = [("x-fake-duplicate-tools", "1")];
    let own = tool("abridge_recall");
    let messages = asking(&proxy, IN_VIEW).await;
    let response = post(
        &proxy,
        "sk-recall",
        &body(&messages, false, Some(vec![own.clone()])),
        &lenient,
    )
    .await;
    assert_eq!(response.headers()["x-abridge-compacted"], "true");
    let answer: Value = response.json().await.unwrap();
    let call = &answer["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "abridge_recall", "{answer}");
    assert_eq!(call["function"]["arguments"], r#"{"path":"/tmp/fake.txt"}"#);
    let forwarded = provider.last_request().unwrap().json();
    assert_eq!(
        tool_names(&forwarded),
        ["abridge_recall", "abridge_recall_2"]
    );
    assert_eq!(
        forwarded["tools"][0], own,
        "the client's tool as it sent it"
    );

    // Streamed, the same.
    let response = post(
        &proxy,
        "sk-recall",
        &body(&messages, true, Some(vec![own.clone()])),
        &lenient,
    )
    .await;
    let sse = response.text().await.unwrap();
    assert!(sse.contains(r#""name":"abridge_recall""#), "{sse}");
    assert!(sse.contains("fake.txt"), "{sse}");

    // The client answers its own call and asks about what was condensed: abridge's tool,
    // under its other name, is served.
    let mut messages = messages;
    let id = call["id"].as_str().unwrap();
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "Ticket 7: open."}));
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let response = post(
        &proxy,
        "sk-recall",
        &body(&messages, false, Some(vec![own])),
        &lenient,
    )
    .await;
    assert_eq!(response.headers()["x-abridge-recalls"], "1");
    let answer: Value = response.json().await.unwrap();
    let message = &answer["choices"][0]["message"];
    assert!(
        message["content"].as_str().unwrap().contains("port 6543"),
        "{answer}"
    );
    assert!(message.get("tool_calls").is_none(), "{answer}");
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2);
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
}

#[tokio::test]
async fn the_calls_served_per_answer_are_capped() {
    let (provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, QUESTION).await;
    let many = [("x-fake-recall-calls", "40")];
    let before = provider.requests().len();
    let response = post(&proxy, "sk-recall", &body(&messages, false, None), &many).await;
    assert_eq!(response.headers()["x-abridge-recalls"], "8");
    let answer: Value = response.json().await.unwrap();
    assert!(answer.to_string().contains("port 6543"), "{answer}");
    // Every call is answered (the pairing holds); the first eight are served.
    let rounds = rounds_since(&provider, before);
    let results: Vec<&Value> = rounds[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 40);
    for (i, result) in results.iter().enumerate() {
        let text = result["content"].as_str().unwrap();
        assert_eq!(text.contains(FACT), i < 8, "{i}: {text}");
        assert_eq!(
            text.contains("too many recall calls"),
            i >= 8,
            "{i}: {text}"
        );
    }
    assert_eq!(proxy.stats().recalls, 8);

    // Streamed, the same.
    let response = post(&proxy, "sk-recall", &body(&messages, true, None), &many).await;
    let sse = response.text().await.unwrap();
    assert!(streamed_text(&sse).contains("port 6543"), "{sse}");
    assert_eq!(proxy.stats().recalls, 16);
}

/// Reads `response`'s body until `enough` of it came (`true`), it ended, or `within`.
async fn reads_at_least(mut response: reqwest::Response, enough: usize, within: Duration) -> bool {
    let mut got = 0;
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            got += chunk.len();
            if got >= enough {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(within, read).await.unwrap_or(false)
}

#[tokio::test]
async fn a_streamed_round_holds_no_more_than_its_bound() {
    let (_provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, IN_VIEW).await;
    // A client's tool call of 12 MB that never ends: held whole, the client would get
    // nothing of it. Past `recall.max_answer_bytes` (8 MiB) it is relayed as it comes,
    // in small events and in one event of 12 MB.
    for chunk in ["1024", "0"] {
        let huge = [
            ("x-fake-call-bytes", "12000000"),
            ("x-fake-call-chunk", chunk),
            ("x-fake-stall", "end"),
        ];
        let body = body(&messages, true, Some(vec![tool("shell")]));
        let response = post(&proxy, "sk-recall", &body, &huge).await;
        assert_eq!(response.status(), 200);
        assert!(
            reads_at_least(response, 11_000_000, Duration::from_secs(60)).await,
            "chunk {chunk}: the call was held"
        );
    }
}

#[tokio::test]
async fn a_round_held_too_long_is_relayed() {
    let (_provider, proxy) = start(|c| c.recall.max_hold_ms = 300).await;
    let messages = asking(&proxy, IN_VIEW).await;
    let body = body(&messages, true, Some(vec![tool("shell")]));
    let mut response = post(&proxy, "sk-recall", &body, &[("x-fake-stall", "end")]).await;
    let mut sse = String::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            sse.push_str(&String::from_utf8_lossy(&chunk));
            if sse.contains("fake.txt") {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    assert!(sse.contains(r#""name":"shell""#), "{sse}");
    assert!(sse.contains("fake.txt"), "{sse}");
}

#[tokio::test]
async fn a_recall_call_past_the_bound_never_reaches_the_client() {
    let (provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, QUESTION).await;
    // In small events: given up, the call taken out, the stream well formed.
    let before = provider.requests().len();
    let huge = [
        ("x-fake-call-bytes", "12000000"),
        ("x-fake-call-chunk", "1024"),
    ];
    let response = post(&proxy, "sk-recall", &body(&messages, true, None), &huge).await;
    let sse = response.text().await.unwrap();
    assert!(
        !sse.contains("abridge_recall"),
        "{}",
        &sse[..sse.len().min(2000)]
    );
    assert!(
        sse.ends_with("data: [DONE]\n\n"),
        "{}",
        &sse[sse.len().saturating_sub(2000)..]
    );
    assert_eq!(rounds_since(&provider, before).len(), 1, "recall given up");

    // In one event of 12 MB that belongs to the call: the stream ends in an error.
    let huge = [
        ("x-fake-call-bytes", "12000000"),
        ("x-fake-call-chunk", "0"),
    ];
    let response = post(&proxy, "sk-recall", &body(&messages, true, None), &huge).await;
    let sse = response.text().await.unwrap();
    assert!(
        !sse.contains("abridge_recall"),
        "{}",
        &sse[..sse.len().min(2000)]
    );
    assert!(sse.len() < 1_000_000, "the call's event was not relayed");
    assert!(sse.contains(r#"data: {"error""#), "{sse}");
}

/// A user message long enough to make a request body of about `bytes`.
fn padded(messages: &[Value], bytes: usize) -> Value {
    let mut body = body(messages, true, None);
    body["metadata"] = json!({"pad": "x".repeat(bytes)});
    body
}

#[tokio::test]
async fn streamed_follow_ups_hold_their_share_of_the_body_budget() {
    let (provider, proxy) = start(|c| c.limits.max_inflight_body_bytes = 1280 * 1024).await;
    let messages = asking(&proxy, QUESTION).await;
    let before = provider.requests().len();
    let slow = [("x-fake-follow-up-latency-ms", "3000")];
    let a = padded(&messages, 300_000);
    let url = proxy.url("/v1/chat/completions");
    let first = tokio::spawn(async move {
        let response = client()
            .post(url)
            .bearer_auth("sk-recall")
            .header(slow[0].0, slow[0].1)
            .json(&a)
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    });
    // The follow-up is on its way: the first round's stream has ended.
    assert!(
        provider
            .wait_until(Duration::from_secs(10), |p| p.requests().len()
                == before + 2)
            .await
    );
    let other = json!({"model": "fake-model", "messages": [{"role": "user", "content": "Hello?"}], "metadata": {"pad": "y".repeat(700_000)}});
    let response = post(&proxy, "sk-other", &other, &[]).await;
    assert_eq!(response.status(), 503, "the follow-up holds its share");
    let sse = first.await.unwrap();
    assert!(streamed_text(&sse).contains("port 6543"), "{sse}");
    let response = post(&proxy, "sk-other", &other, &[]).await;
    assert_eq!(response.status(), 200);

    // A budget with no room for a follow-up: answered without recall, not failed.
    let (provider, proxy) = start(|c| c.limits.max_inflight_body_bytes = 600 * 1024).await;
    let messages = asking(&proxy, QUESTION).await;
    let before = provider.requests().len();
    let response = post(&proxy, "sk-recall", &padded(&messages, 300_000), &[]).await;
    assert_eq!(response.status(), 200);
    let sse = response.text().await.unwrap();
    assert!(!sse.contains("abridge_recall"), "{sse}");
    assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    assert_eq!(rounds_since(&provider, before).len(), 1);
}

#[tokio::test]
async fn a_whole_answer_past_the_bound_is_answered_without_recall() {
    let (provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, QUESTION).await;
    let before = provider.requests().len();
    let huge = [("x-fake-call-bytes", "12000000")];
    let response = post(&proxy, "sk-recall", &body(&messages, false, None), &huge).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("abridge_recall"),
        "{}",
        &text[..text.len().min(2000)]
    );
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2);
    assert!(
        rounds[1].get("tools").is_none(),
        "asked again without the tool"
    );
}

#[tokio::test]
async fn a_whole_answer_read_for_recall_counts_against_the_body_budget() {
    let (provider, proxy) = start(|c| c.limits.max_inflight_body_bytes = 1024 * 1024).await;
    let messages = asking(&proxy, QUESTION).await;
    let before = provider.requests().len();
    let big = [("x-fake-call-bytes", "1500000")];
    let response = post(&proxy, "sk-recall", &body(&messages, false, None), &big).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("abridge_recall"),
        "{}",
        &text[..text.len().min(2000)]
    );
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2);
    assert!(
        rounds[1].get("tools").is_none(),
        "asked again without the tool"
    );
}

#[tokio::test]
async fn a_compressed_whole_answer_is_read_for_its_calls() {
    let (provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, QUESTION).await;
    let before = provider.requests().len();
    let gzip = [("x-fake-gzip", "1")];
    let response = post(&proxy, "sk-recall", &body(&messages, false, None), &gzip).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-abridge-recalls"], "1");
    let answer: Value = response.json().await.unwrap();
    assert!(!answer.to_string().contains("abridge_recall"), "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("port 6543"), "{answer}");
    // abridge asked for identity every time; the provider compressed anyway.
    let sent = &provider.requests()[before..];
    assert_eq!(sent.len(), 2);
    for request in sent {
        assert_eq!(request.headers["accept-encoding"], "identity");
    }
}

#[tokio::test]
async fn a_request_for_several_choices_gets_no_recall_tool() {
    let (provider, proxy) = start(|_| {}).await;
    let messages = asking(&proxy, QUESTION).await;
    let mut several = body(&messages, false, None);
    several["n"] = json!(2);
    let response = post(&proxy, "sk-recall", &several, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-abridge-compacted"], "true");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["choices"].as_array().unwrap().len(), 2);
    assert!(!answer.to_string().contains("abridge_recall"), "{answer}");
    assert!(
        provider
            .last_request()
            .unwrap()
            .json()
            .get("tools")
            .is_none()
    );
}
