//! Credentials go only where they belong and spend only what they may: an Anthropic
//! key reaches only Anthropic's upstream whatever path it is sent on, a key the
//! provider revoked stops spending summaries at once, and headers the provider does not
//! read cannot multiply a key's summary budget.

use abridge::config::Config;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::agent::summary_requests as summaries;
use crate::common::{Proxy, client, config_for};

/// A conversation big enough that a forced compaction's budget holds a summary.
fn history(words: usize, turns: usize) -> Value {
    let mut m = vec![json!({"role": "system", "content": "You are terse."})];
    for i in 0..turns {
        m.push(json!({"role": "user", "content": format!("Question {i}: what is in src/file_{i}.rs? {}", "context ".repeat(words))}));
        m.push(json!({"role": "assistant", "content": format!("Answer {i}: it holds parse_{i}. {}", "detail ".repeat(words))}));
    }
    m.push(json!({"role": "user", "content": "And now?"}));
    json!({"model": "fake-model", "messages": m})
}

async fn chat(proxy: &Proxy, headers: &[(&str, &str)], body: &Value) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.unwrap()
}

/// With `anthropic_upstream` set, nothing carrying Anthropic's credential style reaches
/// the main upstream, on any path or spelling of one.
#[tokio::test]
async fn an_anthropic_key_reaches_only_anthropics_upstream_whatever_the_path() {
    let openai = FakeProvider::start(Behavior::default()).await.unwrap();
    let anthropic = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&openai.url());
    config.anthropic_upstream = Some(anthropic.url().parse().unwrap());
    let proxy = Proxy::start_with(config).await;
    let http = client();
    let key = ("x-api-key", "sk-ant-secret-key");
    for (method, path) in [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/claude-sonnet-4"),
        ("GET", "/v1/files"),
        ("POST", "/v1/complete"),
        ("POST", "/v1/%6dessages"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
    ] {
        let response = http
            .request(method.parse().unwrap(), proxy.url(path))
            .header(key.0, key.1)
            .header("anthropic-version", "2023-06-01")
            .body(if method == "POST" {
                history(5, 1).to_string()
            } else {
                String::new()
            })
            .send()
            .await
            .unwrap();
        assert_ne!(response.status(), 502, "{method} {path}");
    }
    // Claude Code signed in with OAuth: a Bearer token, with anthropic-version.
    http.get(proxy.url("/v1/models"))
        .header("authorization", "Bearer sk-ant-oat01-token")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    // An empty segment is refused outright, in Anthropic's shape on its route.
    let refused = http
        .post(proxy.url("/v1//messages"))
        .header(key.0, key.1)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let leaked: Vec<String> = openai
        .requests()
        .iter()
        .filter(|r| {
            r.headers.contains_key("x-api-key")
                || r.headers
                    .get("authorization")
                    .is_some_and(|v| v.as_bytes().starts_with(b"Bearer sk-ant"))
        })
        .map(|r| format!("{} {}", r.method, r.uri))
        .collect();
    assert!(leaked.is_empty(), "reached the other provider: {leaked:?}");
    assert_eq!(anthropic.requests().len(), 8, "every one went to Anthropic");
    // A client of the main upstream still gets there.
    let answer = chat(
        &proxy,
        &[("authorization", "Bearer sk-openai")],
        &history(5, 1),
    )
    .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(openai.requests().len(), 1);
}

/// The main provider accepts only `keys`; summaries go to a separate provider paid by
/// the operator, `max_per_minute` per credential.
async fn operator_paid(keys: &[&str], max_per_minute: u32) -> (FakeProvider, FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior {
        faults: fake_provider::faults::Faults {
            api_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            ..Default::default()
        },
        ..Behavior::default()
    })
    .await
    .unwrap();
    let cheap = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg: Config = config_for(&provider.url());
    cfg.compaction.strategy = Strategy::Structured;
    cfg.compaction.threshold_tokens = 50_000;
    cfg.compaction.background = false;
    cfg.summary.upstream = Some(cheap.url().parse().unwrap());
    cfg.summary.model = "operator-model".to_owned();
    cfg.summary.max_per_tenant_per_minute = max_per_minute;
    let proxy = Proxy::start_with(cfg).await;
    (provider, cheap, proxy)
}

