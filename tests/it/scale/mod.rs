//! Scale-out, end to end: three real `abridge` processes on a real 3-node Redis Cluster,
//! 200 conversations driven at once, each turn sent to the next replica round-robin;
//! one replica is killed (SIGKILL) mid-run and later restarted (on new ports, which the
//! clients' load balancing then uses).
//!
//! What it shows, from the outside only (client responses, the requests the fake
//! provider received, the keys in Redis, the replicas' logs):
//! - exactly one summariser call per compaction, across replicas (a compaction is a
//!   distinct checkpoint stored in Redis; calls are counted per conversation);
//! - no client-visible error: every request a live replica received is answered 200; a
//!   request to the killed replica fails at the connection and is retried on the next
//!   replica, as a load balancer would, and that succeeds;
//! - a conversation's keys share one slot, and the conversations spread over the nodes;
//! - after a compaction every turn forwards exactly head + the stored replacement +
//!   the rest, whichever replica serves it;
//! - the restarted replica carries on with the stored checkpoints;
//! - and it prints the Redis memory a compacted conversation takes (docs/src/scale-out.md).
//!
//! Here: the run and its checks; `replicas` has the processes and the clients driving
//! them, `inspect` reads Redis and the recorded requests.

mod inspect;
mod replicas;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abridge::store::Checkpoint;
use fake_provider::{Behavior, FakeProvider, Recorded, is_summary_request};
use tokio::sync::Semaphore;

use crate::common::redis::RedisCluster;

use inspect::{
    Stored, applied, keys, markers, memory_usage, node, raw_messages, tag_of, used_memory,
};
use replicas::{Clients, Replica, Served, converse};

