//! The summary in the compaction items abridge makes for the provider APIs, when the
//! configured strategy summarises (`llm_replace` here): asked of the model (the fake's
//! summary mode writes the structured template), and the deterministic digest with a
//! note when the model fails.

use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, SummaryMode};
use serde_json::{Value, json};

use crate::common::Proxy;
use crate::provider_apis::{history, last_responses, post, serving, user};

async fn summarising(behavior: Behavior) -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(behavior).await.unwrap();
    let mut config = serving(&provider.url());
    config.compaction.strategy = Strategy::LlmReplace;
    config.summary.timeout_ms = 5000;
    let proxy = Proxy::start_with(config).await;
    (provider, proxy)
}

/// `/responses/compact` through `proxy`, then the next turn with its item: the summary
/// the provider got, and the compact answer's note.
async fn compacted_then_expanded(
    provider: &FakeProvider,
    proxy: &Proxy,
) -> (String, Option<String>) {
    let body = json!({"model": "local-model", "input": history()});
    let answer = post(proxy, "/v1/responses/compact", &body).await;
    assert_eq!(answer.status(), 200);
    let note = answer
        .headers()
        .get("x-abridge-note")
        .map(|v| v.to_str().unwrap().to_owned());
    let answer: Value = answer.json().await.unwrap();
    let item = answer["output"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(item["type"], "compaction");
    let input = json!([history()[1], item, user("Now document it")]);
    let next = post(
        proxy,
        "/v1/responses",
        &json!({"model": "local-model", "input": input}),
    )
    .await;
    assert_eq!(next.status(), 200);
    let sent = last_responses(provider).json();
    let summary = sent["input"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    (summary, note)
}

#[tokio::test]
async fn the_item_carries_the_models_summary() {
    let (provider, proxy) = summarising(Behavior::default()).await;
    let (summary, note) = compacted_then_expanded(&provider, &proxy).await;
    assert!(
        summary.contains("## Goal"),
        "the model's template: {summary}"
    );
    assert!(summary.contains("src/parser.rs"), "{summary}");
    assert_eq!(note, None);
    let asked = provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/chat/completions"))
        .count();
    assert_eq!(asked, 1, "one summary call");
}

#[tokio::test]
async fn a_failing_model_leaves_the_digest_and_says_so() {
    let behavior = Behavior {
        summary: SummaryMode::Error,
        ..Behavior::default()
    };
    let (provider, proxy) = summarising(behavior).await;
    let (summary, note) = compacted_then_expanded(&provider, &proxy).await;
    assert!(!summary.contains("## Goal"), "{summary}");
    assert!(summary.contains("src/parser.rs"), "the digest: {summary}");
    assert!(note.unwrap().contains("digest"));
}
