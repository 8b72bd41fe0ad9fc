//! Compaction on the request path, end to end: real sockets, the fake provider, real
//! Redis where state must outlive a process or be shared by two.
//!
//! Here: the helpers and the main path (a stable prefix, background precompaction,
//! forks, tenants, the per-request controls, observe mode); `shared` has the state that
//! outlives a process or spans replicas, `fallbacks` what happens when compaction cannot
//! help or its summary fails.

mod fallbacks;
mod shared;

use abridge::config::{CompactionMode, Config};
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, count_tokens};
use serde_json::{Value, json};

use crate::common::Proxy;
use crate::common::agent::{Agent, Answer, main_requests, messages_of, raw_messages};

const THRESHOLD: u64 = 3000;

fn config(url: &str, strategy: Strategy) -> Config {
    crate::common::compacting(url, strategy, THRESHOLD)
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
        let tokens = count_tokens(&messages_of(r));
        assert!(tokens <= THRESHOLD, "{tokens} tokens at the provider");
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
