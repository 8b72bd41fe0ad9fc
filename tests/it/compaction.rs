//! Compaction on the request path, end to end: real sockets, the fake provider, real
//! Redis where state must outlive a process or be shared by two.

use std::time::Duration;

use abridge::config::{CompactionMode, Config};
use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, SummaryMode, count_tokens};
use serde_json::{Value, json};

use crate::common::agent::{
    Agent, Answer, main_requests, messages_of, raw_messages, summary_requests,
};
use crate::common::redis::RedisServer;
use crate::common::{Proxy, config_for};

const THRESHOLD: u64 = 3000;

/// A configuration with a small absolute threshold, for a provider at `url`.
fn config(url: &str, strategy: Strategy) -> Config {
    let mut config = config_for(url);
    config.compaction.threshold_tokens = THRESHOLD;
    config.compaction.strategy = strategy;
    config.summary.timeout_ms = 5000;
    config
}

/// Runs `turns` turns, background work finishing before each request, and returns every
/// answer with the summary requests made while it was being served.
async fn converse(
    agent: &mut Agent,
    provider: &FakeProvider,
    proxy: &Proxy,
    turns: usize,
) -> Vec<(Answer, usize)> {
    let mut out = Vec::new();
    for n in 1..=turns {
        out.extend(agent.turn_observed(n, Some((provider, proxy))).await);
    }
    out
}

#[tokio::test]
async fn a_long_agentic_conversation_stays_under_the_threshold_with_a_stable_prefix() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-agent");
    let answers: Vec<Answer> = {
        let mut all = Vec::new();
        for n in 1..=40 {
            all.extend(agent.turn(n).await);
        }
        all
    };
    let sent = main_requests(&provider);
    assert_eq!(sent.len(), 80);
    let first_compacted = answers
        .iter()
        .position(Answer::compacted)
        .expect("the conversation was compacted");
    assert!(first_compacted > 4, "not before the conversation was long");

    for (i, request) in sent.iter().enumerate().skip(first_compacted) {
        let messages = messages_of(request);
        let tokens = count_tokens(&messages);
        assert!(
            tokens <= THRESHOLD,
            "request {i}: {tokens} prompt tokens at the provider, over {THRESHOLD}"
        );
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(
            messages[0], agent.messages[0],
            "system message first and unchanged"
        );
        assert!(
            answers[i].compacted(),
            "request {i} after the first compaction is compacted"
        );
    }
    // The final user message reaches the provider verbatim every time.
    let last_user = |m: &[Value]| {
        m.iter()
            .rev()
            .find(|x| x["role"] == "user")
            .cloned()
            .unwrap()
    };
    assert_eq!(
        last_user(&messages_of(sent.last().unwrap())),
        last_user(&agent.messages)
    );

    // Between compactions, the forwarded prefix is byte-identical turn to turn.
    let mut changes = 0;
    for i in first_compacted + 1..sent.len() {
        let (prev, next) = (raw_messages(&sent[i - 1]), raw_messages(&sent[i]));
        let same_checkpoint = answers[i - 1].header("x-abridge-messages-replaced")
            == answers[i].header("x-abridge-messages-replaced");
        let extends = next.len() >= prev.len() && next[..prev.len()] == prev[..];
        if same_checkpoint {
            assert!(
                extends,
                "request {i}: same checkpoint but the prefix changed"
            );
        } else {
            changes += 1;
        }
    }
    let stats = proxy.stats();
    assert!(
        changes < stats.compactions_total() as usize,
        "{changes} prefix changes for {} compactions",
        stats.compactions_total()
    );
    assert!(
        stats.compactions_total() < 20,
        "compaction aims below the threshold, not every turn: {}",
        stats.compactions_total()
    );
    assert!(stats.checkpoints_applied >= (sent.len() - first_compacted) as u64);
}

