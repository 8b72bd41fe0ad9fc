//! A store outage in the middle of a request: the request is answered, and what it
//! could not read it does not overwrite once the store is back.

use std::time::Duration;

use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::json;

use crate::common::redis::RedisServer;
use crate::common::turns::{last_forwarded, send, until_compacted};
use crate::common::{Proxy, client, config_for};

/// A request abridge decided without the store (Redis paused through its load) whose
/// response comes after Redis is back: its usage, recorded then, would say "sent with no
/// checkpoint" and make the next turn compact afresh. The next turn is forwarded with
/// the checkpoint it had before the outage, byte for byte.
#[tokio::test]
async fn a_turn_the_store_could_not_be_read_for_leaves_the_checkpoints_as_they_were() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.store.redis_url = Some(Secret::new(redis.url()));
    config.store.response_timeout_ms = 200;
    config.compaction.threshold_tokens = 3000;
    config.compaction.strategy = Strategy::Recency;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;

    let mut messages = Vec::new();
    until_compacted(&proxy, &mut messages).await;
    messages.push(json!({"role": "user", "content": "And the lighthouse keeper?"}));
    let before = send(&proxy, &messages).await;
    assert!(before.compacted && before.note.is_none());
    let forwarded_before = last_forwarded(&provider);
    assert!(proxy.state.store().is_healthy());

    // Redis stops answering: the load times out (200 ms) and the request goes on without
    // the store. Redis answers again long before the provider does (1.5 s later), past
    // the store's next probe (500 ms), so a usage record would be written.
    redis.pause();
    let during = {
        let proxy_url = proxy.url("/v1/chat/completions");
        let body = json!({"model": "fake-model", "messages": messages}).to_string();
        tokio::spawn(async move {
            client()
                .post(proxy_url)
                .header("authorization", "Bearer sk-turns")
                .header("x-fake-latency-ms", "1500")
                .body(body)
                .send()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    redis.resume();
    let during = during.await.unwrap();
    assert_eq!(during.status(), 200, "never failed by the store");
    let note = during.headers()["x-abridge-note"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(note.contains("store"), "{note}");
    during.bytes().await.unwrap();
    // What the record stage would have written has had time to land, and the store's
    // next probe is due: the next load reaches Redis.
    tokio::time::sleep(Duration::from_millis(800)).await;

    let after = send(&proxy, &messages).await;
    assert!(after.compacted, "compacted again");
    assert_eq!(after.note, None);
    assert_eq!(
        last_forwarded(&provider),
        forwarded_before,
        "the same head and replacement, byte for byte, as before the outage"
    );
}
