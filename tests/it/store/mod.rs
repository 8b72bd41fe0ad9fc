//! One store suite, five backends: in-process, a real single Redis, a real 3-node
//! Redis Cluster, and the last two again TLS-only (`rediss://`, the test CA trusted).
//! Every scenario runs against each (see `suite!`).
//!
//! Here: the backends, the fixtures and the suite's scenarios; `live_redis` has what
//! only a real Redis shows (pipelines, TTLs and hash tags, outages); `tls` what only
//! TLS does (verification, mutual TLS).

mod live_redis;
mod tls;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use abridge::accounting::{Account, Entry, MAX_POINTS, Point, Tally};
use abridge::config::StoreConfig;
use abridge::identity::{Fingerprint, IdentityKey};
use abridge::outcome::{Figures, Verdict, Why};
use abridge::secret::Secret;
use abridge::store::{Checkpoint, MAX_USAGE, Saved, Store, Usage};
use serde_json::value::RawValue;

use crate::common::redis::{RedisCluster, shared, shared_cluster, shared_tls, shared_tls_cluster};
use crate::common::redis_tls::pki;

/// A key prefix no other test uses, so tests can share one Redis.
fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn memory() -> (Store, StoreConfig) {
    let config = StoreConfig::default();
    (Store::from_config(&config).unwrap(), config)
}

fn redis_at(url: String) -> (Store, StoreConfig) {
    let config = StoreConfig {
        redis_url: Some(Secret::new(url)),
        key_prefix: unique_prefix(),
        ..StoreConfig::default()
    };
    (Store::from_config(&config).unwrap(), config)
}

/// The suite's shared servers are busy with every other test at once: a generous
/// response timeout, so a slow moment is not mistaken for an outage (the tests of the
/// timeout itself use servers of their own).
const SUITE_TIMEOUT_MS: u64 = 3000;

fn single() -> (Store, StoreConfig) {
    let config = StoreConfig {
        redis_url: Some(Secret::new(shared().url())),
        key_prefix: unique_prefix(),
        response_timeout_ms: SUITE_TIMEOUT_MS,
        ..StoreConfig::default()
    };
    (Store::from_config(&config).unwrap(), config)
}

fn cluster() -> (Store, StoreConfig) {
    cluster_of(shared_cluster(), false)
}

fn cluster_of(nodes: &RedisCluster, tls: bool) -> (Store, StoreConfig) {
    let config = StoreConfig {
        redis_cluster: nodes.urls().into_iter().map(Secret::new).collect(),
        key_prefix: unique_prefix(),
        response_timeout_ms: SUITE_TIMEOUT_MS,
        tls: if tls {
            pki().store_tls(false)
        } else {
            Default::default()
        },
        ..StoreConfig::default()
    };
    (Store::from_config(&config).unwrap(), config)
}

/// The shared TLS-only Redis, the test CA trusted.
fn tls_single() -> (Store, StoreConfig) {
    let config = StoreConfig {
        redis_url: Some(Secret::new(shared_tls().url())),
        tls: pki().store_tls(false),
        key_prefix: unique_prefix(),
        response_timeout_ms: SUITE_TIMEOUT_MS,
        ..StoreConfig::default()
    };
    (Store::from_config(&config).unwrap(), config)
}

fn tls_cluster() -> (Store, StoreConfig) {
    cluster_of(shared_tls_cluster(), true)
}

/// A conversation id as the request path makes it: a keyed hash of the tenant.
fn conversation(tenant: &str, n: u32) -> Fingerprint {
    IdentityKey::new(Secret::new("suite-secret"))
        .namespace(tenant.as_bytes(), Some(n.to_string().as_bytes()))
}

fn fingerprint(n: u32) -> Fingerprint {
    conversation("prefix", n)
}

fn checkpoint(through: u32, prefix: Fingerprint, text: &str) -> Checkpoint {
    let replacement = serde_json::json!({"role": "user", "content": text}).to_string();
    Checkpoint {
        through,
        prefix,
        head: 1,
        replacement: vec![RawValue::from_string(replacement).unwrap()],
        // A client message kept by reference travels through the store as it was.
        kept: vec![abridge::store::Kept { at: 1, of: through }],
        summary: Some(format!("summary: {text}")),
        strategy: abridge::strategies::Strategy::Recency,
        fallback: None,
        tokens_before: 1000 + u64::from(through),
        tokens_after: 100,
        tokens_sent: 0,
        created_ms: 1_700_000_000_000,
        gate: Some(abridge::strategies::Verdict {
            score: 0.5,
            repaired: vec!["sections: Goal".to_owned()],
        }),
    }
}

