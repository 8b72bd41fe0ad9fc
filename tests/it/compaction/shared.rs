//! Compaction state that outlives a process or is shared by replicas: checkpoints in
//! Redis across a restart, one summary per compaction across replicas, and the
//! conversation's lock (renewed, released, or left to expire by a crashed builder).

use std::time::Duration;

use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, count_tokens};
use serde_json::json;

use crate::common::Proxy;
use crate::common::agent::{Agent, main_requests, raw_messages, summary_requests};
use crate::common::redis::RedisServer;

use super::{THRESHOLD, config};

#[tokio::test]
async fn after_a_restart_with_redis_the_next_turn_gets_the_same_replacement() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.store.redis_url = Some(Secret::new(redis.url()));
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg.clone()).await;
    let mut agent = Agent::new(&proxy, "sk-restart");
    let mut n = 0;
    loop {
        n += 1;
        let answers = agent.turn(n).await;
        if answers[1].compacted() {
            break;
        }
        assert!(n < 20, "never compacted");
    }
    let before = raw_messages(&main_requests(&provider).pop().unwrap());
    proxy.shutdown().await.unwrap();

    let proxy = Proxy::start_with(cfg).await;
    agent.url = proxy.url("/v1/chat/completions");
    agent
        .messages
        .push(json!({"role": "user", "content": "One more question."}));
    let answer = agent.send().await;
    assert!(answer.compacted(), "{:?}", answer.headers);
    let after = raw_messages(&main_requests(&provider).pop().unwrap());
    assert_eq!(
        after[..before.len()],
        before[..],
        "the same head and replacement, byte for byte"
    );
    assert_eq!(
        proxy.stats().compactions_total(),
        0,
        "reused, not recomputed"
    );
}

#[tokio::test]
async fn two_replicas_on_one_redis_make_one_summary_per_compaction() {
    two_replicas_one_summary(Duration::from_millis(300), 15_000).await;
}

#[tokio::test]
async fn a_summary_longer_than_the_lock_ttl_keeps_its_lock() {
    // The builder renews its lock: a summary taking four lock lifetimes is still built
    // once, the other replica waiting for it all along.
    two_replicas_one_summary(Duration::from_millis(1200), 300).await;
}

#[tokio::test]
async fn a_client_leaving_during_a_summary_releases_the_conversations_lock() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.compaction.background = false;
    cfg.compaction.lock_ttl_ms = 300;
    cfg.summary.timeout_ms = 10_000;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-leaves");
    agent.headers = vec![("x-abridge-compact".into(), "off".into())];
    let mut n = 0;
    let mut conversation = None;
    while count_tokens(&agent.messages) < THRESHOLD + 500 {
        n += 1;
        for answer in agent.turn(n).await {
            conversation = answer.header("x-abridge-conversation");
        }
    }
    let conversation = abridge::identity::Fingerprint::from_hex(&conversation.unwrap()).unwrap();
    agent.headers.clear();
    agent
        .messages
        .push(json!({"role": "user", "content": "Where are we?"}));

    // The summary takes seconds; the client gives up while it is being built.
    provider.set_behavior(|b| b.latency = Duration::from_secs(5));
    let summaries = summary_requests(&provider);
    let request = tokio::spawn(async move { agent.send().await });
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| summary_requests(p) > summaries)
            .await,
        "the summary was requested"
    );
    assert!(proxy.state.store().lock_held(&conversation).await.unwrap());
    request.abort();
    // The abandoned compaction lets go of its lock (at the latest when it expires, 300
    // ms): the next request for the conversation must not wait out a summary nobody
    // is building.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while proxy.state.store().lock_held(&conversation).await.unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock is still held (and renewed) for a request that is gone"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn two_replicas_one_summary(latency: Duration, lock_ttl_ms: u64) {
    let redis = RedisServer::start();
    // Summaries take a while, so the second replica's request arrives during the first's.
    let provider = FakeProvider::start(Behavior {
        latency,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.store.redis_url = Some(Secret::new(redis.url()));
    cfg.compaction.background = false;
    cfg.compaction.lock_ttl_ms = lock_ttl_ms;
    let (one, two) = (
        Proxy::start_with(cfg.clone()).await,
        Proxy::start_with(cfg).await,
    );
    // Build a long history under the threshold with compaction off, then send the same
    // over-threshold request to both replicas at once.
    let mut agent = Agent::new(&one, "sk-shared");
    agent.headers = vec![("x-abridge-compact".into(), "off".into())];
    let mut n = 0;
    while count_tokens(&agent.messages) < THRESHOLD + 500 {
        n += 1;
        agent.turn(n).await;
    }
    agent.headers.clear();
    agent
        .messages
        .push(json!({"role": "user", "content": "Where are we?"}));
    let mut other = Agent::new(&two, "sk-shared");
    other.messages = agent.messages.clone();
    let summaries = summary_requests(&provider);
    let (a, b) = tokio::join!(agent.send(), other.send());
    assert!(
        a.compacted() && b.compacted(),
        "{:?} {:?}",
        a.headers,
        b.headers
    );
    assert_eq!(
        summary_requests(&provider) - summaries,
        1,
        "exactly one summariser call"
    );
    let sent = main_requests(&provider);
    let (x, y) = (
        raw_messages(&sent[sent.len() - 1]),
        raw_messages(&sent[sent.len() - 2]),
    );
    assert_eq!(x, y, "both replicas forwarded the same replacement");
}

#[tokio::test]
async fn a_crashed_summary_builder_does_not_block_the_conversation() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-crashed");
    agent.headers = vec![("x-abridge-compact".into(), "off".into())];
    let mut n = 0;
    let mut conversation = None;
    while count_tokens(&agent.messages) < THRESHOLD + 500 {
        n += 1;
        conversation = agent.turn(n).await[0].header("x-abridge-conversation");
    }
    agent.headers.clear();
    agent
        .messages
        .push(json!({"role": "user", "content": "Where are we?"}));
    // A builder that took the lock and died: nobody renews it, it expires.
    let id = abridge::identity::Fingerprint::from_hex(&conversation.unwrap()).unwrap();
    let store = proxy.state.store();
    let _abandoned = store
        .try_lock(&id, Duration::from_millis(400))
        .await
        .unwrap()
        .unwrap();
    let started = std::time::Instant::now();
    let answer = agent.send().await;
    assert!(answer.compacted(), "{:?}", answer.headers);
    assert_eq!(
        answer.header("x-abridge-strategy").as_deref(),
        Some("structured"),
        "the waiter built the summary itself"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited {:?}, not the summary timeout",
        started.elapsed()
    );
    assert_eq!(proxy.stats().summary_calls, 1);
}
