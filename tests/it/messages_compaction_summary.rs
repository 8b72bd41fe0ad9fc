//! Anthropic's compaction (`compact_20260112`) served by abridge with a strategy that
//! summarises: the block's summary is the model's, asked in the Messages API of the
//! route's upstream with the client's own credentials and the edit's `instructions`,
//! and `usage.iterations` reports what that call spent; when the model cannot say, the
//! digest stands in and the client is told.

use abridge::config::ProviderCompaction;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, SummaryMode, is_summary_request};
use serde_json::{Value, json};

use crate::common::Proxy;
use crate::messages_compaction::{compact_edit, config, long_history, post, request};

async fn setup(summary: SummaryMode) -> (FakeProvider, Proxy) {
    let behavior = Behavior {
        summary,
        ..Behavior::default()
    };
    let provider = FakeProvider::start(behavior).await.unwrap();
    let mut config = config(&provider.url(), ProviderCompaction::Serve);
    config.compaction.strategy = Strategy::Structured;
    let proxy = Proxy::start_with(config).await;
    (provider, proxy)
}

/// The summary calls the fake was asked (in the Messages API).
fn summary_calls(provider: &FakeProvider) -> Vec<fake_provider::Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/messages"))
        .filter(|r| is_summary_request(r.json()["messages"].as_array().unwrap()))
        .collect()
}

#[tokio::test]
async fn the_blocks_summary_is_the_models_asked_with_the_clients_instructions() {
    let (provider, proxy) = setup(SummaryMode::Good).await;
    for stream in [false, true] {
        let answer = post(
            &proxy,
            &request(&long_history(), compact_edit(false), stream),
        )
        .await;
        assert_eq!(answer.status(), 200);
        let note = answer.headers().get("x-abridge-note");
        assert!(!format!("{note:?}").contains("digest"), "{note:?}");
        let (block, iterations) = match stream {
            false => {
                let answer: Value = answer.json().await.unwrap();
                let usage = &answer["usage"];
                (answer["content"][0].clone(), usage["iterations"].clone())
            }
            true => {
                let events = crate::provider_apis::events(&answer.text().await.unwrap());
                let data = |name: &str| events.iter().find(|(n, _)| n == name).unwrap().1.clone();
                let (block, delta) = (data("content_block_delta"), data("message_delta"));
                (block["delta"].clone(), delta["usage"]["iterations"].clone())
            }
        };
        let summary = block["content"].as_str().unwrap();
        assert!(
            !summary.contains("Digest of"),
            "the model's, not the digest: {summary}"
        );
        assert!(summary.contains("src/parser.rs"), "{summary}");
        // The call's own counts, reported as the compaction's iteration.
        let compaction = &iterations[0];
        assert_eq!(compaction["type"], "compaction");
        assert!(
            compaction["input_tokens"].as_u64().unwrap() > 1000,
            "{iterations}"
        );
        assert!(
            compaction["output_tokens"].as_u64().unwrap() > 0,
            "{iterations}"
        );
    }
    let calls = summary_calls(&provider);
    assert_eq!(calls.len(), 2, "one summary a compaction");
    for call in calls {
        assert_eq!(call.headers["x-api-key"], "sk-ant-test", "the client's key");
        let asked = call.json()["messages"].to_string();
        assert!(
            asked.contains("Keep the file names."),
            "the edit's instructions"
        );
        assert!(
            !asked.contains("Goal; Constraints"),
            "in place of abridge's own ask"
        );
        assert!(asked.contains("Now run the tests"), "the newest turn too");
    }
}

#[tokio::test]
async fn when_the_model_fails_the_digest_stands_in_and_the_client_is_told() {
    let (provider, proxy) = setup(SummaryMode::Error).await;
    let answer = post(
        &proxy,
        &request(&long_history(), compact_edit(false), false),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let note = answer.headers()["x-abridge-note"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(note.contains("digest"), "{note}");
    let answer: Value = answer.json().await.unwrap();
    let summary = answer["content"][0]["content"].as_str().unwrap();
    assert!(summary.contains("Keep the file names."), "{summary}");
    assert!(summary.contains("Digest of"), "{summary}");
    assert_eq!(answer["usage"]["iterations"][0]["input_tokens"], json!(0));
    assert_eq!(
        summary_calls(&provider).len(),
        1,
        "asked once, then the digest"
    );
}
