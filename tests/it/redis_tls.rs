//! abridge with its state in a TLS-only Redis, end to end: a conversation's checkpoint
//! is kept there over mutual TLS and reused on the next turn; a server abridge cannot
//! verify costs requests nothing (they are forwarded without state, as when the store
//! is down). The store suite, Cluster and verification in detail: `store`; Sentinel
//! over TLS: `sentinel`; start-up errors and the `insecure` warning: `lifecycle`.

use std::time::{Duration, Instant};

use abridge::config::{PemFile, RedisTls};
use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::json;

use crate::common::redis::{RedisServer, shared_tls};
use crate::common::redis_tls::{ServerTls, pki};
use crate::common::turns::{last_forwarded, send, until_compacted};
use crate::common::{Proxy, config_for};

/// abridge on the TLS Redis at `url` with `tls`, compacting early, keys under `prefix`.
async fn proxy_on(provider: &FakeProvider, url: String, tls: RedisTls, prefix: &str) -> Proxy {
    let mut config = config_for(&provider.url());
    config.store.redis_url = Some(Secret::new(url));
    config.store.tls = tls;
    config.store.key_prefix = prefix.to_owned();
    config.compaction.threshold_tokens = 3000;
    config.compaction.strategy = Strategy::Recency;
    config.compaction.background = false;
    Proxy::start_with(config).await
}

#[tokio::test]
async fn abridge_keeps_and_reuses_its_state_in_a_tls_only_redis() {
    let redis = RedisServer::start_with(Some(ServerTls { auth_clients: true }));
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = proxy_on(&provider, redis.url(), pki().store_tls(true), "tls").await;
    assert_eq!(proxy.state.store().backend_name(), "redis");

    let mut messages = Vec::new();
    let conversation = until_compacted(&proxy, &mut messages).await;
    let key = format!("tls:{{{conversation}}}:ckpt");
    assert_eq!(redis.command(&["HLEN", &key]).as_deref(), Ok("1"));
    let forwarded = last_forwarded(&provider);

    // A second abridge (a replica, or this one restarted) finds the checkpoint there
    // and forwards the next turn with the same replacement.
    let other = proxy_on(&provider, redis.url(), pki().store_tls(true), "tls").await;
    messages.push(json!({"role": "user", "content": "And the lighthouse keeper?"}));
    let next = send(&other, &messages).await;
    assert_eq!(next.status, 200);
    assert!(next.compacted && next.note.is_none(), "{:?}", next.note);
    assert_eq!(next.conversation.as_deref(), Some(conversation.as_str()));
    let now = last_forwarded(&provider);
    assert_eq!(
        now[..forwarded.len() - 1],
        forwarded[..forwarded.len() - 1],
        "the same head and replacement, byte for byte"
    );
    for proxy in [&proxy, &other] {
        assert!(proxy.state.store().is_healthy());
        assert_eq!(proxy.state.store().errors(), 0);
    }
}

#[tokio::test]
async fn a_redis_abridge_cannot_verify_costs_requests_nothing() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let wrong = RedisTls {
        ca_file: Some(PemFile::read(&pki().other_ca).unwrap()),
        ..RedisTls::default()
    };
    let proxy = proxy_on(&provider, shared_tls().url(), wrong, "tls-wrong-ca").await;
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for turn in 1..=3 {
        messages.push(json!({"role": "user", "content": format!("Question {turn}?")}));
        let started = Instant::now();
        let answer = send(&proxy, &messages).await;
        assert_eq!(answer.status, 200, "forwarded without the store");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(
            answer.reply["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        );
        messages.push(answer.reply);
    }
    assert_eq!(provider.requests().len(), 3);
    let store = proxy.state.store();
    assert!(!store.is_healthy() && store.errors() > 0);
    let error = store.last_error().unwrap_or_default();
    assert!(error.contains("UnknownIssuer"), "{error}");
}