#[tokio::test]
async fn with_background_precompaction_the_crossing_turn_calls_no_summariser() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url(), Strategy::Structured)).await;
    let mut agent = Agent::new(&proxy, "sk-bg");
    let answers = converse(&mut agent, &provider, &proxy, 20).await;
    let stats = proxy.stats();
    assert!(
        stats.compactions_by(Strategy::Structured, abridge::outcome::Trigger::Background) >= 1,
        "{stats:?}"
    );
    assert!(answers.iter().any(|(a, _)| a.compacted()));
    for (i, (answer, summaries)) in answers.iter().enumerate() {
        assert_eq!(
            *summaries,
            0,
            "request {i} waited for a summary (compacted: {})",
            answer.compacted()
        );
    }
    assert_eq!(
        stats.compactions_by(Strategy::Structured, abridge::outcome::Trigger::Threshold),
        0
    );
    assert_eq!(
        stats.fallbacks, 0,
        "the fake's summaries pass the fidelity check"
    );
    for r in main_requests(&provider)
        .iter()
        .skip(answers.iter().position(|(a, _)| a.compacted()).unwrap())
    {
        assert!(count_tokens(&messages_of(r)) <= THRESHOLD);
    }

    // Without background work the crossing turn builds the summary itself.
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-bg");
    let answers = converse(&mut agent, &provider, &proxy, 12).await;
    assert!(answers.iter().any(|(_, summaries)| *summaries > 0));
    assert!(
        proxy
            .stats()
            .compactions_by(Strategy::Structured, abridge::outcome::Trigger::Threshold)
            >= 1
    );
}

#[tokio::test]
async fn a_forked_history_never_gets_the_originals_summary() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-fork");
    for n in 1..=12 {
        agent.turn(n).await;
    }
    let last = main_requests(&provider).pop().unwrap();
    let summary = messages_of(&last)
        .iter()
        .find_map(|m| {
            m["content"]
                .as_str()
                .filter(|c| c.contains("## Goal"))
                .map(str::to_owned)
        })
        .expect("the original was summarised");
    assert!(summary.contains("module_5"), "the summary covers step 5");

    // Edit step 5 (inside the summarised range) and continue from there.
    let mut fork = Agent::new(&proxy, "sk-fork");
    fork.messages = agent.messages.clone();
    let step5 = fork
        .messages
        .iter()
        .position(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("Step 5:"))
        })
        .unwrap();
    fork.messages[step5] =
        json!({"role": "user", "content": "Step 5: instead, rename FORKED_ITEM in src/other.rs"});
    let answers = fork.turn(13).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert!(
        answers.iter().any(Answer::compacted),
        "the fork is long enough to be compacted (with its own summary)"
    );
    for r in main_requests(&provider).iter().rev().take(2) {
        assert!(
            !messages_of(r)
                .iter()
                .any(|m| m["content"] == summary.as_str()),
            "the fork got the original's summary"
        );
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            !text.contains("module_5.rs and fix"),
            "the original step 5 is not in the fork"
        );
    }
}

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
async fn tenants_with_identical_conversations_never_share_checkpoints() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut a = Agent::new(&proxy, "sk-tenant-a");
    for n in 1..=10 {
        a.turn(n).await;
    }
    let compactions = proxy.stats().compactions_total();
    assert!(compactions >= 1);
    // Tenant B sends exactly A's conversation: it must be compacted on its own.
    let mut b = Agent::new(&proxy, "sk-tenant-b");
    b.messages = a.messages.clone();
    b.messages
        .push(json!({"role": "user", "content": "And now?"}));
    let answer = b.send().await;
    assert!(answer.compacted());
    assert_eq!(
        proxy.stats().compactions_total(),
        compactions + 1,
        "B did not reuse A's checkpoint"
    );
    assert_ne!(answer.header("x-abridge-conversation"), None);
    let a_again = {
        a.messages
            .push(json!({"role": "user", "content": "And now?"}));
        a.send().await
    };
    assert_ne!(
        answer.header("x-abridge-conversation"),
        a_again.header("x-abridge-conversation")
    );
}

#[tokio::test]
async fn off_is_byte_identical_and_force_compacts_a_short_conversation() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-ctl");
    for n in 1..=10 {
        agent.turn(n).await;
    }
    agent
        .messages
        .push(json!({"role": "user", "content": "Summarise what you did."}));
    agent.headers = vec![("x-abridge-compact".into(), "off".into())];
    let answer = agent.send().await;
    assert!(!answer.compacted());
    assert_eq!(
        main_requests(&provider).pop().unwrap().body,
        agent.body().as_bytes(),
        "off: the client's bytes"
    );

    let mut short = Agent::new(&proxy, "sk-short");
    short.turn(1).await;
    short.turn(2).await;
    short
        .messages
        .push(json!({"role": "user", "content": "Next?"}));
    short.headers = vec![("x-abridge-compact".into(), "force".into())];
    let before = short.messages.len();
    let answer = short.send().await;
    assert!(answer.compacted(), "{:?}", answer.headers);
    let forwarded = messages_of(&main_requests(&provider).pop().unwrap());
    assert!(
        forwarded.len() < before,
        "{} of {before} messages forwarded",
        forwarded.len()
    );
    assert_eq!(forwarded.last(), short.messages.last());

    short.headers = vec![("x-abridge-compact".into(), "sometimes".into())];
    let answer = short.send().await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["error"]["code"], "invalid_header");
    assert_eq!(answer.body["error"]["param"], "x-abridge-compact");
}