const CONVERSATIONS: usize = 200;
const TURNS: usize = 14;
const IN_FLIGHT: usize = 50;
const REPLICAS: usize = 3;
/// The replica that is killed and restarted.
const VICTIM: usize = 2;
/// Share of all turns answered when the victim is killed, and when it comes back.
const KILL_AT: f64 = 0.35;
const RESTART_AT: f64 = 0.6;
const THRESHOLD: u64 = 4000;
const PREFIX: &str = "scale";
const MODEL: &str = "fake-model";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_redis_cluster_share_conversations_and_survive_a_kill() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let baseline: u64 = urls.iter().map(|u| used_memory(u)).sum();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();

    let env: Vec<(String, String)> = [
        ("ABRIDGE_UPSTREAM", provider.url()),
        ("ABRIDGE_STORE__REDIS_CLUSTER", urls.join(",")),
        ("ABRIDGE_STORE__KEY_PREFIX", PREFIX.to_owned()),
        // Every checkpoint stays, so a compaction can be counted from what is stored.
        ("ABRIDGE_STORE__MAX_CHECKPOINTS", "64".to_owned()),
        // Three debug builds, the cluster and 50 clients share two cores here.
        ("ABRIDGE_STORE__RESPONSE_TIMEOUT_MS", "2000".to_owned()),
        (
            "ABRIDGE_COMPACTION__THRESHOLD_TOKENS",
            THRESHOLD.to_string(),
        ),
        ("ABRIDGE_COMPACTION__STRATEGY", "structured".to_owned()),
        // A lock held by the killed replica lapses soon.
        ("ABRIDGE_COMPACTION__LOCK_TTL_MS", "3000".to_owned()),
        // The same fake, but with a per-process key: each summary call names its maker.
        ("ABRIDGE_SUMMARY__UPSTREAM", provider.url()),
        ("ABRIDGE_SUMMARY__MODEL", "summary-model".to_owned()),
        ("ABRIDGE_SUMMARY__TIMEOUT_MS", "5000".to_owned()),
        ("ABRIDGE_LOG__FILTER", "warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut replicas = Vec::new();
    for index in 0..REPLICAS {
        let mut replica = Replica::new(index, env.clone());
        replica.start().await;
        // One after the other: the first publishes the identity secret, the rest read it.
        replica.wait_ready().await;
        replicas.push(replica);
    }

    let clients = Arc::new(Clients {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        routes: replicas.iter().map(|r| Mutex::new(r.route())).collect(),
        in_flight: Semaphore::new(IN_FLIGHT),
        answered: AtomicUsize::new(0),
        served: Mutex::default(),
        failures: Mutex::default(),
    });
    let drive = started.elapsed();
    let tasks: Vec<_> = (0..CONVERSATIONS)
        .map(|conv| tokio::spawn(converse(clients.clone(), conv)))
        .collect();

    // Mid-run: kill the victim, note which conversations had a summary lock then (a lock
    // the dead process held stays until its TTL), later restart it (at new addresses).
    let total = CONVERSATIONS * TURNS;
    let answered = || clients.answered.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(150);
    let wait_for = async |share: f64| {
        while (answered() as f64) < share * total as f64 {
            assert!(Instant::now() < deadline, "the run is too slow");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_for(KILL_AT).await;
    clients.routes[VICTIM].lock().unwrap().down = true;
    replicas[VICTIM].kill();
    let killed_at = answered();
    let locked_at_kill: BTreeSet<String> = urls
        .iter()
        .flat_map(|u| keys(u, &format!("{PREFIX}:*:lock")))
        .filter_map(|k| tag_of(&k).map(str::to_owned))
        .collect();
    wait_for(RESTART_AT).await;
    replicas[VICTIM].start().await;
    replicas[VICTIM].wait_ready().await;
    *clients.routes[VICTIM].lock().unwrap() = replicas[VICTIM].route();
    let restarted_at = answered();

    for task in tasks {
        tokio::time::timeout_at(deadline.into(), task)
            .await
            .expect("the run is too slow")
            .unwrap();
    }
    let run = started.elapsed() - drive;
    // Background compactions started by the last turns finish before anything is counted.
    let mut last = (provider.completed(), Instant::now());
    while last.1.elapsed() < Duration::from_secs(1)
        || urls
            .iter()
            .any(|u| !keys(u, &format!("{PREFIX}:*:lock")).is_empty())
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if provider.completed() != last.0 {
            last = (provider.completed(), Instant::now());
        }
        assert!(Instant::now() < deadline, "background work never settled");
    }

    // --- No client-visible error. -------------------------------------------------------
    let served = std::mem::take(&mut *clients.served.lock().unwrap());
    let failures = std::mem::take(&mut *clients.failures.lock().unwrap());
    assert_eq!(served.len(), total, "one answer per turn");
    for s in &served {
        assert_eq!(s.status, 200, "conversation {} turn {}", s.conv, s.turn);
        assert!(
            !s.note.as_deref().unwrap_or_default().contains("store"),
            "conversation {} turn {}: {:?}",
            s.conv,
            s.turn,
            s.note
        );
    }
    for f in &failures {
        assert!(
            f.replica == VICTIM && f.during_outage,
            "a request failed on a live replica {}: {}",
            f.replica,
            f.error
        );
    }
    let logs: String = replicas
        .iter()
        .map(|r| r.logs.lock().unwrap().clone())
        .collect();
    for bad in [
        "CROSSSLOT",
        "MOVED",
        "store unavailable",
        " ERROR ",
        " WARN ",
    ] {
        assert!(!logs.contains(bad), "{bad} in the replicas' logs:\n{logs}");
    }

    // --- Keys: one slot per conversation, spread over the nodes. -----------------------
    let mut conversation_of: BTreeMap<usize, String> = BTreeMap::new();
    for s in &served {
        let key = s.conversation.clone().expect("every turn is identified");
        let known = conversation_of.entry(s.conv).or_insert_with(|| key.clone());
        assert_eq!(
            *known, key,
            "conversation {}: the same key on every replica and life",
            s.conv
        );
    }
    let index_of: HashMap<&str, usize> = conversation_of
        .iter()
        .map(|(c, k)| (k.as_str(), *c))
        .collect();
    assert_eq!(
        index_of.len(),
        CONVERSATIONS,
        "no two conversations share a key"
    );
    let mut stored: BTreeMap<usize, Stored> = BTreeMap::new();
    let mut per_node = vec![0; REPLICAS];
    let mut recent_bytes = 0;
    let mut tenants = 0;
    for (n, url) in urls.iter().enumerate() {
        let mut con = node(url);
        let mut by_conversation: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in keys(url, &format!("{PREFIX}:*")) {
            // A tenant the provider accepted (its summaries may be paid for).
            if key.ends_with(":tenant") {
                tenants += 1;
                continue;
            }
            match tag_of(&key) {
                Some(tag) => by_conversation.entry(tag.to_owned()).or_default().push(key),
                None if key == format!("{PREFIX}:recent") => {
                    recent_bytes = memory_usage(&mut con, &key);
                }
                None => assert_eq!(key, format!("{PREFIX}:secret"), "an unexpected key"),
            }
        }
        for (tag, keys) in by_conversation {
            let conv = *index_of
                .get(tag.as_str())
                .unwrap_or_else(|| panic!("keys of an unknown conversation {tag}"));
            let slots: BTreeSet<i64> = keys
                .iter()
                .map(|k| {
                    redis::cmd("CLUSTER")
                        .arg("KEYSLOT")
                        .arg(k)
                        .query(&mut con)
                        .unwrap()
                })
                .collect();
            assert_eq!(slots.len(), 1, "conversation {conv}: {keys:?} in one slot");
            let ckpt: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("{PREFIX}:{{{tag}}}:ckpt"))
                .query(&mut con)
                .unwrap();
            let state: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("{PREFIX}:{{{tag}}}:state"))
                .query(&mut con)
                .unwrap();
            let mut checkpoints: Vec<Checkpoint> = ckpt
                .values()
                .map(|j| serde_json::from_str(j).unwrap())
                .collect();
            checkpoints.sort_by_key(|c| c.through);
            let previous = stored.insert(
                conv,
                Stored {
                    compactions: state.get("compactions").map_or(0, |v| v.parse().unwrap()),
                    ckpt_bytes: memory_usage(&mut con, &format!("{PREFIX}:{{{tag}}}:ckpt")),
                    state_bytes: memory_usage(&mut con, &format!("{PREFIX}:{{{tag}}}:state")),
                    checkpoints,
                },
            );
            assert!(
                previous.is_none(),
                "conversation {conv} has keys on two nodes"
            );
            per_node[n] += 1;
        }
    }
    assert_eq!(stored.len(), CONVERSATIONS, "every conversation is stored");
    assert_eq!(
        tenants, CONVERSATIONS,
        "each conversation's credential is remembered as accepted, once"
    );
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "conversations spread over the nodes: {per_node:?}"
    );

    // --- One summariser call per compaction. -------------------------------------------
    let requests = provider.requests();
    let mut calls: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut forwarded: HashMap<String, &Recorded> = HashMap::new();
    for r in &requests {
        let is_summary = r.json()["messages"]
            .as_array()
            .is_some_and(|m| is_summary_request(m));
        if is_summary {
            let about = markers(&r.body);
            assert_eq!(about.len(), 1, "a summary is about one conversation");
            let key = r.headers["authorization"].to_str().unwrap();
            calls
                .entry(*about.first().unwrap())
                .or_default()
                .push(key.trim_start_matches("Bearer ").to_owned());
        } else {
            let tag = r.headers["x-test-tag"].to_str().unwrap().to_owned();
            assert!(
                forwarded.insert(tag.clone(), r).is_none(),
                "{tag} forwarded twice"
            );
        }
    }
    let victim_first_life = Replica::summary_key(VICTIM, 1);
    let (mut total_calls, mut total_compactions, mut orphans, mut recency) = (0, 0, 0, 0);
    for (conv, s) in &stored {
        let made = calls.get(conv).map_or(&[][..], Vec::as_slice);
        let llm = s
            .checkpoints
            .iter()
            .filter(|c| {
                c.strategy == abridge::strategies::Strategy::Structured && c.fallback.is_none()
            })
            .count();
        let other = s.checkpoints.len() - llm;
        assert_eq!(
            s.compactions,
            s.checkpoints.len() as u64,
            "conversation {conv}: every compaction counted once, none trimmed"
        );
        assert!(
            llm >= 1,
            "conversation {conv} compacted: {:?}",
            s.checkpoints
                .iter()
                .map(|c| (c.strategy, c.fallback.clone()))
                .collect::<Vec<_>>()
        );
        total_calls += made.len();
        total_compactions += s.checkpoints.len();
        if locked_at_kill.contains(&conversation_of[conv]) {
            // Its summary may have been in the killed process's hands: that call may
            // have no checkpoint, and a peer that waited for it may have used recency.
            assert!(
                made.len() >= llm,
                "conversation {conv}: {made:?} for {llm} summaries"
            );
            let extra = made.len() - llm;
            assert!(
                extra <= made.iter().filter(|k| **k == victim_first_life).count(),
                "conversation {conv}: {made:?} for {llm} summaries"
            );
            orphans += extra;
            recency += other;
        } else {
            assert_eq!(
                (made.len(), other),
                (llm, 0),
                "conversation {conv}: summary calls {made:?}, checkpoints {:?}",
                s.checkpoints
                    .iter()
                    .map(|c| (c.through, &c.strategy, &c.fallback))
                    .collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(
        calls.keys().filter(|c| !stored.contains_key(c)).count(),
        0,
        "summaries of unknown conversations"
    );

    // --- Every turn after a compaction: head + the stored replacement + the rest. ------
    let mut by_conv: BTreeMap<usize, Vec<&Served>> = BTreeMap::new();
    for s in &served {
        by_conv.entry(s.conv).or_default().push(s);
    }
    // (conversation, checkpoint through) → replicas that forwarded it.
    let mut applied_by: BTreeMap<(usize, u32), BTreeSet<usize>> = BTreeMap::new();
    let mut turns_after_first = 0;
    let (mut resumed_same, mut resumed_deeper) = (0, 0);
    for (conv, turns) in &mut by_conv {
        turns.sort_by_key(|s| s.turn);
        let checkpoints = &stored[conv].checkpoints;
        let mut current: Option<u32> = None;
        let mut victim_second_life_seen = false;
        for s in turns.iter() {
            let tag = format!("{}/{}/{}", s.conv, s.turn, s.attempt);
            let request = forwarded
                .get(&tag)
                .unwrap_or_else(|| panic!("{tag} never reached the provider"));
            let sent = raw_messages(s.sent.as_bytes());
            let got = raw_messages(&request.body);
            let found = if s.compacted {
                checkpoints
                    .iter()
                    .find(|c| applied(&sent, c) == got)
                    .map(|c| c.through)
            } else {
                assert_eq!(request.body, s.sent.as_bytes(), "{tag}: forwarded as sent");
                None
            };
            assert!(
                !s.compacted || found.is_some(),
                "{tag}: compacted, but not with a stored checkpoint"
            );
            if let Some(before) = current {
                let now = found
                    .unwrap_or_else(|| panic!("{tag}: after a compaction every turn is compacted"));
                assert!(now >= before, "{tag}: went back to an older checkpoint");
                turns_after_first += 1;
            }
            if s.replica == VICTIM && s.life == 2 && !victim_second_life_seen {
                victim_second_life_seen = true;
                // The restarted process's first turn of this conversation.
                match (current, found) {
                    (Some(before), Some(now)) if now == before => resumed_same += 1,
                    (Some(_), Some(_)) => resumed_deeper += 1,
                    _ => {}
                }
            }
            if let Some(through) = found {
                applied_by
                    .entry((*conv, through))
                    .or_default()
                    .insert(s.replica);
            }
            current = found.or(current);
        }
        assert!(current.is_some(), "conversation {conv} was compacted");
    }
    let shared_by_replicas = applied_by.values().filter(|r| r.len() >= 2).count();
    assert!(
        shared_by_replicas * 2 > applied_by.len(),
        "most checkpoints are forwarded by several replicas: {shared_by_replicas} of {}",
        applied_by.len()
    );
    assert!(
        resumed_same > 0,
        "the restarted replica carried on with stored checkpoints"
    );
    let restarted_calls = calls
        .values()
        .flatten()
        .filter(|k| **k == Replica::summary_key(VICTIM, 2))
        .count();

    // --- Redis memory per compacted conversation. --------------------------------------
    let after: u64 = urls.iter().map(|u| used_memory(u)).sum();
    let n = CONVERSATIONS as u64;
    let ckpt_bytes = stored.values().map(|s| s.ckpt_bytes).sum::<u64>() / n;
    let state_bytes = stored.values().map(|s| s.state_bytes).sum::<u64>() / n;
    let all: Vec<&Checkpoint> = stored.values().flat_map(|s| &s.checkpoints).collect();
    let json_bytes = all
        .iter()
        .map(|c| serde_json::to_string(c).unwrap().len())
        .sum::<usize>()
        / all.len();
    let summary_bytes = all
        .iter()
        .map(|c| c.summary.as_deref().map_or(0, str::len))
        .sum::<usize>()
        / all.len();
    eprintln!(
        "scale: {CONVERSATIONS} conversations x {TURNS} turns on {REPLICAS} replicas, {IN_FLIGHT} in flight: \
         run {:.1} s (whole test {:.1} s)\n\
         scale: victim r{VICTIM} killed after {killed_at} answers, back after {restarted_at}; \
         {} requests failed at the connection and were retried ({} on r{VICTIM} while it was down)\n\
         scale: {total_compactions} compactions, {total_calls} summary calls \
         ({orphans} orphaned by the kill, {recency} recency checkpoints after it; \
         {} locks held at the kill; {restarted_calls} calls by the restarted process)\n\
         scale: {turns_after_first} turns after a first compaction, all head + stored replacement; \
         {shared_by_replicas} of {} checkpoints forwarded by 2+ replicas; restarted replica's first turns: \
         {resumed_same} with the same checkpoint as the turn before, {resumed_deeper} with a deeper one\n\
         scale: conversations per node {per_node:?}\n\
         scale: Redis memory per compacted conversation: {} bytes = checkpoints {ckpt_bytes} \
         ({:.2} checkpoints of {json_bytes} bytes of JSON, summaries of {summary_bytes} bytes) \
         + state {state_bytes} + recent index {}; used_memory grew by {} bytes per conversation",
        run.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        failures.len(),
        failures.iter().filter(|f| f.replica == VICTIM).count(),
        locked_at_kill.len(),
        applied_by.len(),
        ckpt_bytes + state_bytes + recent_bytes / n,
        total_compactions as f64 / CONVERSATIONS as f64,
        recent_bytes / n,
        after.saturating_sub(baseline) / n,
    );
    drop(cluster);
}
