//! Secrets a user pastes into a conversation: whatever abridge stores or shows of it
//! (markers, indexes, digests, summaries) has them redacted, whichever strategy wrote
//! it, while what the client sent and abridge forwards as it came is untouched.

use abridge::identity::Fingerprint;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, is_summary_request};
use serde_json::{Value, json};

use crate::common::{Proxy, client, config_for};

const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const GITHUB: &str = "ghp_Zx8QmVb3Lk2Jr5Tn7Wp9Yc1Hd4Fg6Sa0EuIo";
const PASSWORD: &str = "hunter2";

/// A coding session in which secrets are pasted early (the part compaction replaces),
/// in the user's words, in a tool call's arguments and in bulky tool outputs, and once
/// more in the final turn (which is forwarded as sent).
fn session() -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": "You are a coding agent in /srv/app."})];
    for i in 0..6 {
        m.push(json!({"role": "user", "content": format!(
            "Step {i}: deploy with key {AWS} and token {GITHUB}; the db password=hunter2 is in .env. {}",
            "Details of the step. ".repeat(40))}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{i}"), "type": "function",
            "function": {"name": "run", "arguments": json!({"command": format!("aws configure set aws_access_key_id {AWS}")}).to_string()}}]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": format!(
            "export GITHUB_TOKEN={GITHUB}\n{}exit code: 0", "log line of the deploy\n".repeat(200))}));
        m.push(json!({"role": "assistant", "content": format!("Step {i} done with {AWS}.")}));
    }
    m.push(json!({"role": "user", "content": format!("Now rotate {AWS}, please.")}));
    m
}

/// Summaries on the conversation's own model ride its prompt cache: asked after the
/// conversation as the client sent it (or as it was forwarded), so they carry its
/// secrets, to the provider the client addressed them to, and nothing more. A separate summary model is sent a
/// transcript, redacted.
#[tokio::test]
async fn no_strategy_stores_or_shows_a_pasted_secret() {
    for summary_model in ["", "summary-model"] {
        stores_or_shows_none(summary_model).await;
    }
}

async fn stores_or_shows_none(summary_model: &str) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.summary.model = summary_model.to_owned();
    config.compaction.threshold_tokens = 4000;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let body = json!({"model": "fake-model", "messages": session()}).to_string();
    let send_as = |strategy: &'static str, compact: &'static str| {
        let request = client()
            .post(proxy.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-secrets")
            .header("x-abridge-compact", compact)
            .header("x-abridge-strategy", strategy)
            .header("x-abridge-conversation", strategy)
            .body(body.clone());
        async move { request.send().await.unwrap() }
    };
    let send = |strategy: &'static str| send_as(strategy, "force");
    // Accepted first, so the summarising strategies may summarise.
    assert_eq!(send("recency").await.status(), 200);
    for strategy in Strategy::ALL {
        // Forwarded as it is first, as a conversation is before it grows long: the
        // provider's cache holds it, and a summary on its own model is asked after it.
        assert_eq!(send_as(strategy.as_str(), "off").await.status(), 200);
        let answer = send(strategy.as_str()).await;
        assert_eq!(answer.status(), 200);
        let headers = answer.headers().clone();
        assert_eq!(headers["x-abridge-compacted"], "true", "{strategy}");
        assert_eq!(
            headers["x-abridge-strategy"],
            strategy.as_str(),
            "{strategy}: {:?}",
            headers.get("x-abridge-note")
        );
        // What the store holds, and the admin API would show.
        let id =
            Fingerprint::from_hex(headers["x-abridge-conversation"].to_str().unwrap()).unwrap();
        let loaded = proxy.state.store().load(&id).await.unwrap();
        assert!(!loaded.checkpoints.is_empty(), "{strategy}");
        for checkpoint in &loaded.checkpoints {
            let stored = serde_json::to_string(checkpoint).unwrap();
            for secret in [AWS, GITHUB, PASSWORD] {
                assert!(
                    !stored.contains(secret),
                    "{strategy} stored {secret}: {stored}"
                );
            }
            assert!(stored.contains("[REDACTED]"), "{strategy}: {stored}");
        }
        // What the provider got: the final turn as the client wrote it.
        let forwarded = provider
            .requests()
            .into_iter()
            .rev()
            .find(|r| {
                r.uri.path().ends_with("/chat/completions")
                    && !r.json()["messages"]
                        .as_array()
                        .is_some_and(|m| is_summary_request(m))
            })
            .unwrap()
            .json();
        let last = forwarded["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(last["content"], format!("Now rotate {AWS}, please."));
    }
    // A summary request carries them only to the provider that was sent them: on the
    // own model, nothing but a conversation it was forwarded, and the ask; to a separate
    // summary model, a transcript without them.
    let requests = provider.requests();
    let messages = |r: &fake_provider::Recorded| r.json()["messages"].as_array().cloned();
    let forwarded: Vec<Vec<Value>> = requests
        .iter()
        .filter_map(messages)
        .filter(|m| !is_summary_request(m))
        .collect();
    let summaries: Vec<Vec<Value>> = requests
        .iter()
        .filter_map(messages)
        .filter(|m| is_summary_request(m))
        .collect();
    assert!(!summaries.is_empty(), "{summary_model:?}: no summary asked");
    let mut in_context = 0;
    for summary in summaries {
        let text = Value::from(summary.clone()).to_string();
        let after_it = text.contains("of the conversation above");
        assert!(!after_it || summary_model.is_empty(), "{text}");
        if after_it {
            in_context += 1;
            let before_ask = &summary[..summary.len() - 1];
            // What the client addressed to this provider, or what abridge forwarded.
            assert!(
                session().starts_with(before_ask)
                    || forwarded.iter().any(|f| f.starts_with(before_ask)),
                "a summary asked after what the client never sent: {text}"
            );
        } else {
            assert!(!text.contains(AWS) && !text.contains(GITHUB), "{text}");
        }
    }
    assert_eq!(
        in_context > 0,
        summary_model.is_empty(),
        "{summary_model:?}"
    );
}
