//! The summariser against real HTTP: the main upstream with the client's credentials, a
//! separate provider with its own key (the client's never sent there), and every way a
//! summary can fail.

use std::time::Duration;

use abridge::compactor::summariser::{Summariser, SummaryFailure};
use abridge::config::SummaryConfig;
use abridge::formats::Format;
use abridge::headers::Credentials;
use abridge::headers::Provider;
use abridge::secret::Secret;
use abridge::strategies::{Answer, SummaryRequest};
use abridge::upstream::Upstream;
use fake_provider::{Behavior, FakeProvider, SummaryMode};
use http::HeaderMap;

use crate::common::config_for;

fn call() -> SummaryRequest {
    SummaryRequest {
        system: "You summarise conversations.".into(),
        prompt: "Summarise this transcript.\n[USER] fix src/lib.rs\n[ASSISTANT] done".into(),
        max_tokens: 500,
        in_context: None,
    }
}

fn client_headers() -> Credentials {
    let mut h = HeaderMap::new();
    h.insert("authorization", "Bearer sk-client".parse().unwrap());
    h.insert("openai-organization", "org-client".parse().unwrap());
    h.insert("x-stainless-lang", "python".parse().unwrap());
    let tenant_headers = abridge::Config::default().identity.tenant_headers;
    Credentials::from_headers(&h, tenant_headers.iter().map(|h| &h.0))
}

/// A chat-completions summary of `call` for `model`, on the main upstream with `client`'s
/// credentials.
async fn chat(
    s: &Summariser,
    client: &Credentials,
    model: &str,
    call: &SummaryRequest,
) -> Result<Answer, SummaryFailure> {
    s.summarise((client, Provider::Main, Format::Chat, None), model, call)
        .await
}

fn summariser(main: &FakeProvider, summary: SummaryConfig) -> Summariser {
    let config = config_for(&main.url());
    let upstream = Upstream::new(&config).unwrap();
    Summariser::new(&summary, &upstream)
}

#[tokio::test]
async fn the_main_upstream_gets_the_clients_credentials_and_model() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let s = summariser(&provider, SummaryConfig::default());
    let text = chat(&s, &client_headers(), "gpt-4o", &call())
        .await
        .unwrap()
        .text;
    assert!(
        text.contains("## Goal") && text.contains("src/lib.rs"),
        "{text}"
    );
    let seen = provider.last_request().unwrap();
    assert_eq!(seen.uri.path(), "/v1/chat/completions");
    assert_eq!(seen.headers["authorization"], "Bearer sk-client");
    assert_eq!(seen.headers["openai-organization"], "org-client");
    assert!(
        seen.headers.get("x-stainless-lang").is_none(),
        "only credential headers"
    );
    let body = seen.json();
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["stream"], false);
    assert_eq!(body["max_tokens"], 500);
    assert_eq!(body["messages"][0]["role"], "system");
}

#[tokio::test]
async fn a_separate_provider_gets_its_own_key_and_never_the_clients() {
    let main = FakeProvider::start(Behavior::default()).await.unwrap();
    let cheap = FakeProvider::start(Behavior::default()).await.unwrap();
    let config = SummaryConfig {
        model: "cheap-model".into(),
        upstream: Some(cheap.url().parse().unwrap()),
        api_key: Some(Secret::new("sk-summary")),
        ..SummaryConfig::default()
    };
    let s = summariser(&main, config);
    chat(&s, &client_headers(), "gpt-4o", &call())
        .await
        .unwrap();
    assert!(main.requests().is_empty());
    let seen = cheap.last_request().unwrap();
    assert_eq!(seen.headers["authorization"], "Bearer sk-summary");
    assert!(seen.headers.get("openai-organization").is_none());
    assert_eq!(seen.json()["model"], "cheap-model");
}

