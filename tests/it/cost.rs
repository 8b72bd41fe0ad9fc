//! Compaction decided by cost (`compaction.policy = "cost"`, the default) through the
//! proxy, against the fake provider with its prompt cache (OpenAI's automatic prefix
//! caching on chat): a conversation over its threshold with little ahead of it is left
//! alone and told why; the window compacts it whatever it costs; a conversation resumed
//! after its cache expired is compacted, since that costs nearly nothing more; a long
//! one is compacted before its threshold where the requests ahead pay it back; an
//! operator's own threshold is a bound, compacted whatever it costs; and a long agent
//! session costs less through abridge than sent as it is (15 % less when written,
//! priced from the fake's own usage reports).

use std::time::Duration;

use abridge::config::Config;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::{Proxy, client, config_for};

/// gpt-5 (priced: cached input a tenth of input) served with an 8,000-token window, so
/// the default threshold (three quarters of it) is 6,000 tokens and the window compacts
/// whatever it costs over 7,840.
fn config(provider: &FakeProvider) -> Config {
    windowed(provider, 8000)
}

/// gpt-5 served with a window of `tokens`.
pub(super) fn windowed(provider: &FakeProvider, tokens: u64) -> Config {
    let mut cfg = config_for(&provider.url());
    cfg.compaction
        .context_windows
        .insert("gpt-5".to_owned(), tokens);
    cfg
}

/// A conversation opened (one turn) and then grown by a long user message, not yet sent.
async fn opened_and_grown(proxy: &Proxy) -> Vec<Value> {
    let mut messages = opening(300);
    turn(proxy, &mut messages, 1).await;
    messages.push(json!({"role": "user", "content": format!(
        "More of it: {}", "Each retry waits twice as long as the one before it. ".repeat(40)
    )}));
    messages
}

/// A conversation of a few requests that starts with a long document: over the
/// threshold early, with little ahead of it.
pub(super) fn opening(words: usize) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a careful reviewer."}),
        json!({"role": "user", "content": format!(
            "Review this design document. {}",
            "The service keeps its queue in Redis and retries a failed job three times. ".repeat(words)
        )}),
    ]
}

/// Sends `messages` once; the answer's compaction header, reason and reply.
async fn send(proxy: &Proxy, messages: &[Value]) -> (bool, Option<String>, Value) {
    let (compacted, reason, body) = answer(proxy, messages).await;
    (compacted, reason, body["choices"][0]["message"].clone())
}

/// Sends `messages` once; the answer's compaction header, reason and whole body.
async fn answer(proxy: &Proxy, messages: &[Value]) -> (bool, Option<String>, Value) {
    let answer = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth("sk-cost")
        .json(&json!({"model": "gpt-5", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let compacted = answer.headers()["x-abridge-compacted"] == "true";
    let reason = answer
        .headers()
        .get("x-abridge-reason")
        .map(|v| v.to_str().unwrap().to_owned());
    (compacted, reason, answer.json().await.unwrap())
}

/// One turn: the client's message, the answer appended; what abridge said of it.
async fn turn(proxy: &Proxy, messages: &mut Vec<Value>, n: usize) -> (bool, Option<String>) {
    let (compacted, reason, _) = sized_turn(proxy, messages, n).await;
    (compacted, reason)
}

/// [`turn`], and the prompt tokens the provider reported for it.
async fn sized_turn(
    proxy: &Proxy,
    messages: &mut Vec<Value>,
    n: usize,
) -> (bool, Option<String>, u64) {
    messages.push(json!({"role": "user", "content": format!("Question {n}: what fails first?")}));
    let (compacted, reason, body) = answer(proxy, messages).await;
    messages.push(body["choices"][0]["message"].clone());
    crate::common::agent::idle(proxy).await;
    (
        compacted,
        reason,
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn over_the_threshold_with_little_ahead_it_is_left_alone_until_the_window_needs_it() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider)).await;
    let mut messages = opening(300);
    let (compacted, reason) = turn(&proxy, &mut messages, 1).await;
    assert!(
        !compacted && reason.is_none(),
        "under the threshold: {reason:?}"
    );
    // ~6,500 tokens: over the threshold, three requests made. Compacting would write a
    // new prefix at the input price to save a tenth of it on the few requests ahead.
    messages.push(json!({"role": "user", "content": format!(
        "More of it: {}", "Each retry waits twice as long as the one before it. ".repeat(40)
    )}));
    let (compacted, reason, reply) = send(&proxy, &messages).await;
    messages.push(reply);
    assert!(!compacted, "not worth it");
    assert_eq!(reason.as_deref(), Some("not-worth-it"));
    assert!(proxy.stats().not_worth_it >= 1);
    // Grown to the window's edge: compacted whatever it costs.
    let mut n = 2;
    let reason = loop {
        n += 1;
        assert!(n < 40, "never compacted");
        messages.push(json!({"role": "user", "content": format!(
            "Part {n}: {}", "The dead-letter queue keeps what failed three times. ".repeat(12)
        )}));
        let (compacted, reason, reply) = send(&proxy, &messages).await;
        messages.push(reply);
        if compacted {
            break reason;
        }
        assert_eq!(reason.as_deref(), Some("not-worth-it"), "part {n}");
    };
    assert_eq!(reason.as_deref(), Some("window"));
}

#[tokio::test]
async fn a_conversation_resumed_after_its_cache_expired_is_compacted() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider);
    cfg.compaction.cache_ttl_ms = 500;
    let proxy = Proxy::start_with(cfg).await;
    let mut messages = opened_and_grown(&proxy).await;
    let (compacted, reason, reply) = send(&proxy, &messages).await;
    assert_eq!(
        (compacted, reason.as_deref()),
        (false, Some("not-worth-it"))
    );
    messages.push(reply);
    // The user comes back after the cache has gone: the whole prefix is paid for again
    // either way, so compacting costs nearly nothing more.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (compacted, reason) = turn(&proxy, &mut messages, 3).await;
    assert!(compacted, "{reason:?}");
    assert_eq!(reason.as_deref(), Some("cache-cold"));
}

