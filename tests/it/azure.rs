//! Azure OpenAI through abridge, against the fake provider answering Azure's paths as
//! Azure does: the classic deployment path compacted like `/v1/chat/completions` (the
//! deployment standing in for the model), `api-version` and the other classic paths
//! passed on untouched, the v1 base compacted like `/v1`, tenants told apart by their
//! `api-key` (which is never stored), summaries asked of the same deployment with the
//! client's own key, and
//! 404 for what is not a path abridge serves. The official SDK's `AzureOpenAI` client
//! is the `#[ignore]`d test at the end (run by `scripts/test`).

use abridge::config::Config;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, is_summary_request};
use serde_json::{Value, json};

use crate::common::agent::Answer;
use crate::common::{Proxy, client, config_for};

const VERSION: &str = "2024-10-21";

/// abridge in front of the fake provider as an Azure resource: the v1 base.
fn azure_config(provider: &FakeProvider) -> Config {
    let mut config = config_for(&format!("http://{}/openai/v1", provider.addr()));
    config.compaction.threshold_tokens = 3000;
    config.compaction.background = false;
    config
}

async fn start() -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(azure_config(&provider)).await;
    (provider, proxy)
}

/// A classic deployment path of chat completions.
fn deployment(name: &str) -> String {
    format!("/openai/deployments/{name}/chat/completions?api-version={VERSION}")
}

/// A conversation of about 7,000 prompt tokens (over the 3,000 threshold), with no
/// model in the body, as Azure's classic clients send it.
fn history() -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": "You are terse."})];
    for i in 0..4 {
        m.push(json!({"role": "user", "content": format!("Question {i}: what is in src/file_{i}.rs? {}", "context ".repeat(400))}));
        m.push(json!({"role": "assistant", "content": format!("Answer {i}: it holds parse_{i}. {}", "detail ".repeat(400))}));
    }
    m.push(json!({"role": "user", "content": "And now?"}));
    m
}

fn chat(messages: &[Value]) -> String {
    json!({ "messages": messages }).to_string()
}

