//! The request path's use of identity and the store: every chat turn is recognised as
//! part of its conversation and the usage the provider reported is recorded against it,
//! per tenant, with nothing of the credential stored; the store failing never fails a
//! request.

use std::time::Duration;

use abridge::identity::{Fingerprint, IdentityKey};
use abridge::secret::Secret;
use fake_provider::FakeProvider;

use crate::common::redis::{RedisServer, command, command_calls, command_list, contents};
use crate::common::{Proxy, client, config_for, eventually};

const MESSAGES: &str = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"Plan a trip to Lisbon."},{"role":"assistant","content":"Sure."},{"role":"user","content":"Three days."}]"#;

fn body() -> String {
    format!(r#"{{"model":"gpt-4o-mini","messages":{MESSAGES}}}"#)
}

async fn proxy_on_redis(provider: &FakeProvider, redis: &RedisServer) -> Proxy {
    let mut config = config_for(&provider.url());
    config.store.redis_url = Some(Secret::new(redis.url()));
    config.store.key_prefix = "conv".into();
    Proxy::start_with(config).await
}

/// The conversation key abridge must have computed: the prefix hash through the first
/// user message, in the tenant's namespace, with the secret the store holds.
fn expected_conversation(port: u16, tenant: &str, explicit: Option<&str>) -> Fingerprint {
    let secret = command(port, &["GET", "conv:secret"]).unwrap();
    assert_eq!(secret.len(), 64, "a generated 256-bit secret");
    let key = IdentityKey::new(Secret::new(secret));
    let body = body();
    let parsed = abridge::formats::chat::parse(body.as_bytes()).unwrap();
    // The tenant as abridge reads it: the credential headers, names and values.
    let mut headers = http::HeaderMap::new();
    headers.insert("authorization", tenant.parse().unwrap());
    let tenant_headers = abridge::Config::default().identity.tenant_headers;
    let credentials =
        abridge::headers::Credentials::from_headers(&headers, tenant_headers.iter().map(|h| &h.0));
    abridge::identity::identify(
        &key,
        (
            &credentials.tenant(),
            &credentials.payer(abridge::headers::Provider::Main, false),
        ),
        abridge::identity::Scope {
            format: None,
            conversation: explicit.map(str::as_bytes),
        },
        &parsed.messages,
    )
    .unwrap()
    .conversation
}

async fn send(proxy: &Proxy, tenant: &str, explicit: Option<&str>) -> serde_json::Value {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", tenant)
        .body(body());
    if let Some(id) = explicit {
        request = request.header("x-abridge-conversation", id);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn state_of(port: u16, conversation: &Fingerprint, field: &str) -> String {
    if matches!(field, "tokens" | "messages") {
        return usage_of(port, conversation, field);
    }
    if field == "prefix" {
        // The usage record's field is the prefix hash of its history.
        let keys = command_list(port, &["HKEYS", &format!("conv:{{{conversation}}}:usage")]);
        return keys.first().cloned().unwrap_or_default();
    }
    command(
        port,
        &["HGET", &format!("conv:{{{conversation}}}:state"), field],
    )
    .unwrap_or_default()
}

/// A field of the conversation's one history's usage record (`tokens:messages:…`).
fn usage_of(port: u16, conversation: &Fingerprint, field: &str) -> String {
    let values = command_list(port, &["HVALS", &format!("conv:{{{conversation}}}:usage")]);
    let Some(value) = values.first() else {
        return String::new();
    };
    let at = if field == "tokens" { 0 } else { 1 };
    value.split(':').nth(at).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn reported_usage_is_recorded_per_tenant_without_the_credential() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = proxy_on_redis(&provider, &redis).await;

    let reply = send(&proxy, "Bearer sk-tenant-A-SECRET", None).await;
    let tokens = reply["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap()
        .to_string();
    let a = expected_conversation(redis.port, "Bearer sk-tenant-A-SECRET", None);
    assert!(
        eventually(Duration::from_secs(3), || state_of(
            redis.port, &a, "tokens"
        ) == tokens)
        .await
    );
    assert_eq!(state_of(redis.port, &a, "messages"), "4");

    // The same conversation from another tenant is another conversation.
    send(&proxy, "Bearer sk-tenant-B-SECRET", None).await;
    let b = expected_conversation(redis.port, "Bearer sk-tenant-B-SECRET", None);
    assert_ne!(a, b);
    assert!(
        eventually(Duration::from_secs(3), || state_of(
            redis.port, &b, "tokens"
        ) == tokens)
        .await
    );

    // An explicit conversation id separates conversations of one tenant.
    send(&proxy, "Bearer sk-tenant-A-SECRET", Some("ticket-42")).await;
    let named = expected_conversation(redis.port, "Bearer sk-tenant-A-SECRET", Some("ticket-42"));
    assert_ne!(named, a);
    assert!(
        eventually(Duration::from_secs(3), || state_of(
            redis.port, &named, "tokens"
        ) == tokens)
        .await
    );
    assert_eq!(proxy.stats().identified, 3);

    // Nothing of a credential is in Redis, keys or values.
    assert!(
        !command_list(redis.port, &["KEYS", "conv:*"]).is_empty(),
        "the listing works"
    );
    let keys = command_list(redis.port, &["KEYS", "*SECRET*"]);
    assert!(keys.is_empty(), "{keys:?}");
    for (key, values) in contents(redis.port) {
        assert!(!values.contains("SECRET"), "{key}: {values}");
    }
    for conversation in [a, b, named] {
        let prefix = state_of(redis.port, &conversation, "prefix");
        assert_eq!(prefix.len(), 64);
        assert!(!prefix.contains("SECRET"));
    }
}

#[tokio::test]
async fn requests_succeed_while_the_store_is_down_and_state_resumes_after() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = proxy_on_redis(&provider, &redis).await;
    send(&proxy, "Bearer sk-x", None).await;
    let conversation = expected_conversation(redis.port, "Bearer sk-x", None);
    let secret = command(redis.port, &["GET", "conv:secret"]).unwrap();
    assert_eq!(secret.len(), 64);

    redis.stop();
    for _ in 0..5 {
        let reply = send(&proxy, "Bearer sk-x", None).await;
        assert!(reply["choices"][0]["message"]["content"].is_string());
    }
    assert!(!proxy.state.store().is_healthy());
    assert_eq!(
        provider.requests().len(),
        6,
        "every request reached the provider"
    );

    redis.restart();
    // The restarted Redis is empty (no persistence); the replica keeps the secret it
    // agreed on and publishes it again, so its conversation keys stay the same.
    let recorded = async {
        for _ in 0..100 {
            send(&proxy, "Bearer sk-x", None).await;
            if !state_of(redis.port, &conversation, "tokens").is_empty() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(
        recorded.await,
        "usage is recorded again after the store comes back"
    );
    // The request that found the store recovered was identified before it recovered;
    // the next one publishes the secret again.
    send(&proxy, "Bearer sk-x", None).await;
    assert!(eventually(Duration::from_secs(3), || proxy.state.store().is_healthy()).await);
    assert_eq!(
        command(redis.port, &["GET", "conv:secret"]).unwrap(),
        secret,
        "the replica's secret is back in the restarted Redis"
    );
}

#[tokio::test]
async fn the_in_process_store_identifies_conversations_by_default() {
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = Proxy::start(&provider.url()).await;
    assert_eq!(proxy.state.store().backend_name(), "memory");
    let first = send(&proxy, "Bearer sk-m", None).await;
    send(&proxy, "Bearer sk-m", None).await;
    assert_eq!(proxy.stats().identified, 2);
    assert!(first["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let recent = proxy.state.store().recent(0, 10).await.unwrap();
    assert_eq!(recent.len(), 1, "two turns of one conversation");
}

/// Calls of one Redis command so far.
fn calls(port: u16, name: &str) -> u64 {
    command_calls(port)
        .into_iter()
        .find_map(|(n, c)| (n == name).then_some(c))
        .unwrap_or(0)
}

#[tokio::test]
async fn the_recent_index_is_written_once_a_minute_per_conversation_not_every_turn() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = proxy_on_redis(&provider, &redis).await;
    send(&proxy, "Bearer sk-i", None).await;
    let conversation = expected_conversation(redis.port, "Bearer sk-i", None);
    assert!(eventually(Duration::from_secs(3), || calls(redis.port, "zadd") == 1).await);
    // The index and the conversation's own keys are written side by side.
    assert!(
        eventually(Duration::from_secs(3), || !state_of(
            redis.port,
            &conversation,
            "last_seen"
        )
        .is_empty())
        .await
    );
    let first_seen = state_of(redis.port, &conversation, "last_seen");
    let indexed = command(
        redis.port,
        &["ZSCORE", "conv:recent", &conversation.to_hex()],
    )
    .unwrap();
    assert_eq!(indexed, first_seen, "a new conversation enters the index");

    // Later turns update the conversation's own state, each in one pipeline, but the
    // global index (another round trip, another node in a Cluster) only once a minute.
    for turn in 2..=4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        send(&proxy, "Bearer sk-i", None).await;
        assert!(
            eventually(Duration::from_secs(3), || calls(redis.port, "hset") >= turn).await,
            "turn {turn} recorded"
        );
    }
    assert!(state_of(redis.port, &conversation, "last_seen") > first_seen);
    assert_eq!(calls(redis.port, "zadd"), 1);
    let listed = proxy.state.store().recent(0, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].conversation, conversation);
}