/// What the admin API says was decided for the proxy's one conversation, once its latest
/// request (which `reason` was said of) is recorded.
pub(super) async fn decided(proxy: &Proxy, reason: &str) -> Value {
    let token = Some(crate::admin::TOKEN);
    for _ in 0..100 {
        let (_, list, _) =
            crate::admin::admin(proxy, "GET", "/admin/conversations", token, None).await;
        let id = list["conversations"][0]["id"].as_str().unwrap().to_owned();
        let path = format!("/admin/conversations/{id}");
        let (status, detail, _) = crate::admin::admin(proxy, "GET", &path, token, None).await;
        assert_eq!(status, 200);
        if detail["decision"]["reason"] == reason {
            return detail["decision"].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the admin API never said {reason}");
}

pub(super) fn with_admin(mut cfg: Config) -> Config {
    cfg.admin.token = Some(abridge::secret::Secret::new(crate::admin::TOKEN));
    cfg
}

#[tokio::test]
async fn the_admin_api_shows_what_the_cost_model_weighed_for_a_request_left_alone() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(with_admin(config(&provider))).await;
    let messages = opened_and_grown(&proxy).await;
    let (compacted, reason, _) = send(&proxy, &messages).await;
    assert_eq!(
        (compacted, reason.as_deref()),
        (false, Some("not-worth-it"))
    );
    let d = decided(&proxy, "not-worth-it").await;
    assert_eq!(
        (&d["policy"], &d["compacted"]),
        (&json!("cost"), &json!(false))
    );
    let m = &d["model"];
    let (as_is, compacted) = (
        m["as_is_usd"].as_f64().unwrap(),
        m["compacted_usd"].as_f64().unwrap(),
    );
    assert!(as_is > 0.0 && compacted >= as_is, "{m}");
    // Over the threshold of 6,000 (three quarters of the window), aiming below it.
    assert_eq!(m["threshold_tokens"], 6000);
    assert!(m["prompt_tokens"].as_u64().unwrap() > 6000, "{m}");
    assert!(m["target_tokens"].as_u64().unwrap() < 6000, "{m}");
    // Not worth it: it would pay back only after more requests than are expected before
    // the conversation is compacted anyway (the window's bound, or where others ended).
    let remaining = m["remaining_requests"].as_u64().unwrap();
    assert!(remaining >= 1, "{m}");
    assert!(
        m["break_even_requests"]
            .as_u64()
            .is_none_or(|b| b > remaining),
        "{m}"
    );
    assert_eq!(m["cache"], "warm");
    assert!(m["since_last_request_secs"].as_f64().unwrap() < 60.0, "{m}");
}

#[tokio::test]
async fn the_admin_api_shows_what_the_cost_model_weighed_for_a_compaction() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = with_admin(config(&provider));
    cfg.compaction.cache_ttl_ms = 500;
    let proxy = Proxy::start_with(cfg).await;
    let mut messages = opened_and_grown(&proxy).await;
    let (_, _, reply) = send(&proxy, &messages).await;
    messages.push(reply);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (compacted, reason) = turn(&proxy, &mut messages, 3).await;
    assert_eq!((compacted, reason.as_deref()), (true, Some("cache-cold")));
    let d = decided(&proxy, "cache-cold").await;
    assert_eq!(
        (&d["policy"], &d["compacted"]),
        (&json!("cost"), &json!(true))
    );
    let m = &d["model"];
    // It pays: compacted, the requests ahead cost less, and it has paid back by the
    // last of them.
    let (as_is, compacted) = (
        m["as_is_usd"].as_f64().unwrap(),
        m["compacted_usd"].as_f64().unwrap(),
    );
    assert!(compacted < as_is, "{m}");
    let back = m["break_even_requests"].as_u64().unwrap();
    assert!(back <= m["remaining_requests"].as_u64().unwrap(), "{m}");
    assert_eq!(m["cache"], "cold");
    assert!(m["since_last_request_secs"].as_f64().unwrap() >= 0.5, "{m}");
}