/// One 200 with K1, then K1 is revoked: its next requests are all refused by the
/// provider, and at most the summary already under way when the refusal came is spent.
#[tokio::test]
async fn a_revoked_key_stops_spending_summaries_at_once() {
    let (provider, cheap, proxy) = operator_paid(&["sk-k1"], 100).await;
    let k1 = ("authorization", "Bearer sk-k1");
    let force = ("x-abridge-compact", "force");
    assert_eq!(chat(&proxy, &[k1], &history(400, 4)).await.status(), 200);
    let accepted = chat(&proxy, &[k1, force], &history(400, 5)).await;
    assert_eq!(accepted.status(), 200);
    assert_eq!(accepted.headers()["x-abridge-strategy"], "structured");
    let before = summaries(&cheap);
    assert!(before >= 1);
    provider.set_behavior(|b| b.faults.api_keys = vec!["sk-k2".to_owned()]);
    for turns in 6..12 {
        let answer = chat(&proxy, &[k1, force], &history(400, turns)).await;
        assert_eq!(answer.status(), 401, "the provider's own answer");
        // Recency, as deep as it goes; never whole because the usage of the refused
        // requests (and so the checkpoint in force) never came.
        assert_eq!(
            answer.headers()["x-abridge-compacted"],
            "true",
            "turn {turns}"
        );
    }
    // The first refused request's summary was asked before its refusal came; nothing
    // after it.
    let spent = summaries(&cheap) - before;
    assert!(spent <= 2, "{spent} summaries for a revoked key");
    let after_first = summaries(&cheap);
    let answer = chat(&proxy, &[k1, force], &history(400, 12)).await;
    assert_eq!(answer.status(), 401);
    assert_eq!(summaries(&cheap), after_first);
    let note = answer.headers()["x-abridge-note"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        note.contains("accepted this request's credential"),
        "{note}"
    );
    // A 2xx accepts it again (re-instated keys work).
    provider.set_behavior(|b| b.faults.api_keys = vec!["sk-k1".to_owned()]);
    assert_eq!(chat(&proxy, &[k1], &history(400, 4)).await.status(), 200);
    let again = chat(&proxy, &[k1, force], &history(400, 13)).await;
    assert_eq!(again.headers()["x-abridge-strategy"], "structured");
}

/// Headers the provider does not read (here Google's key header on an OpenAI upstream)
/// do not make a fresh tenant with a fresh summary budget: five variants of one valid
/// key share its two summaries a minute.
#[tokio::test]
async fn ignored_headers_do_not_multiply_a_keys_summary_budget() {
    let (_provider, cheap, proxy) = operator_paid(&["sk-valid"], 2).await;
    let key = ("authorization", "Bearer sk-valid");
    let force = ("x-abridge-compact", "force");
    for n in 0..5 {
        let variant = format!("v{n}");
        let headers = [key, ("x-goog-api-key", variant.as_str())];
        assert_eq!(chat(&proxy, &headers, &history(400, 4)).await.status(), 200);
        for turns in 5..8 {
            let headers = [key, ("x-goog-api-key", variant.as_str()), force];
            assert_eq!(
                chat(&proxy, &headers, &history(400, turns)).await.status(),
                200
            );
        }
    }
    // The summaries of two compactions (each may ask once more for what it dropped).
    let spent = summaries(&cheap);
    assert!(
        (1..=4).contains(&spent),
        "{spent} summaries on a budget of 2"
    );
    assert!(proxy.stats().summary_refused >= 10);
}

/// Claude Code signed in with a subscription (OAuth) sends a bearer token Anthropic
/// accepts for Claude Code's own requests only: no summary is asked with it (it would
/// be refused, and it is not the subscriber's to spend); the note says how to get them.
#[tokio::test]
async fn a_subscription_sign_in_is_never_used_for_summaries() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config_for(&provider.url());
    cfg.compaction.strategy = Strategy::Structured;
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut messages = Vec::new();
    for i in 0..6 {
        messages.push(json!({"role": "user", "content": format!("Step {i}: fix src/m_{i}.rs {}", "context ".repeat(300))}));
        messages.push(
            json!({"role": "assistant", "content": format!("Done {i}. {}", "detail ".repeat(300))}),
        );
    }
    messages.push(json!({"role": "user", "content": "And now?"}));
    let body = json!({"model": "claude-sonnet-4", "max_tokens": 64, "messages": messages});
    let send = |force: bool| {
        let mut request = client()
            .post(proxy.url("/v1/messages"))
            .header("authorization", "Bearer sk-ant-oat01-subscriber")
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "oauth-2025-04-20")
            .body(body.to_string());
        if force {
            request = request.header("x-abridge-compact", "force");
        }
        async move { request.send().await.unwrap() }
    };
    assert_eq!(send(false).await.status(), 200);
    let answer = send(true).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-abridge-strategy"], "recency");
    let note = answer.headers()["x-abridge-note"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(note.contains("summary.upstream"), "{note}");
    assert_eq!(summaries(&provider), 0);
}
