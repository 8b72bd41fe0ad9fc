//! Redis behind Sentinel: abridge finds the master through a real sentinel and follows a
//! failover; a conversation keeps the checkpoint it had before its master died. The
//! same over TLS (sentinels, master and replica TLS-only, with mutual TLS).

use abridge::json::Raw;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use abridge::secret::Secret;
use abridge::store::Checkpoint;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::json;

use crate::common::redis::{RedisSentinel, SENTINEL_MASTER, command};
use crate::common::redis_tls::{ServerTls, pki};
use crate::common::turns::{last_forwarded, send, until_compacted};
use crate::common::{Proxy, config_for, eventually};

/// abridge behind the sentinel of `redis`, compacting early, keys under `prefix`.
async fn proxy_for(redis: &RedisSentinel, provider: &FakeProvider, prefix: &str) -> Proxy {
    let mut config = config_for(&provider.url());
    config.store.sentinel.nodes = vec![Secret::new(redis.url())];
    config.store.sentinel.master = SENTINEL_MASTER.to_owned();
    config.store.key_prefix = prefix.to_owned();
    if redis.sentinel.tls.is_some() {
        config.store.tls = pki().store_tls(true);
    }
    config.compaction.threshold_tokens = 3000;
    config.compaction.strategy = Strategy::Recency;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    assert_eq!(proxy.state.store().backend_name(), "redis-sentinel");
    proxy
}