#[tokio::test]
async fn a_long_conversation_is_compacted_before_its_threshold_where_that_pays() {
    // A 40,000-token window: the default threshold 30,000, the soft one 21,000, and
    // (nothing learned yet) a conversation expected to go on to 33,000. A long document
    // and then many short questions: by the soft threshold the conversation has made
    // about fifty requests, growing ~150 tokens each, so it is expected to make fifty
    // more, which pay a rewrite back.
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(windowed(&provider, 40_000)).await;
    let mut messages = opening(900);
    let mut last_prompt = 0;
    for n in 1..150 {
        let (compacted, reason, prompt) = sized_turn(&proxy, &mut messages, n).await;
        if compacted {
            // Warm, past the soft threshold and well under the threshold.
            assert_eq!(reason.as_deref(), Some("pays"));
            assert!(
                last_prompt > 20_000 && last_prompt < 25_000,
                "compacted after a request of {last_prompt} tokens"
            );
            assert!(prompt < 20_000, "compacted to {prompt} tokens");
            return;
        }
        last_prompt = prompt;
    }
    panic!("never compacted; the last request was {last_prompt} tokens");
}

#[tokio::test]
async fn an_operators_threshold_is_a_bound_compacted_whatever_it_costs() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider);
    cfg.compaction.threshold_tokens = 6000;
    let proxy = Proxy::start_with(cfg).await;
    let messages = opened_and_grown(&proxy).await;
    let (compacted, reason, _) = send(&proxy, &messages).await;
    assert!(compacted);
    assert_eq!(reason.as_deref(), Some("threshold"));
}

#[tokio::test]
async fn the_size_policy_compacts_as_before_and_says_nothing_of_cost() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider);
    cfg.compaction.policy = abridge::config::Policy::Size;
    let proxy = Proxy::start_with(cfg).await;
    let messages = opened_and_grown(&proxy).await;
    let (compacted, reason, _) = send(&proxy, &messages).await;
    assert!(compacted);
    assert_eq!(reason, None);
}

/// A summary built ahead (the soft threshold, `structured`) is paid for whether it is
/// used or not. A long-lived conversation over the soft threshold, where a compaction at
/// the threshold would pay (many requests made, so many expected), but at a pace that
/// will not take it there in the requests it is expected to make: none is built.
#[tokio::test]
async fn a_summary_is_built_ahead_only_for_a_conversation_expected_to_reach_the_threshold() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // Threshold 60,000, soft threshold 42,000.
    let mut cfg = windowed(&provider, 80_000);
    cfg.compaction.strategy = abridge::strategies::Strategy::Structured;
    let proxy = Proxy::start_with(cfg).await;
    // ~47,000 tokens, then short questions: a few dozen tokens a request.
    let mut messages = opening(2_500);
    for n in 1..=24 {
        let (compacted, _) = turn(&proxy, &mut messages, n).await;
        assert!(!compacted, "question {n}");
    }
    let prompt = provider.reports().last().unwrap().usage["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert!(prompt > 42_000 && prompt < 52_000, "{prompt}");
    assert_eq!(
        crate::common::agent::summary_requests(&provider),
        0,
        "built ahead for a threshold never reached"
    );
}

/// A burst (a pasted log) says little of the pace to come. A long conversation, growing
/// slowly, takes one that leaves it past the soft threshold, where a summary would be
/// built ahead if that were its pace, then goes on with short questions: nothing is
/// built.
#[tokio::test]
async fn a_burst_does_not_have_a_summary_built_ahead() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // Threshold 150,000, soft threshold 105,000; the window compacts over 196,000.
    let mut cfg = windowed(&provider, 200_000);
    cfg.compaction.strategy = abridge::strategies::Strategy::Structured;
    let proxy = Proxy::start_with(cfg).await;
    let mut messages = opening(5_000);
    for n in 1..=2 {
        turn(&proxy, &mut messages, n).await;
    }
    messages.push(json!({"role": "user", "content": format!(
        "Here is the worker's log: {}",
        "05:00:01 worker-3 retried job 4411 after 250 ms: connection reset by peer. ".repeat(1_700)
    )}));
    for n in 3..=8 {
        let (compacted, _) = turn(&proxy, &mut messages, n).await;
        assert!(!compacted, "question {n}");
    }
    let prompts: Vec<u64> = provider
        .reports()
        .iter()
        .map(|r| r.usage["prompt_tokens"].as_u64().unwrap())
        .collect();
    // Past the soft threshold, and at the burst's pace the threshold is a request away.
    let burst = prompts[2] - prompts[1];
    assert!(
        burst > 30_000 && prompts[2] > 105_000 && prompts[2] + burst > 150_000,
        "{prompts:?}"
    );
    assert_eq!(
        crate::common::agent::summary_requests(&provider),
        0,
        "built ahead on a burst's pace"
    );
}