#[tokio::test]
async fn a_provider_window_below_the_threshold_means_exactly_one_compact_and_retry() {
    let provider = FakeProvider::start(Behavior {
        context_window: Some(2000),
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.threshold_tokens = 100_000;
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-retry");
    let mut n = 0;
    while count_tokens(&agent.messages) < 1800 {
        n += 1;
        agent.turn(n).await;
    }
    let before = main_requests(&provider).len();
    agent.messages.push(
        json!({"role": "user", "content": format!("Final check: {}", "all green? ".repeat(100))}),
    );
    let answer = agent.send().await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.compacted());
    let sent = main_requests(&provider);
    assert_eq!(sent.len() - before, 2, "the original and exactly one retry");
    assert!(count_tokens(&messages_of(&sent[sent.len() - 1])) <= 2000);
    assert_eq!(proxy.stats().retries, 1);
    assert!(
        answer
            .header("x-abridge-note")
            .unwrap()
            .contains("context length exceeded")
    );
}

#[tokio::test]
async fn summariser_failures_fall_back_and_the_request_succeeds() {
    for mode in [
        SummaryMode::Error,
        SummaryMode::Empty,
        SummaryMode::MissingSections,
    ] {
        let provider = FakeProvider::start(Behavior {
            summary: mode,
            ..Behavior::default()
        })
        .await
        .unwrap();
        let mut cfg = config(&provider.url(), Strategy::Structured);
        cfg.compaction.background = false;
        let proxy = Proxy::start_with(cfg).await;
        let mut agent = Agent::new(&proxy, "sk-fallback");
        let mut compacted = None;
        for n in 1..=12 {
            let answers = agent.turn(n).await;
            if let Some(a) = answers.into_iter().find(Answer::compacted) {
                compacted = Some(a);
                break;
            }
        }
        let answer = compacted.unwrap_or_else(|| panic!("{mode:?}: never compacted"));
        assert_eq!(
            answer.header("x-abridge-strategy").as_deref(),
            Some("recency"),
            "{mode:?}"
        );
        let note = answer.header("x-abridge-note").unwrap();
        assert!(note.contains("fell back"), "{mode:?}: {note}");
        // The class of the failure, never the provider's own text, reaches the client
        // and the store.
        let id = answer.header("x-abridge-conversation").unwrap();
        let loaded = proxy
            .state
            .store()
            .load(&abridge::identity::Fingerprint::from_hex(&id).unwrap())
            .await
            .unwrap();
        let stored = loaded.checkpoints[0].fallback.clone().unwrap();
        for text in [&note, &stored] {
            assert!(
                !text.contains("as told") && !text.contains("The summariser failed"),
                "{mode:?}: provider text in {text}"
            );
        }
        if mode == SummaryMode::Error {
            assert!(note.contains("HTTP 500"), "{note}");
            assert!(stored.contains("HTTP 500"), "{stored}");
        }
        assert!(proxy.stats().fallbacks >= 1);
    }
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
async fn observe_mode_forwards_unmodified_but_reports() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.mode = CompactionMode::Observe;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-observe");
    let mut reported = None;
    for n in 1..=10 {
        for answer in agent.turn(n).await {
            assert!(!answer.compacted());
            if answer
                .header("x-abridge-note")
                .is_some_and(|n| n.contains("observe"))
            {
                reported = Some(answer);
            }
        }
    }
    let sent = agent.sent.lock().unwrap().clone();
    let received: Vec<String> = main_requests(&provider)
        .iter()
        .map(|r| String::from_utf8(r.body.to_vec()).unwrap())
        .collect();
    assert_eq!(received, sent, "every request forwarded byte for byte");
    let answer = reported.expect("observe mode reported what it would do");
    let before: u64 = answer
        .header("x-abridge-tokens-before")
        .unwrap()
        .parse()
        .unwrap();
    let after: u64 = answer
        .header("x-abridge-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after < before);
    let stats = proxy.stats();
    assert!(stats.observed >= 1);
    assert_eq!(stats.checkpoints_applied, 0);
    assert_eq!(stats.compactions_total(), 0, "nothing stored or applied");
}

#[tokio::test]
async fn anti_thrash_is_judged_on_each_request_and_suspends_nothing() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    // A system prompt alone over the threshold: no compaction can help.
    let mut agent = Agent::new(&proxy, "sk-huge");
    agent.messages[0] = json!({"role": "system", "content": "rule: be precise. ".repeat(900)});
    for n in 0..8 {
        agent
            .messages
            .push(json!({"role": "user", "content": format!("Question {n}")}));
        agent
            .messages
            .push(json!({"role": "assistant", "content": format!("Answer {n}")}));
    }
    agent
        .messages
        .push(json!({"role": "user", "content": "Hello"}));
    for turn in 1..=2 {
        let answer = agent.send().await;
        assert_eq!(answer.status, 200, "never fails the request");
        assert!(!answer.compacted());
        let note = answer.header("x-abridge-note").unwrap();
        assert!(
            note.contains("not compacted") && note.contains("system prompt"),
            "{note}"
        );
        assert!(!note.contains("suspended"), "{note}");
        assert_eq!(proxy.stats().anti_thrash, turn, "counted on each request");
        agent
            .messages
            .push(json!({"role": "assistant", "content": "Hi"}));
        agent
            .messages
            .push(json!({"role": "user", "content": "Again"}));
    }
    assert_eq!(proxy.stats().compactions_total(), 0);
}

#[tokio::test]
async fn a_provider_counting_far_more_than_the_estimate_never_switches_compaction_off() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    // Runs of spaces: abridge's estimate (a space is 0.03 token) is far below what this
    // provider counts (a quarter token per byte), and each question alone is over the
    // threshold at the provider. Each request is compacted as far as it goes; the
    // conversation never stops being compacted, and what the provider counts does not
    // grow turn after turn.
    let mut agent = Agent::new(&proxy, "sk-spaces");
    let padded = |n: usize| format!("Step {n}:{}end", " ".repeat(13_000));
    let mut reported = Vec::new();
    for n in 1..=10 {
        agent
            .messages
            .push(json!({"role": "user", "content": padded(n)}));
        let answer = agent.send().await;
        assert_eq!(answer.status, 200);
        let note = answer.header("x-abridge-note").unwrap_or_default();
        assert!(!note.contains("suspended"), "turn {n}: {note}");
        if n > 1 {
            assert!(answer.compacted(), "turn {n}: {note}");
        }
        reported.push(answer.body["usage"]["prompt_tokens"].as_u64().unwrap());
        agent
            .messages
            .push(answer.body["choices"][0]["message"].clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (first, last) = (reported[1], *reported.last().unwrap());
    assert!(
        last <= first + first / 10,
        "what the provider counts stays put: {reported:?}"
    );
}

#[tokio::test]
async fn a_retry_that_cannot_fit_passes_the_error_on_and_suspends_nothing() {
    let provider = FakeProvider::start(Behavior {
        context_window: Some(500),
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.threshold_tokens = 100_000;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-toolong");
    agent
        .messages
        .push(json!({"role": "user", "content": "x ".repeat(3000)}));
    let answer = agent.send().await;
    assert_eq!(
        answer.status, 400,
        "the provider's own error reaches the client"
    );
    assert_eq!(answer.body["error"]["code"], "context_length_exceeded");
    assert_eq!(
        proxy.stats().anti_thrash,
        0,
        "a retry budget is not the threshold"
    );
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

#[tokio::test]
async fn without_the_store_a_summarising_strategy_says_why_it_used_recency() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.store.redis_url = Some(Secret::new(redis.url()));
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-nostore");
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
    redis.stop();
    let answer = agent.send().await;
    assert_eq!(answer.status, 200);
    assert!(answer.compacted(), "{:?}", answer.headers);
    assert_eq!(
        answer.header("x-abridge-strategy").as_deref(),
        Some("recency")
    );
    let note = answer.header("x-abridge-note").unwrap();
    assert!(
        note.contains("store unavailable") && note.contains("summaries need the store"),
        "{note}"
    );
    assert_eq!(
        proxy.stats().summary_calls,
        0,
        "no summary that could not be kept"
    );
}