#[tokio::test]
async fn abridge_follows_a_sentinel_failover_and_keeps_the_checkpoints() {
    let mut redis = RedisSentinel::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = proxy_for(&redis, &provider, "sentinel").await;

    // A conversation until it is compacted: the checkpoint is on the master.
    let mut messages = Vec::new();
    let conversation = until_compacted(&proxy, &mut messages).await;
    let key = format!("sentinel:{{{conversation}}}:ckpt");
    assert_eq!(
        command(redis.master.port, &["HLEN", &key]).as_deref(),
        Ok("1")
    );
    // The next turn, forwarded with that checkpoint while the master is alive.
    messages.push(json!({"role": "user", "content": "And the lighthouse keeper?"}));
    let before = send(&proxy, &messages).await;
    assert!(before.compacted && before.note.is_none());
    let forwarded_before = last_forwarded(&provider);
    // Everything written so far (the usage of that turn is recorded after its response)
    // has reached the replica: a write on our own connection, then WAIT for it.
    let usage = format!("sentinel:{{{conversation}}}:usage");
    let state = format!("sentinel:{{{conversation}}}:state");
    let recorded = eventually(Duration::from_secs(5), || {
        crate::common::redis::command_list(redis.master.port, &["HVALS", &usage])
            .iter()
            .any(|v| v.split(':').nth(1) == Some(messages.len().to_string().as_str()))
    })
    .await;
    assert!(recorded);
    let mut master = redis::Client::open(redis.master.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("SET")
        .arg("sentinel:fence")
        .arg(1)
        .query::<()>(&mut master)
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut master)
        .unwrap();
    assert_eq!(acked, 1, "the replica has everything");

    // The master dies; the sentinel promotes the replica. The client repeats the same
    // request meanwhile: every attempt is answered, and once abridge has found the new
    // master the request is forwarded with the checkpoint written before the failover.
    let old_master = redis.master.port;
    redis.master.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut during = Vec::new();
    loop {
        let answer = send(&proxy, &messages).await;
        assert_eq!(answer.status, 200, "never failed by the store");
        let promoted = redis.master_port() == Some(redis.replica.port);
        if promoted && answer.note.is_none() && answer.compacted {
            assert_eq!(answer.conversation.as_deref(), Some(conversation.as_str()));
            break;
        }
        during.push(answer.note.unwrap_or_default());
        assert!(
            Instant::now() < deadline,
            "abridge did not find the new master in {} attempts: {:?}",
            during.len(),
            during.last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let notes: BTreeSet<&String> = during.iter().collect();
    assert!(
        notes.iter().all(|n| n.contains("store")),
        "while the master was gone, requests went on without the store: {notes:?}"
    );
    assert_eq!(
        last_forwarded(&provider),
        forwarded_before,
        "the same head and replacement, byte for byte, from the promoted replica"
    );
    // And abridge writes to the new master (the usage is recorded after the response).
    let recorded = eventually(Duration::from_secs(5), || {
        crate::common::redis::command_list(redis.replica.port, &["HVALS", &usage])
            .iter()
            .any(|v| v.split(':').nth(1) == Some(messages.len().to_string().as_str()))
    })
    .await;
    assert!(
        recorded,
        "the usage of the last request is on the new master"
    );
    let stored: Vec<Checkpoint> = {
        let mut con = redis::Client::open(redis.replica.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let values: Vec<String> = redis::cmd("HVALS").arg(&key).query(&mut con).unwrap();
        values
            .iter()
            .map(|v| serde_json::from_str(v).unwrap())
            .collect()
    };
    let replacement: Vec<Raw<'_>> = stored[0]
        .replacement
        .iter()
        .map(|r| Raw::from(&**r))
        .collect();
    assert!(
        forwarded_before.contains(&replacement[0].get().to_owned()),
        "the replacement forwarded is the stored one"
    );

    // The old master comes back as a replica of the new one; then a switchover promotes
    // it again while both run. The node abridge talks to
    // is demoted under it (READONLY, and the sentinel cuts its clients): abridge follows.
    redis.master.restart_as_replica_of(redis.replica.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = command(old_master, &["INFO", "replication"]).unwrap_or_default();
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master did not rejoin: {info}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while redis.switchover().is_err() {
        assert!(Instant::now() < deadline, "no switchover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        let answer = send(&proxy, &messages).await;
        assert_eq!(answer.status, 200);
        if redis.master_port() == Some(old_master) && answer.note.is_none() && answer.compacted {
            let role = command(old_master, &["INFO", "replication"]).unwrap();
            if role.contains("role:master") {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "abridge did not follow the switchover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last_forwarded(&provider), forwarded_before);
    let recorded = eventually(Duration::from_secs(5), || {
        command(old_master, &["HGET", &state, "last_seen"]).is_ok_and(|v| !v.is_empty())
    })
    .await;
    assert!(recorded, "abridge writes to the master it switched to");
}

#[tokio::test]
async fn over_tls_abridge_keeps_its_state_and_follows_a_switchover() {
    let redis = RedisSentinel::start_with(Some(ServerTls { auth_clients: true }));
    assert!(redis.url().starts_with("rediss://"));
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = proxy_for(&redis, &provider, "tls-sentinel").await;
    let mut messages = Vec::new();
    let conversation = until_compacted(&proxy, &mut messages).await;
    let key = format!("tls-sentinel:{{{conversation}}}:ckpt");
    assert_eq!(redis.master.command(&["HLEN", &key]).as_deref(), Ok("1"));
    // The next turn is forwarded with that checkpoint, read back from the master.
    messages.push(json!({"role": "user", "content": "And the lighthouse keeper?"}));
    let before = send(&proxy, &messages).await;
    assert!(before.compacted && before.note.is_none());
    let forwarded_before = last_forwarded(&provider);
    let mut master = redis.master.client().get_connection().unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut master)
        .unwrap();
    assert_eq!(acked, 1, "the replica has everything");

    // A switchover: abridge asks the sentinel again and connects to the new master,
    // over TLS, with the same trust settings; the checkpoint is still there.
    // Generous: a switchover takes seconds, more on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis.switchover().is_err() {
        assert!(Instant::now() < deadline, "no switchover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        let answer = send(&proxy, &messages).await;
        assert_eq!(answer.status, 200, "never failed by the store");
        let promoted = redis.master_port() == Some(redis.replica.port);
        if promoted && answer.note.is_none() && answer.compacted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "abridge did not follow the switchover: {:?}",
            answer.note
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last_forwarded(&provider), forwarded_before);
    // A new turn's usage is written to the new master (the first write may still
    // reach the demoted one, be refused as READONLY and send abridge to the sentinel).
    messages.push(before.reply);
    messages.push(json!({"role": "user", "content": "Is it still lit at night?"}));
    let usage = format!("tls-sentinel:{{{conversation}}}:usage");
    let count = messages.len().to_string();
    loop {
        assert_eq!(send(&proxy, &messages).await.status, 200);
        let recorded = eventually(Duration::from_secs(1), || {
            crate::common::redis_tls::command_list(redis.replica.port, &["HVALS", &usage])
                .iter()
                .any(|v| v.split(':').nth(1) == Some(count.as_str()))
        })
        .await;
        if recorded {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "abridge does not write to the new master"
        );
    }
}