/// What a provider's `usage` (chat) costs at gpt-5's list price (abridge's built-in:
/// $1.25 input, $0.125 cached, $10 output a million tokens), in millionths of a dollar.
fn gpt5_priced(usage: &Value) -> f64 {
    let n = |v: &Value| v.as_u64().unwrap_or(0) as f64;
    let (prompt, hit) = (
        n(&usage["prompt_tokens"]),
        n(&usage["prompt_tokens_details"]["cached_tokens"]),
    );
    (prompt - hit) * 1.25 + hit * 0.125 + n(&usage["completion_tokens"]) * 10.0
}

/// An agent's long session on a 16,000-token window (gpt-5 priced; the fake caches as
/// OpenAI does): through abridge it costs less than the same requests sent straight to
/// the provider, compactions and all, and no request fails.
#[tokio::test]
async fn a_long_agent_session_costs_less_through_abridge_than_sent_as_it_is() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let cfg = windowed(&provider, 16_000);
    let proxy = Proxy::start_with(cfg).await;
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut sent = Vec::new();
    for n in 1..=60 {
        messages.push(json!({"role": "user", "content": format!(
            "Step {n}: read src/module_{n}.rs and say what it does. {}",
            "The module parses the configuration and checks every key. ".repeat(40)
        )}));
        let body = json!({"model": "gpt-5", "messages": messages});
        sent.push(body.clone());
        let answer = client()
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth("sk-long")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "step {n}");
        let reply: Value = answer.json().await.unwrap();
        messages.push(reply["choices"][0]["message"].clone());
        crate::common::agent::idle(&proxy).await;
    }
    let through: f64 = provider
        .reports()
        .iter()
        .map(|r| gpt5_priced(&r.usage))
        .sum();
    let direct_provider = FakeProvider::start(Behavior::default()).await.unwrap();
    for body in &sent {
        let status = client()
            .post(format!("{}/chat/completions", direct_provider.url()))
            .bearer_auth("sk-long")
            .json(body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200);
    }
    let direct: f64 = direct_provider
        .reports()
        .iter()
        .map(|r| gpt5_priced(&r.usage))
        .sum();
    eprintln!(
        "through {through:.0} direct {direct:.0} ({:+.1} %), decisions {:?}",
        100.0 * (direct - through) / direct,
        proxy.stats().not_worth_it
    );
    assert!(proxy.stats().compactions_total() >= 1);
    assert!(
        through < direct,
        "through abridge {through:.0} µ$, sent as it is {direct:.0} µ$"
    );
}

#[tokio::test]
async fn a_request_the_provider_says_is_too_long_is_compacted_for_the_window_and_says_so() {
    // The provider's window (4,500) is smaller than the one abridge was told (100,000):
    // a request under abridge's threshold overflows at the provider, and the retry is
    // compacted for the window, whatever the cost model weighed from the estimate.
    let provider = FakeProvider::start(Behavior {
        context_window: Some(4500),
        ..Behavior::default()
    })
    .await
    .unwrap();
    // Far from abridge's bounds whatever it predicts before the first usage is on
    // record (a busy machine): only the provider can say it is too long.
    let proxy = Proxy::start_with(windowed(&provider, 100_000)).await;
    let mut messages = opening(150);
    let (compacted, _) = turn(&proxy, &mut messages, 1).await;
    assert!(!compacted);
    messages.push(json!({"role": "user", "content": format!(
        "More of it: {}", "Each retry waits twice as long as the one before it. ".repeat(180)
    )}));
    let (compacted, reason, _) = send(&proxy, &messages).await;
    // The first turn, the request the provider refused, and its compacted retry.
    let sent = provider
        .requests()
        .iter()
        .filter(|r| r.uri.path() == "/v1/chat/completions")
        .count();
    assert_eq!(
        sent, 3,
        "the provider refused it once and took the retry (compacted {compacted}, {reason:?})"
    );
    assert!(compacted);
    assert_eq!(reason.as_deref(), Some("window"));
}