#[tokio::test]
async fn failures_are_reported_not_hidden() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let s = summariser(&provider, SummaryConfig::default());

    provider.set_behavior(|b| b.summary = SummaryMode::Error);
    let err = chat(&s, &client_headers(), "m", &call()).await.unwrap_err();
    assert!(
        matches!(err, SummaryFailure::Status { status: 500, .. }),
        "{err}"
    );

    provider.set_behavior(|b| b.summary = SummaryMode::Empty);
    assert_eq!(
        chat(&s, &client_headers(), "m", &call()).await.unwrap_err(),
        SummaryFailure::Empty
    );

    provider.set_behavior(|b| {
        b.summary = SummaryMode::Good;
        b.stall = Some(fake_provider::Stall::BeforeHeaders);
    });
    let quick = summariser(
        &provider,
        SummaryConfig {
            timeout_ms: 200,
            ..SummaryConfig::default()
        },
    );
    let started = std::time::Instant::now();
    let err = chat(&quick, &client_headers(), "m", &call())
        .await
        .unwrap_err();
    assert!(matches!(err, SummaryFailure::Timeout(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let nowhere = config_for(&format!("http://{}/v1", crate::common::closed_port().await));
    let s = Summariser::new(&SummaryConfig::default(), &Upstream::new(&nowhere).unwrap());
    assert!(matches!(
        chat(&s, &client_headers(), "m", &call()).await.unwrap_err(),
        SummaryFailure::Unreachable(_)
    ));
}

#[tokio::test]
async fn reasoning_models_are_asked_in_the_form_they_accept() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let s = summariser(&provider, SummaryConfig::default());
    let client = client_headers();
    // gpt-5 is known by its name: one request, in its form.
    chat(&s, &client, "gpt-5.2", &call()).await.unwrap();
    let body = provider.last_request().unwrap().json();
    assert_eq!(body["max_completion_tokens"], 500);
    assert!(body.get("max_tokens").is_none() && body.get("temperature").is_none());
    assert_eq!(provider.requests().len(), 1);

    // A model abridge cannot guess: each refusal is read (the provider names one
    // parameter at a time), the call retried in the form it names, and the form
    // remembered — the next summary is one request.
    for expected in [4, 5] {
        chat(&s, &client, "fake-reasoning-1", &call())
            .await
            .unwrap();
        assert_eq!(provider.requests().len(), expected);
    }
    let bodies: Vec<_> = provider.requests().iter().map(|r| r.json()).collect();
    assert_eq!(bodies[1]["max_tokens"], 500, "the first try as usual");
    assert_eq!(bodies[2]["max_completion_tokens"], 500);
    assert!(
        bodies[2]["temperature"].is_number(),
        "one parameter at a time"
    );
    assert!(bodies[3].get("temperature").is_none());
    assert_eq!(bodies[4], bodies[3], "remembered");
    let other = chat(&s, &client, "gpt-4o", &call()).await.unwrap().text;
    assert!(!other.is_empty());
    assert_eq!(
        provider.last_request().unwrap().json()["max_tokens"],
        500,
        "others keep max_tokens"
    );
}

/// A conversation in Anthropic's API is summarised in it, on its own upstream (an
/// Anthropic-only gateway has no chat completions), with the client's key and protocol
/// headers; an answer cut at `max_tokens` says so.
#[tokio::test]
async fn an_anthropic_conversation_is_summarised_through_the_messages_api() {
    let openai = FakeProvider::start(Behavior::default()).await.unwrap();
    let anthropic = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&openai.url());
    config.anthropic_upstream = Some(anthropic.url().parse().unwrap());
    let s = Summariser::new(&SummaryConfig::default(), &Upstream::new(&config).unwrap());
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "sk-ant-client".parse().unwrap());
    h.insert("anthropic-version", "2023-06-01".parse().unwrap());
    h.insert("anthropic-beta", "oauth-2025-04-20".parse().unwrap());
    let names = abridge::Config::default().identity.tenant_headers;
    let client = Credentials::from_headers(&h, names.iter().map(|h| &h.0));
    let whole = s
        .summarise(
            (&client, Provider::Anthropic, Format::Messages, None),
            "claude-sonnet-4",
            &call(),
        )
        .await
        .unwrap();
    assert!(whole.text.contains("## Goal"), "{}", whole.text);
    assert!(!whole.cut);
    let seen = anthropic.last_request().unwrap();
    assert_eq!(seen.uri.path(), "/v1/messages");
    assert_eq!(seen.headers["x-api-key"], "sk-ant-client");
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    assert_eq!(seen.headers["anthropic-beta"], "oauth-2025-04-20");
    let body = seen.json();
    assert_eq!(body["model"], "claude-sonnet-4");
    assert!(body.get("tools").is_none());
    assert!(
        openai.requests().is_empty(),
        "nothing went to the other provider"
    );
    // The same with a cap the summary does not fit in: used, and marked as cut.
    let small = SummaryRequest {
        max_tokens: 12,
        ..call()
    };
    let cut = s
        .summarise(
            (&client, Provider::Anthropic, Format::Messages, None),
            "claude-sonnet-4",
            &small,
        )
        .await
        .unwrap();
    assert!(cut.cut);
    assert!(cut.text.chars().count() <= 48, "{}", cut.text);
}

/// A chat summariser that stops at its cap says `finish_reason: "length"`: the answer
/// comes back marked as cut, not refused.
#[tokio::test]
async fn a_chat_summary_cut_at_its_cap_comes_back_marked() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let s = summariser(&provider, SummaryConfig::default());
    let small = SummaryRequest {
        max_tokens: 10,
        ..call()
    };
    let answer = chat(&s, &client_headers(), "gpt-4o", &small).await.unwrap();
    assert!(answer.cut);
    assert!(!answer.text.is_empty());
}

/// A chat-completions conversation whose key is in Anthropic's style (a gateway that
/// takes `x-api-key`) is still summarised in chat completions: the Messages API is for
/// Messages conversations.
#[tokio::test]
async fn the_summary_api_follows_the_conversations_format() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let s = summariser(&provider, SummaryConfig::default());
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "gw-key".parse().unwrap());
    let names = abridge::Config::default().identity.tenant_headers;
    let client = Credentials::from_headers(&h, names.iter().map(|h| &h.0));
    s.summarise(
        (&client, Provider::Anthropic, Format::Chat, None),
        "m",
        &call(),
    )
    .await
    .unwrap();
    assert_eq!(
        provider.last_request().unwrap().uri.path(),
        "/v1/chat/completions"
    );
}
