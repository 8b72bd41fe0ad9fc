//! When compaction cannot help or its summary fails: the one compact-and-retry on a
//! provider's context-length error, summariser failures falling back to recency,
//! anti-thrash, a provider that counts far more than the estimate, and a lost store.

use std::time::Duration;

use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, SummaryMode, count_tokens};
use serde_json::json;

use crate::common::Proxy;
use crate::common::agent::{Agent, Answer, main_requests, messages_of};
use crate::common::redis::RedisServer;

use super::{THRESHOLD, config};

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

/// The stored checkpoints of the conversation `answer` belongs to.
async fn checkpoints_of(proxy: &Proxy, answer: &Answer) -> Vec<abridge::store::Checkpoint> {
    let id = answer.header("x-abridge-conversation").unwrap();
    let key = abridge::identity::Fingerprint::from_hex(&id).unwrap();
    proxy.state.store().load(&key).await.unwrap().checkpoints
}

/// The first compacted answer in up to twelve turns of `agent`.
async fn first_compaction(agent: &mut Agent) -> Option<Answer> {
    for n in 1..=12 {
        if let Some(a) = agent.turn(n).await.into_iter().find(Answer::compacted) {
            return Some(a);
        }
    }
    None
}

#[tokio::test]
async fn summariser_failures_fall_back_and_the_request_succeeds() {
    for mode in [SummaryMode::Error, SummaryMode::Empty] {
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
        let answer = first_compaction(&mut agent)
            .await
            .unwrap_or_else(|| panic!("{mode:?}: never compacted"));
        assert_eq!(
            answer.header("x-abridge-strategy").as_deref(),
            Some("recency"),
            "{mode:?}"
        );
        let note = answer.header("x-abridge-note").unwrap();
        assert!(note.contains("fell back"), "{mode:?}: {note}");
        // The class of the failure, never the provider's own text, reaches the client
        // and the store.
        let stored = checkpoints_of(&proxy, &answer).await[0]
            .fallback
            .clone()
            .unwrap();
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

/// A summary that leaves out sections of the template (and what they would hold) is
/// repaired and used, not thrown away; the checkpoint, the admin API and the metrics say
/// what the gate found.
#[tokio::test]
async fn a_summary_missing_sections_is_repaired_and_used() {
    let provider = FakeProvider::start(Behavior {
        summary: SummaryMode::MissingSections,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut cfg = config(&provider.url(), Strategy::Structured);
    cfg.compaction.background = false;
    cfg.admin.token = Some(Secret::new("admin-token-for-the-gate"));
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = Agent::new(&proxy, "sk-repair");
    let answer = first_compaction(&mut agent).await.expect("compacted");
    assert_eq!(
        answer.header("x-abridge-strategy").as_deref(),
        Some("structured"),
        "{:?}",
        answer.header("x-abridge-note")
    );
    let id = answer.header("x-abridge-conversation").unwrap();
    let checkpoints = checkpoints_of(&proxy, &answer).await;
    let checkpoint = &checkpoints[0];
    let summary = checkpoint.summary.as_deref().unwrap();
    for heading in [
        "## Goal",
        "## Constraints & Preferences",
        "## Critical Context",
    ] {
        assert!(summary.contains(heading), "{heading}: {summary}");
    }
    let gate = checkpoint
        .gate
        .as_ref()
        .expect("the gate's verdict is kept");
    assert!(
        gate.repaired.iter().any(|r| r.starts_with("sections")),
        "{gate:?}"
    );
    let sent = main_requests(&provider);
    let forwarded = serde_json::to_string(&messages_of(sent.last().unwrap())).unwrap();
    assert!(
        forwarded.contains("(none recorded)"),
        "the repaired summary went upstream"
    );
    let text = reqwest::get(format!("http://{}/metrics", proxy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("abridge_summary_repairs_total 1"), "{text}");
    let shown = proxy
        .admin_json(
            &format!("/admin/conversations/{id}"),
            "admin-token-for-the-gate",
        )
        .await;
    let gate = &shown["checkpoints"][0]["gate"];
    assert!(
        gate["score"].is_number(),
        "the admin API shows the verdict: {shown}"
    );
    assert!(
        gate["repaired"][0]
            .as_str()
            .unwrap()
            .starts_with("sections"),
        "{shown}"
    );
    assert!(
        text.contains("abridge_summary_gate_score_count 1"),
        "{text}"
    );
    assert_eq!(proxy.stats().fallbacks, 0);
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

/// A compaction that would not make the request smaller (a middle shorter than the
/// marker that would replace it) is neither stored nor forwarded: the prefix, and the
/// provider's cache, stay as they were, and the report says why.
#[tokio::test]
async fn a_compaction_that_saves_nothing_is_not_stored() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let body = json!({"model": "fake-model", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Ok?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "And now?"},
    ]});
    let answer = crate::common::client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth("sk-nothing")
        .header("x-abridge-compact", "force")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-abridge-compacted"], "false");
    let note = answer.headers()["x-abridge-note"].to_str().unwrap();
    assert!(note.contains("no smaller"), "{note}");
    let conversation = abridge::identity::Fingerprint::from_hex(
        answer.headers()["x-abridge-conversation"].to_str().unwrap(),
    )
    .unwrap();
    let loaded = proxy.state.store().load(&conversation).await.unwrap();
    assert!(loaded.checkpoints.is_empty(), "nothing stored");
    assert_eq!(
        main_requests(&provider).last().unwrap().json()["messages"],
        body["messages"],
        "forwarded as sent"
    );
}
