//! What only a real Redis shows: a load is one pipeline on one node, every key has a
//! TTL (refreshed by a turn's record, not by the read) and a conversation's keys share
//! one hash tag, and outages (a killed, a paused, a
//! not-yet-started server) fail fast and heal.

use std::time::{Duration, Instant};

use abridge::identity::{Fingerprint, IdentityKey};
use abridge::secret::Secret;
use abridge::store::{Store, StoreError};

use crate::common::redis::{RedisServer, command, command_calls, command_list, shared_cluster};

use super::{checkpoint, cluster, conversation, entry, fingerprint, redis_at, usage};

fn delta(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = after
        .iter()
        .map(|(name, calls)| {
            let was = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, c)| *c);
            (name.clone(), calls - was)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_load_is_one_pipeline_of_three_commands_on_one_node() {
    // Single Redis (its own server, so no other test's commands are counted).
    let server = RedisServer::start();
    let (store, _) = redis_at(server.url());
    let conv = conversation("t", 7);
    stored_and_recorded(&store, &conv).await;
    let before = command_calls(server.port);
    store.load(&conv).await.unwrap();
    let after = command_calls(server.port);
    assert_eq!(delta(&before, &after), vec![("hgetall".to_owned(), 3)]);

    // Cluster: the same three commands, all on the one node that owns the slot.
    let cluster_nodes = &shared_cluster().nodes;
    let (store, _) = cluster();
    stored_and_recorded(&store, &conv).await; // and connect and learn the slots
    // Other tests use the same cluster at the same time and their commands add to the
    // counts; they can only add, so one clean attempt out of a few shows what one load
    // sends (a load that sent more, or to two nodes, fails every attempt).
    let expected = vec![("hgetall".to_owned(), 3)];
    let mut seen = Vec::new();
    for _ in 0..10 {
        let before: Vec<_> = cluster_nodes
            .iter()
            .map(|n| command_calls(n.port))
            .collect();
        store.load(&conv).await.unwrap();
        let after: Vec<_> = cluster_nodes
            .iter()
            .map(|n| command_calls(n.port))
            .collect();
        let per_node: Vec<Vec<(String, u64)>> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| delta(b, a))
            .collect();
        let busy: Vec<&Vec<(String, u64)>> = per_node.iter().filter(|d| !d.is_empty()).collect();
        if busy == [&expected] {
            return;
        }
        seen.push(per_node);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no load was one pipeline of {expected:?} on one node: {seen:?}");
}

/// A conversation with a checkpoint and a turn recorded just now.
async fn stored_and_recorded(store: &Store, conv: &Fingerprint) {
    store
        .save_checkpoint(conv, &checkpoint(1, fingerprint(1), "x"), &[])
        .await
        .unwrap();
    store
        .record_usage(
            conv,
            (
                usage(fingerprint(1), 2, 10, None),
                &abridge::accounting::Entry::default(),
            ),
            None,
            false,
        )
        .await
        .unwrap();
}

/// A conversation's TTL is refreshed when a turn is recorded, not by the read at the
/// start of a request (three `HGETALL`s and nothing else) — unless no turn was
/// recorded for a seventh of the TTL (a provider that reports no usage, streams the
/// clients stop early): then the read refreshes it, so a conversation in use never
/// expires.
#[tokio::test]
async fn a_record_refreshes_the_ttl_and_a_load_only_when_no_turn_was_recorded_lately() {
    let server = RedisServer::start();
    let (store, config) = redis_at(server.url());
    let conv = conversation("t", 8);
    stored_and_recorded(&store, &conv).await;
    let keys: Vec<String> = ["ckpt", "state", "usage"]
        .iter()
        .map(|part| format!("{}:{{{conv}}}:{part}", config.key_prefix))
        .collect();
    let pttl = |key: &str| -> i64 {
        command(server.port, &["PTTL", key])
            .unwrap()
            .parse()
            .unwrap()
    };
    for key in &keys {
        command(server.port, &["PEXPIRE", key, "100000"]).unwrap();
    }
    store.load(&conv).await.unwrap();
    for key in &keys {
        let ttl = pttl(key);
        assert!(ttl > 0 && ttl <= 100_000, "{key}: a load set TTL {ttl}");
    }
    store
        .record_usage(
            &conv,
            (
                usage(fingerprint(2), 4, 20, None),
                &abridge::accounting::Entry::default(),
            ),
            None,
            false,
        )
        .await
        .unwrap();
    for key in &keys {
        let ttl = pttl(key);
        assert!(ttl > 100_000, "{key}: the record left TTL {ttl}");
    }
    // No turn recorded for a long while: the read refreshes.
    command(server.port, &["HSET", &keys[1], "last_seen", "0"]).unwrap();
    for key in &keys {
        command(server.port, &["PEXPIRE", key, "100000"]).unwrap();
    }
    store.load(&conv).await.unwrap();
    for key in &keys {
        let ttl = pttl(key);
        assert!(
            ttl > 100_000,
            "{key}: a load of a stale conversation left TTL {ttl}"
        );
    }
}

#[tokio::test]
async fn every_key_has_a_ttl_and_a_conversations_keys_share_one_hash_tag() {
    // (The store only ever sees hashes; that no credential reaches Redis through the
    // request path is checked in conversations.rs.)
    let server = RedisServer::start();
    let (store, config) = redis_at(server.url());
    let conv = IdentityKey::new(Secret::new("s")).namespace(b"Bearer sk-tenant", None);
    store
        .save_checkpoint(&conv, &checkpoint(2, fingerprint(2), "hello"), &[])
        .await
        .unwrap();
    store
        .record_usage(
            &conv,
            (usage(fingerprint(3), 3, 10, None), &entry(5000, 10)),
            None,
            true,
        )
        .await
        .unwrap();
    let summary = abridge::accounting::Tally {
        summary_calls: 1,
        ..Default::default()
    };
    store.add_tally(&conv, &summary).await.unwrap();
    store
        .try_lock(&conv, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    store
        .identity_secret(&Secret::new("identity-secret"))
        .await
        .unwrap();

    let keys: Vec<String> = command_list(server.port, &["KEYS", "*"]);
    assert!(keys.len() >= 5, "{keys:?}");
    let secret_key = format!("{}:secret", config.key_prefix);
    for key in &keys {
        assert!(key.starts_with(&config.key_prefix), "{key}");
        let ttl: i64 = command(server.port, &["PTTL", key])
            .unwrap()
            .parse()
            .unwrap();
        if *key == secret_key {
            assert_eq!(
                ttl, -1,
                "the identity secret is kept without expiry (see Store::identity_secret)"
            );
        } else {
            assert!(
                ttl > 0 && ttl <= (config.ttl_secs * 1000) as i64,
                "{key} has TTL {ttl}"
            );
        }
    }
    // Conversation keys share one hash tag: `<prefix>:{<hash>}:<part>`.
    let tagged: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains(&format!("{{{conv}}}")))
        .collect();
    // ckpt, state, usage, lock, account, series (the tenant's key has the tenant's tag).
    assert_eq!(tagged.len(), 6, "{keys:?}");
}

/// Waits until `store` answers again (the probe gate lets a call through every 500 ms).
async fn until_healthy(store: &Store, conv: &Fingerprint, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if store.load(conv).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_killed_redis_fails_fast_and_is_used_again_after_restart() {
    let mut server = RedisServer::start();
    let (store, config) = redis_at(server.url());
    let conv = conversation("t", 8);
    store
        .save_checkpoint(&conv, &checkpoint(1, fingerprint(1), "before"), &[])
        .await
        .unwrap();
    assert!(store.is_healthy());

    server.stop();
    let started = Instant::now();
    let err = store.load(&conv).await.unwrap_err();
    assert!(
        started.elapsed() < config.response_timeout() + Duration::from_millis(150),
        "{:?}: {err}",
        started.elapsed()
    );
    assert!(!store.is_healthy());
    assert!(store.last_error().is_some());
    // While it is down, calls fail at once instead of waiting each time.
    let started = Instant::now();
    for _ in 0..20 {
        assert!(store.load(&conv).await.is_err());
    }
    assert!(
        started.elapsed() < config.response_timeout() * 3,
        "{:?}",
        started.elapsed()
    );

    server.restart();
    assert!(
        until_healthy(&store, &conv, Duration::from_secs(10)).await,
        "the same Store recovers without a restart"
    );
    assert!(store.is_healthy());
    // The restarted Redis is empty (no persistence); writes work again.
    store
        .save_checkpoint(&conv, &checkpoint(2, fingerprint(2), "after"), &[])
        .await
        .unwrap();
    assert_eq!(store.load(&conv).await.unwrap().checkpoints.len(), 1);
}

#[tokio::test]
async fn a_paused_redis_cannot_stall_requests() {
    let server = RedisServer::start();
    let (store, config) = redis_at(server.url());
    let conv = conversation("t", 9);
    store.load(&conv).await.unwrap();

    server.pause();
    let started = Instant::now();
    let err = store.load(&conv).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout(_) | StoreError::Backend(_)),
        "{err}"
    );
    assert!(
        started.elapsed() < config.response_timeout() + Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    for _ in 0..20 {
        store.load(&conv).await.unwrap_err();
    }
    assert!(
        started.elapsed() < config.response_timeout() * 3,
        "{:?}",
        started.elapsed()
    );

    server.resume();
    assert!(until_healthy(&store, &conv, Duration::from_secs(10)).await);
}

#[tokio::test]
async fn a_redis_down_at_start_is_picked_up_when_it_comes() {
    let mut server = RedisServer::start();
    server.stop();
    let (store, _) = redis_at(server.url());
    let conv = conversation("t", 10);
    assert!(store.load(&conv).await.is_err());
    server.restart();
    assert!(until_healthy(&store, &conv, Duration::from_secs(10)).await);
}
