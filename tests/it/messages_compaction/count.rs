//! `POST /v1/messages/count_tokens` behind a server that lacks Anthropic's compaction
//! and context editing: abridge counts what `/v1/messages` would forward (a block sent
//! back expanded, the clearing edits applied, `context_management` and the served betas
//! withheld) and adds `original_input_tokens` as Anthropic does; behind a provider that
//! has them (`native`), the count passes untouched.

use abridge::config::ProviderCompaction;
use fake_provider::{FakeProvider, Recorded, count_message_tokens};
use serde_json::{Value, json};

use super::{BETAS, ask, block_from, forwarded, long_history, post, setup, tool_round};
use crate::common::{Proxy, client};

/// `body` posted to the count route with `betas` as its `anthropic-beta` lines.
async fn count(proxy: &Proxy, betas: &[&str], body: &Value) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01");
    for line in betas {
        request = request.header("anthropic-beta", *line);
    }
    request.json(body).send().await.unwrap()
}

/// The count requests the upstream received.
fn counted(provider: &FakeProvider) -> Vec<Recorded> {
    let requests = provider.requests().into_iter();
    requests
        .filter(|r| r.uri.path().ends_with("/count_tokens"))
        .collect()
}

fn betas_of(seen: &Recorded) -> Vec<String> {
    let lines = seen.headers.get_all("anthropic-beta").iter();
    lines.map(|v| v.to_str().unwrap().to_owned()).collect()
}

/// The fake's count of `body`, asked of it directly.
async fn count_directly(provider: &FakeProvider, body: &Value) -> u64 {
    let answer = client()
        .post(format!("{}/messages/count_tokens", provider.url()))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_count_with_a_block_sent_back_counts_the_expanded_history() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let block = block_from(&proxy, false).await;
    let mut messages = long_history();
    messages.push(
        json!({"role": "assistant", "content": [block, {"type": "text", "text": "Ported."}]}),
    );
    messages.push(ask("Commit it"));
    let body = json!({"model": "local-model", "messages": messages});
    let answer = count(&proxy, &BETAS, &body).await;
    assert_eq!(answer.status(), 200, "the fake refuses a compaction block");
    let answer: Value = answer.json().await.unwrap();
    assert!(answer.get("context_management").is_none(), "{answer}");
    let seen = counted(&provider).pop().unwrap().json();
    assert!(!seen.to_string().contains("\"compaction\""), "{seen}");
    // The same history on /v1/messages: what it forwards counts the same.
    let sent = post(
        &proxy,
        &json!({"model": "local-model", "max_tokens": 64, "messages": messages}),
    )
    .await;
    assert_eq!(sent.status(), 200);
    let sent = forwarded(&provider).pop().unwrap().json();
    assert_eq!(seen["messages"], sent["messages"]);
    let direct = count_directly(
        &provider,
        &json!({"model": "local-model", "messages": sent["messages"]}),
    )
    .await;
    assert_eq!(answer["input_tokens"], direct);
    assert!(
        direct < count_message_tokens(&body) / 4,
        "the history dropped"
    );
}

#[tokio::test]
async fn a_count_never_shows_the_upstream_the_served_betas() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let kept = [
        "claude-code-20250219,oauth-2025-04-20",
        "interleaved-thinking-2025-05-14",
    ];
    let plain = json!({"model": "local-model", "messages": [ask("hi")]});
    let answer = count(&proxy, &BETAS, &plain).await;
    assert_eq!(answer.status(), 200);
    let seen = counted(&provider).pop().unwrap();
    assert_eq!(betas_of(&seen), kept);
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    assert_eq!(seen.json(), plain, "nothing asked: the body as sent");
    // A body abridge does not understand goes on as it came, the betas withheld.
    let odd = json!({"model": "local-model", "messages": "not a list", "context_management": 1});
    let answer = count(&proxy, &BETAS, &odd).await;
    assert_eq!(answer.status(), 400, "the upstream's answer");
    let seen = counted(&provider).pop().unwrap();
    assert_eq!(seen.json(), odd);
    assert_eq!(betas_of(&seen), kept);
}