fn usage(prefix: Fingerprint, messages: u32, tokens: u64, applied: Option<u32>) -> Usage {
    Usage {
        prefix,
        messages,
        tokens,
        applied,
        head_tokens: 40,
        growth: 300,
        ratio_permille: 1300,
        client_tokens: tokens * 2,
        beside: tokens / 3,
        at_ms: abridge::store::now_ms(),
    }
}

/// Runs each scenario on the five backends.
macro_rules! suite {
    ($($scenario:ident),* $(,)?) => {
        mod on_memory { $( #[tokio::test] async fn $scenario() { super::$scenario(super::memory()).await } )* }
        mod on_redis { $( #[tokio::test] async fn $scenario() { super::$scenario(super::single()).await } )* }
        mod on_cluster { $( #[tokio::test] async fn $scenario() { super::$scenario(super::cluster()).await } )* }
        mod on_tls_redis { $( #[tokio::test] async fn $scenario() { super::$scenario(super::tls_single()).await } )* }
        mod on_tls_cluster { $( #[tokio::test] async fn $scenario() { super::$scenario(super::tls_cluster()).await } )* }
    };
}

suite!(
    round_trip,
    checkpoints_are_monotonic_under_concurrent_writers,
    first_writer_wins_for_the_same_history,
    lock_is_exclusive_expires_and_needs_its_token,
    delete_and_recent,
    identity_secret_is_set_once,
    each_history_keeps_its_own_checkpoints,
    an_account_adds_up_and_keeps_the_latest_requests,
);

/// What a request adds to its conversation's account: `client` and `forwarded` tokens,
/// its format, its point on the plot, what was decided for it.
pub(super) fn entry(client: u64, forwarded: u64) -> Entry {
    Entry {
        tally: Tally {
            requests: 1,
            client_tokens: client,
            forwarded_tokens: forwarded,
            direct_micros: client * 3,
            forwarded_micros: forwarded * 3,
            ..Tally::default()
        },
        format: Some("messages"),
        point: Some(Point {
            at_ms: abridge::store::now_ms(),
            client,
            forwarded,
            applied: (forwarded < client).then_some(4),
        }),
        verdict: Some(Verdict {
            at_ms: abridge::store::now_ms(),
            cost: true,
            priced: true,
            compacted: forwarded < client,
            why: Some(Why::Pays),
            figures: Some(Figures {
                prompt: client,
                as_is_micros: client * 3,
                compacted_micros: forwarded * 3,
                break_even: Some(2),
                since_ms: None,
                ..Figures::default()
            }),
        }),
    }
}

async fn an_account_adds_up_and_keeps_the_latest_requests((store, _): (Store, StoreConfig)) {
    let conv = conversation("r", 1);
    assert_eq!(store.account(&conv).await.unwrap(), Account::default());
    for n in 0..(MAX_POINTS as u64 + 5) {
        store
            .record_usage(
                &conv,
                (usage(fingerprint(1), 1, 1, None), &entry(1000 + n, 400)),
                None,
                false,
            )
            .await
            .unwrap();
    }
    let summary = Tally {
        summary_calls: 1,
        summary_input_tokens: 700,
        summary_micros: 2100,
        ..Tally::default()
    };
    store.add_tally(&conv, &summary).await.unwrap();
    let recall = Tally {
        recalls: 2,
        recall_input_tokens: 900,
        ..Tally::default()
    };
    store.add_tally(&conv, &recall).await.unwrap();
    let account = store.account(&conv).await.unwrap();
    let n = MAX_POINTS as u64 + 5;
    assert_eq!(account.tally.requests, n);
    assert_eq!(
        account.tally.client_tokens,
        (0..n).map(|i| 1000 + i).sum::<u64>()
    );
    assert_eq!(account.tally.forwarded_tokens, 400 * n);
    assert_eq!((account.tally.summary_calls, account.tally.recalls), (1, 2));
    assert_eq!(account.tally.summary_micros, 2100);
    assert_eq!(account.format.as_deref(), Some("messages"));
    // The latest requests, oldest first.
    assert_eq!(account.series.len(), MAX_POINTS);
    assert_eq!(account.series.first().map(|p| p.client), Some(1005));
    assert_eq!(account.series.last().map(|p| p.client), Some(1000 + n - 1));
    assert_eq!(account.series[0].applied, Some(4));
    // What was decided for the latest request, whole.
    let verdict = account.verdict.unwrap();
    assert_eq!(verdict.why, Some(Why::Pays));
    assert_eq!(verdict.figures.map(|f| f.prompt), Some(1000 + n - 1));
    assert_eq!(verdict.figures.and_then(|f| f.break_even), Some(2));
    // Deleted with the conversation.
    store.delete(&conv).await.unwrap();
    assert_eq!(store.account(&conv).await.unwrap(), Account::default());
}

async fn round_trip((store, _): (Store, StoreConfig)) {
    let conv = conversation("Bearer sk-a", 1);
    let loaded = store.load(&conv).await.unwrap();
    assert!(loaded.checkpoints.is_empty() && loaded.state.is_none());

    let (p3, p7) = (fingerprint(3), fingerprint(7));
    assert_eq!(
        store
            .save_checkpoint(&conv, &checkpoint(3, p3, "three"), &[])
            .await
            .unwrap(),
        Saved::Stored
    );
    assert_eq!(
        store
            .save_checkpoint(&conv, &checkpoint(7, p7, "seven"), &[])
            .await
            .unwrap(),
        Saved::Stored
    );
    store
        .record_usage(
            &conv,
            (usage(fingerprint(8), 9, 4321, None), &Entry::default()),
            None,
            true,
        )
        .await
        .unwrap();

    let loaded = store.load(&conv).await.unwrap();
    assert_eq!(
        loaded.checkpoints,
        vec![checkpoint(7, p7, "seven"), checkpoint(3, p3, "three")],
        "deepest first"
    );
    let state = loaded.state.clone().unwrap();
    assert_eq!(state.compactions, 2);
    assert!(state.last_seen_ms > 0);
    assert_eq!(loaded.usage.len(), 1);
    assert_eq!(
        (
            loaded.usage[0].tokens,
            loaded.usage[0].messages,
            loaded.usage[0].prefix
        ),
        (4321, 9, fingerprint(8))
    );

    // Matching: the deepest checkpoint whose prefix hash is the request's.
    let mut prefixes: Vec<Fingerprint> = (0..10).map(|i| fingerprint(100 + i)).collect();
    assert!(loaded.matching(&prefixes).is_none());
    prefixes[3] = p3;
    assert_eq!(loaded.matching(&prefixes).unwrap().through, 3);
    prefixes[7] = p7;
    assert_eq!(loaded.matching(&prefixes).unwrap().through, 7);
    assert!(
        loaded
            .matching(&prefixes[..5])
            .is_some_and(|c| c.through == 3),
        "a shorter request matches only what it contains"
    );

    // Usage per history: a sibling's report does not overwrite this one's; a later turn
    // of a history supersedes its earlier record; the deepest matching record wins.
    store
        .record_usage(
            &conv,
            (usage(fingerprint(30), 9, 999, None), &Entry::default()),
            None,
            false,
        )
        .await
        .unwrap();
    store
        .record_usage(
            &conv,
            (usage(fingerprint(11), 12, 9000, Some(7)), &Entry::default()),
            Some(fingerprint(8)),
            false,
        )
        .await
        .unwrap();
    let loaded = store.load(&conv).await.unwrap();
    let mut kept: Vec<(u64, Option<u32>)> =
        loaded.usage.iter().map(|u| (u.tokens, u.applied)).collect();
    kept.sort_unstable();
    assert_eq!(
        kept,
        vec![(999, None), (9000, Some(7))],
        "the superseded record went"
    );
    let mut history: Vec<Fingerprint> = (0..12).map(|i| fingerprint(200 + i)).collect();
    history[8] = fingerprint(30);
    assert_eq!(loaded.usage_for(&history).map(|u| u.tokens), Some(999));
    history[11] = fingerprint(11);
    assert_eq!(
        loaded.usage_for(&history).map(|u| u.tokens),
        Some(9000),
        "the deepest history the request contains"
    );
    // Bounded: the least recently reported histories go.
    for i in 0..(MAX_USAGE as u32 + 4) {
        let mut u = usage(fingerprint(500 + i), 3, u64::from(i), None);
        u.at_ms += u64::from(i) + 10_000;
        store
            .record_usage(&conv, (u, &Entry::default()), None, false)
            .await
            .unwrap();
    }
    let loaded = store.load(&conv).await.unwrap();
    assert_eq!(loaded.usage.len(), MAX_USAGE);
    assert!(
        loaded
            .usage
            .iter()
            .any(|u| u.prefix == fingerprint(500 + MAX_USAGE as u32 + 3))
    );
    assert!(!loaded.usage.iter().any(|u| u.prefix == fingerprint(30)));

    // Another conversation sees nothing of this one.
    let other = store.load(&conversation("Bearer sk-b", 1)).await.unwrap();
    assert!(other.checkpoints.is_empty() && other.state.is_none());
    assert!(store.is_healthy());
}

async fn checkpoints_are_monotonic_under_concurrent_writers((store, config): (Store, StoreConfig)) {
    let conv = conversation("t", 2);
    let mut tasks = Vec::new();
    // 50 writers at depths 1..=50 in a scrambled order, some twice.
    for i in 0..50u32 {
        let depth = (i * 37) % 50 + 1;
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .save_checkpoint(
                    &conv,
                    &checkpoint(depth, fingerprint(depth), &format!("d{depth}")),
                    &[],
                )
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // A late, paused writer arrives with a shallow checkpoint.
    store
        .save_checkpoint(&conv, &checkpoint(2, fingerprint(2), "late"), &[])
        .await
        .unwrap();

    let loaded = store.load(&conv).await.unwrap();
    let depths: Vec<u32> = loaded.checkpoints.iter().map(|c| c.through).collect();
    // Without a caller's drop list, the safety net: four histories' worth, the deepest.
    let max = config.max_checkpoints as u32 * 4;
    let expected: Vec<u32> = (50 - max + 1..=50).rev().collect();
    assert_eq!(depths, expected, "the deepest {max} stay, deepest first");
    assert_eq!(
        loaded.checkpoints[0],
        checkpoint(50, fingerprint(50), "d50")
    );
}

async fn first_writer_wins_for_the_same_history((store, _): (Store, StoreConfig)) {
    let conv = conversation("t", 3);
    let prefix = fingerprint(5);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .save_checkpoint(&conv, &checkpoint(5, prefix, &format!("writer {i}")), &[])
                .await
                .unwrap()
        }));
    }
    let mut stored = 0;
    for t in tasks {
        if t.await.unwrap() == Saved::Stored {
            stored += 1;
        }
    }
    assert_eq!(stored, 1);
    let loaded = store.load(&conv).await.unwrap();
    assert_eq!(loaded.checkpoints.len(), 1);
    assert_eq!(loaded.state.unwrap().compactions, 1);
    // A fork at the same depth (other history) is a different checkpoint.
    assert_eq!(
        store
            .save_checkpoint(&conv, &checkpoint(5, fingerprint(55), "fork"), &[])
            .await
            .unwrap(),
        Saved::Stored
    );
    assert_eq!(store.load(&conv).await.unwrap().checkpoints.len(), 2);
}

async fn lock_is_exclusive_expires_and_needs_its_token((store, _): (Store, StoreConfig)) {
    let conv = conversation("t", 4);
    let ttl = Duration::from_millis(300);
    let first = store
        .try_lock(&conv, ttl)
        .await
        .unwrap()
        .expect("free lock");
    assert!(
        store.try_lock(&conv, ttl).await.unwrap().is_none(),
        "exclusive"
    );
    // Someone else's token cannot release it.
    let other = store
        .try_lock(&conversation("t", 40), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(!store.unlock(&conv, &other).await.unwrap());
    assert!(store.try_lock(&conv, ttl).await.unwrap().is_none());
    // Released by its holder, free again.
    assert!(store.unlock(&conv, &first).await.unwrap());
    let second = store
        .try_lock(&conv, ttl)
        .await
        .unwrap()
        .expect("free after release");
    // Expiry frees it; the expired holder can no longer release the new holder's lock.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let third = store
        .try_lock(&conv, ttl)
        .await
        .unwrap()
        .expect("free after expiry");
    assert!(!store.unlock(&conv, &second).await.unwrap());
    assert!(store.try_lock(&conv, ttl).await.unwrap().is_none());
    assert!(store.unlock(&conv, &third).await.unwrap());
}

async fn delete_and_recent((store, _): (Store, StoreConfig)) {
    let (a, b) = (conversation("t", 5), conversation("t", 6));
    store
        .record_usage(
            &a,
            (usage(fingerprint(1), 1, 1, None), &Entry::default()),
            None,
            true,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .record_usage(
            &b,
            (usage(fingerprint(2), 2, 2, None), &Entry::default()),
            None,
            true,
        )
        .await
        .unwrap();
    store
        .save_checkpoint(&a, &checkpoint(1, fingerprint(1), "a"), &[])
        .await
        .unwrap();

    let recent = store.recent(0, 10).await.unwrap();
    let ids: Vec<Fingerprint> = recent.iter().map(|r| r.conversation).collect();
    assert_eq!(&ids[..2], &[b, a], "most recent first");
    assert_eq!(
        store.recent(1, 1).await.unwrap()[0].conversation,
        a,
        "paginated"
    );

    assert!(store.delete(&a).await.unwrap());
    assert!(!store.delete(&a).await.unwrap());
    let loaded = store.load(&a).await.unwrap();
    assert!(loaded.checkpoints.is_empty() && loaded.state.is_none());
    assert!(
        !store
            .recent(0, 10)
            .await
            .unwrap()
            .iter()
            .any(|r| r.conversation == a)
    );
    assert!(store.load(&b).await.unwrap().state.is_some());
}

async fn identity_secret_is_set_once((store, config): (Store, StoreConfig)) {
    let first = store
        .identity_secret(&Secret::new("candidate-one"))
        .await
        .unwrap();
    assert_eq!(first.expose(), "candidate-one");
    let again = store
        .identity_secret(&Secret::new("candidate-two"))
        .await
        .unwrap();
    assert_eq!(again.expose(), "candidate-one");
    if config.redis_url.is_some() || !config.redis_cluster.is_empty() {
        // Another replica (another client of the same Redis) gets the same secret.
        let replica = Store::from_config(&config).unwrap();
        assert_eq!(
            replica
                .identity_secret(&Secret::new("candidate-three"))
                .await
                .unwrap()
                .expose(),
            "candidate-one"
        );
    }
}

/// Sibling conversations (one opening, two histories) keep their own checkpoints: each
/// history keeps its deepest `max_checkpoints`, whatever the other saves.
async fn each_history_keeps_its_own_checkpoints((store, config): (Store, StoreConfig)) {
    let conv = conversation("t", 9);
    let max = config.max_checkpoints;
    // Two histories: prefixes of A and of B differ from message 1 on.
    let a: Vec<Fingerprint> = (0..60).map(|i| fingerprint(1000 + i)).collect();
    let b: Vec<Fingerprint> = (0..60).map(|i| fingerprint(2000 + i)).collect();
    let save = async |prefixes: &[Fingerprint], depth: u32| {
        let loaded = store.load(&conv).await.unwrap();
        let new = checkpoint(depth, prefixes[depth as usize], "x");
        let drop = loaded.to_drop(prefixes, &new, max);
        store.save_checkpoint(&conv, &new, &drop).await.unwrap();
    };
    for depth in 1..=3 {
        save(&b, depth).await;
    }
    for depth in 1..=(max as u32 + 10) {
        save(&a, depth).await;
    }
    let loaded = store.load(&conv).await.unwrap();
    let of = |p: &[Fingerprint]| {
        loaded
            .all_matching(p)
            .map(|c| c.through)
            .collect::<Vec<_>>()
    };
    let deepest: Vec<u32> = (11..=max as u32 + 10).rev().collect();
    assert_eq!(of(&a), deepest, "A keeps its deepest {max}");
    assert_eq!(of(&b), vec![3, 2, 1], "B lost nothing to A");
}