async fn send(
    proxy: &Proxy,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Answer {
    let mut request = client().request(method, proxy.url(path));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

async fn post(proxy: &Proxy, path: &str, headers: &[(&str, &str)], body: String) -> Answer {
    send(proxy, reqwest::Method::POST, path, headers, Some(body)).await
}

fn main_requests(provider: &FakeProvider) -> Vec<fake_provider::Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| {
            !r.json()["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .collect()
}

#[tokio::test]
async fn the_deployment_path_is_compacted_and_its_query_passed_on() {
    let (provider, proxy) = start().await;
    let sent = history();
    let answer = post(
        &proxy,
        &deployment("gpt-4o-prod"),
        &[("api-key", "azure-key-A")],
        chat(&sent),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert!(answer.compacted(), "{:?}", answer.headers);
    // The fake answers as the deployment's model, as Azure does.
    assert_eq!(answer.body["model"], "gpt-4o-prod");
    let forwarded = main_requests(&provider).pop().unwrap();
    assert_eq!(
        forwarded.uri.to_string(),
        format!("/openai/deployments/gpt-4o-prod/chat/completions?api-version={VERSION}")
    );
    assert_eq!(forwarded.headers["api-key"], "azure-key-A");
    let body = forwarded.json();
    assert!(body.get("model").is_none(), "abridge adds no model");
    let messages = body["messages"].as_array().unwrap();
    assert!(messages.len() < sent.len(), "{} messages", messages.len());
    assert_eq!(messages[0], sent[0], "the system message is kept");
    assert_eq!(messages.last(), sent.last(), "the final turn is kept");
}

#[tokio::test]
async fn the_deployment_stands_in_for_the_model_where_the_window_is_looked_up() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = azure_config(&provider);
    // A ratio threshold: 0.75 of the window of the model — here, of the deployment.
    config.compaction.threshold_tokens = 0;
    config
        .compaction
        .context_windows
        .insert("small-window".into(), 6000);
    let proxy = Proxy::start_with(config).await;
    // A tenant each, so that no conversation finds another's checkpoint.
    let small = post(
        &proxy,
        &deployment("small-window"),
        &[("api-key", "azure-key-A")],
        chat(&history()),
    )
    .await;
    assert_eq!(small.status, 200);
    assert!(small.compacted(), "{:?}", small.headers);
    let large = post(
        &proxy,
        &deployment("other-deploy"),
        &[("api-key", "azure-key-B")],
        chat(&history()),
    )
    .await;
    assert_eq!(large.status, 200);
    assert!(!large.compacted(), "the default window (128k) holds it");
    // A model the body names wins over the deployment.
    let mut named = json!({ "messages": history() });
    named["model"] = "gpt-4o".into();
    let by_body = post(
        &proxy,
        &deployment("small-window"),
        &[("api-key", "azure-key-C")],
        named.to_string(),
    )
    .await;
    assert!(!by_body.compacted(), "{:?}", by_body.headers);
}

#[tokio::test]
async fn other_classic_paths_and_azure_refusals_pass_through_untouched() {
    let (provider, proxy) = start().await;
    let key = [("api-key", "azure-key-A")];
    let models = send(
        &proxy,
        reqwest::Method::GET,
        &format!("/openai/models?api-version={VERSION}"),
        &key,
        None,
    )
    .await;
    assert_eq!(models.status, 200);
    assert_eq!(
        provider.last_request().unwrap().uri.to_string(),
        format!("/openai/models?api-version={VERSION}")
    );
    let embeddings = r#"{"input":"hello"}"#;
    let answer = post(
        &proxy,
        &format!("/openai/deployments/emb-3/embeddings?api-version={VERSION}&x=1"),
        &key,
        embeddings.to_owned(),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let last = provider.last_request().unwrap();
    assert_eq!(
        last.uri.to_string(),
        format!("/openai/deployments/emb-3/embeddings?api-version={VERSION}&x=1")
    );
    assert_eq!(last.body, embeddings.as_bytes());
    // Azure's own answers reach the client as Azure gave them.
    let no_version = post(
        &proxy,
        "/openai/deployments/gpt-4o/chat/completions",
        &key,
        chat(&history()[..2]),
    )
    .await;
    assert_eq!(no_version.status, 404);
    assert_eq!(no_version.body["error"]["message"], "Resource not found");
    let no_key = post(&proxy, &deployment("gpt-4o"), &[], chat(&history()[..2])).await;
    assert_eq!(no_key.status, 401);
    assert_eq!(no_key.body["error"]["code"], "401");
}

#[tokio::test]
async fn the_v1_base_and_the_classic_responses_path_are_compacted_like_v1() {
    let (provider, proxy) = start().await;
    let key = [("api-key", "azure-key-A")];
    let mut body = json!({ "messages": history() });
    body["model"] = "gpt-4o-prod".into();
    let answer = post(
        &proxy,
        "/openai/v1/chat/completions",
        &key,
        body.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert!(answer.compacted());
    assert_eq!(
        main_requests(&provider).pop().unwrap().uri.path(),
        "/openai/v1/chat/completions"
    );

    let input: Vec<Value> = history()
        .into_iter()
        .filter(|m| m["role"] != "system")
        .collect();
    let responses = json!({"model": "gpt-4o-prod", "instructions": "Be terse.", "input": input});
    let answer = post(
        &proxy,
        "/openai/v1/responses?api-version=preview",
        &key,
        responses.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert!(answer.compacted(), "{:?}", answer.headers);
    let forwarded = provider.last_request().unwrap();
    assert_eq!(
        forwarded.uri.to_string(),
        "/openai/v1/responses?api-version=preview"
    );
    let items = forwarded.json()["input"].as_array().unwrap().len();
    assert!(items < input.len(), "{items} items forwarded");

    // The classic API's preview Responses path is compacted too, its path kept.
    let classic = post(
        &proxy,
        "/openai/responses?api-version=2025-04-01-preview",
        &[("api-key", "azure-key-R")],
        responses.to_string(),
    )
    .await;
    assert_eq!(classic.status, 200, "{:?}", classic.body);
    assert!(classic.compacted(), "{:?}", classic.headers);
    assert_eq!(
        provider.last_request().unwrap().uri.to_string(),
        "/openai/responses?api-version=2025-04-01-preview"
    );
}

/// Two tenants whose only difference is their `api-key` send the same history: nothing
/// of one is visible to the other.
#[tokio::test]
async fn tenants_are_told_apart_by_their_api_key() {
    let (_provider, proxy) = start().await;
    let body = chat(&history()[..5]);
    let path = deployment("gpt-4o");
    let a = [("api-key", "azure-alpha"), ("x-abridge-compact", "force")];
    let first = post(&proxy, &path, &a, body.clone()).await;
    assert_eq!(first.status, 200);
    assert!(first.compacted(), "{:?}", first.headers);
    let again = post(&proxy, &path, &[("api-key", "azure-alpha")], body.clone()).await;
    assert!(again.compacted(), "A's own checkpoint applies to A");
    let other = post(&proxy, &path, &[("api-key", "azure-beta")], body.clone()).await;
    assert_eq!(other.status, 200);
    assert!(!other.compacted(), "B got A's checkpoint");
    assert_ne!(
        first.header("x-abridge-conversation"),
        other.header("x-abridge-conversation")
    );
    // The same key as a bearer token is another tenant too.
    let bearer = post(
        &proxy,
        &path,
        &[("authorization", "Bearer azure-alpha")],
        body,
    )
    .await;
    assert!(!bearer.compacted());
}

/// The `api-key` is never stored: the store (Redis, to look at every key and value)
/// holds only hashes of it, after a compaction on the deployment path wrote a checkpoint.
#[tokio::test]
async fn the_api_key_is_never_stored() {
    let redis = crate::common::redis::RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = azure_config(&provider);
    config.store.redis_url = Some(abridge::secret::Secret::new(redis.url()));
    let proxy = Proxy::start_with(config).await;
    let key = [("api-key", "azure-SECRET-7741")];
    let answer = post(&proxy, &deployment("gpt-4o"), &key, chat(&history())).await;
    assert!(answer.compacted(), "{:?}", answer.headers);
    let again = post(&proxy, &deployment("gpt-4o"), &key, chat(&history())).await;
    assert!(again.compacted());
    let stored = crate::common::redis::contents(redis.port);
    assert!(stored.len() > 1, "{stored:?}");
    for (name, values) in stored {
        assert!(
            !name.contains("SECRET") && !values.contains("SECRET"),
            "{name}"
        );
        assert!(!values.contains("7741"), "{name}: {values}");
    }
}

/// A summary for a conversation on a deployment path goes to that deployment, with the
/// request's `api-version` and the client's `api-key` as it came (and nothing else).
#[tokio::test]
async fn summaries_go_to_the_same_deployment_with_the_clients_key() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = azure_config(&provider);
    config.compaction.strategy = Strategy::Structured;
    config.summary.timeout_ms = 5000;
    let proxy = Proxy::start_with(config).await;
    let key = [("api-key", "azure-key-S")];
    // Summaries start once the provider has accepted the credential.
    let small = post(
        &proxy,
        &deployment("gpt-4o-prod"),
        &key,
        chat(&history()[..2]),
    )
    .await;
    assert_eq!(small.status, 200);
    let answer = post(&proxy, &deployment("gpt-4o-prod"), &key, chat(&history())).await;
    assert_eq!(answer.status, 200);
    assert!(answer.compacted(), "{:?}", answer.headers);
    let summaries: Vec<_> = provider
        .requests()
        .into_iter()
        .filter(|r| {
            r.json()["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .collect();
    assert!(!summaries.is_empty(), "{:?}", answer.headers);
    for summary in summaries {
        assert_eq!(
            summary.uri.to_string(),
            format!("/openai/deployments/gpt-4o-prod/chat/completions?api-version={VERSION}")
        );
        assert_eq!(summary.headers["api-key"], "azure-key-S");
        assert!(summary.headers.get("authorization").is_none());
    }
}

#[tokio::test]
async fn what_abridge_does_not_serve_is_404() {
    let (provider, proxy) = start().await;
    let key = [("api-key", "azure-key-A")];
    for path in [
        "/openai",
        "/azure/openai/deployments/d/chat/completions",
        "/",
    ] {
        let answer = post(&proxy, path, &key, chat(&history()[..2])).await;
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.body["error"]["code"], "unknown_url", "{path}");
    }
    let climbing = post(
        &proxy,
        "/openai/deployments/..%2f..%2fadmin/chat/completions?api-version=1",
        &key,
        chat(&history()[..2]),
    )
    .await;
    assert_eq!(climbing.status, 400);
    assert!(
        provider.requests().is_empty(),
        "nothing reached the provider"
    );

    // With an upstream that is not an Azure base, the classic paths are unknown, and
    // the error says what the upstream would have to be.
    let plain = Proxy::start(&provider.url()).await;
    let answer = post(&plain, &deployment("gpt-4o"), &key, chat(&history()[..2])).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.body["error"]["code"], "unknown_url");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("/openai/v1"), "{message}");
    assert!(provider.requests().is_empty());
    // The v1 base is only another spelling of /v1, whatever the upstream.
    let v1 = post(&plain, "/openai/v1/chat/completions", &key, {
        let mut b = json!({ "messages": &history()[..2] });
        b["model"] = "gpt-4o".into();
        b.to_string()
    })
    .await;
    assert_eq!(v1.status, 200);
    assert_eq!(
        provider.last_request().unwrap().uri.path(),
        "/v1/chat/completions"
    );
}

/// The official Python SDK's `AzureOpenAI` client, classic (`azure_endpoint` +
/// `api_version`) and on the v1 base, through abridge and straight to the fake: the
/// same answers both ways, and the long conversation compacted on the deployment path.
#[tokio::test]
#[ignore = "needs the openai Python SDK that scripts/test installs"]
async fn the_python_sdks_azure_client_sees_no_difference() {
    let (provider, proxy) = start().await;
    let stdout = crate::sdk::run(
        crate::sdk::sdk_dir().join("venv/bin/python"),
        vec![
            crate::sdk::script("azure_check.py").display().to_string(),
            format!("http://{}", provider.addr()),
            proxy.url(""),
        ],
    )
    .await;
    for line in [
        "ok classic chat",
        "ok classic stream",
        "ok classic compacted",
        "ok classic models",
        "ok classic errors",
        "ok v1 chat",
        "ok v1 responses",
        "ok v1 compacted",
    ] {
        assert!(stdout.contains(line), "{line} missing:\n{stdout}");
    }
    assert!(proxy.stats().usage_reports >= 4, "{:?}", proxy.stats());
}