#[tokio::test]
async fn a_count_over_a_clearing_trigger_is_of_the_cleared_history() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let mut messages = vec![ask("read them all")];
    for n in 1..=4 {
        messages.extend(tool_round(n, &format!("contents of f{n} ").repeat(200)));
    }
    let edits = json!([{"type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 1}}]);
    let body = json!({"model": "local-model", "messages": messages,
        "context_management": {"edits": edits}});
    let answer = count(&proxy, &BETAS, &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    let seen = counted(&provider).pop().unwrap().json();
    assert!(seen.get("context_management").is_none(), "{seen}");
    let results = seen["messages"].to_string();
    assert_eq!(
        results.matches("contents of").count(),
        200,
        "only the newest kept"
    );
    let input = answer["input_tokens"].as_u64().unwrap();
    assert_eq!(input, count_message_tokens(&seen));
    let original = answer["context_management"]["original_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(original > 2 * input, "{answer}");
    // An estimate scaled from the upstream's count: near the uncleared history's.
    let uncleared = count_message_tokens(&body) as f64;
    let ratio = original as f64 / uncleared;
    assert!((0.5..2.0).contains(&ratio), "{original} for {uncleared}");

    // Edits that clear nothing: the count is the original one.
    let edits = json!([{"type": "clear_thinking_20251015", "keep": "all"}]);
    let body = json!({"model": "local-model", "messages": [ask("hi")],
        "context_management": {"edits": edits}});
    let answer: Value = count(&proxy, &BETAS, &body).await.json().await.unwrap();
    let original = &answer["context_management"]["original_input_tokens"];
    assert_eq!(original, &answer["input_tokens"], "{answer}");
}

#[tokio::test]
async fn an_upstream_error_on_a_managed_count_is_relayed_as_it_came() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let body = json!({"model": "local-model", "messages": [ask("hi")],
        "context_management": {"edits": []}});
    let answer = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("x-fake-status", "529")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 529);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["error"]["type"], "overloaded_error", "{answer}");
    assert!(answer.get("context_management").is_none());
    let seen = counted(&provider).pop().unwrap().json();
    assert!(seen.get("context_management").is_none(), "{seen}");
}

#[tokio::test]
async fn an_invalid_edit_on_a_count_is_refused_and_nothing_forwarded() {
    let (provider, proxy) = setup(ProviderCompaction::Serve).await;
    let edits = json!([{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]);
    let body = json!({"model": "local-model", "messages": [ask("hi")],
        "context_management": {"edits": edits}});
    let answer = count(&proxy, &BETAS, &body).await;
    assert_eq!(answer.status(), 400);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert_eq!(
        answer["error"]["message"],
        "context_management.edits.1: `clear_thinking_20251015` must be the first strategy in `context_management.edits`"
    );
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn native_forwards_a_count_untouched() {
    let (provider, proxy) = setup(ProviderCompaction::Native).await;
    let edits = json!([{"type": "clear_thinking_20251015"}, {"type": "compact_20260112"}]);
    let body = json!({"model": "local-model", "messages": [ask("hi")],
        "context_management": {"edits": edits}});
    let answer = count(&proxy, &BETAS, &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert!(answer.get("context_management").is_none(), "{answer}");
    let seen = counted(&provider).pop().unwrap();
    assert_eq!(seen.json(), body);
    assert_eq!(betas_of(&seen), BETAS);
    // A compaction block goes on too, and this server (lacking it) refuses it.
    let block = json!({"type": "compaction", "content": "earlier", "encrypted_content": "opaque"});
    let messages = [
        ask("hi"),
        json!({"role": "assistant", "content": [block]}),
        ask("again"),
    ];
    let answer = count(
        &proxy,
        &BETAS,
        &json!({"model": "local-model", "messages": messages}),
    )
    .await;
    assert_eq!(answer.status(), 400);
    let answer: Value = answer.json().await.unwrap();
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("Input tag 'compaction'"), "{message}");
}
