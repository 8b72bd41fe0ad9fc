//! The Anthropic Messages route (`POST /v1/messages`) end to end, driven as Claude Code
//! drives it. The fake provider validates every request as Anthropic does (a
//! `tool_use` answered in the very next message, thinking signatures, at most four
//! cache breakpoints) and, as many compatible servers do, strict alternation: a green
//! turn is a valid request.

use abridge::config::Config;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, Recorded};
use serde_json::{Value, json};

use crate::common::agent::Answer;
use crate::common::claude::ClaudeAgent;
use crate::common::{Proxy, client};

const THRESHOLD: u64 = 3000;

fn config(url: &str, strategy: Strategy) -> Config {
    crate::common::compacting(url, strategy, THRESHOLD)
}

fn sent(provider: &FakeProvider) -> Vec<Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/messages"))
        // Summaries of the conversation are asked in the Messages API too.
        .filter(|r| {
            !r.json()["messages"]
                .as_array()
                .is_some_and(|m| fake_provider::is_summary_request(m))
        })
        .collect()
}

/// Every thinking block forwarded is one the client sent, byte for byte.
fn assert_thinking_untouched(messages: &[Value], originals: &[Value]) {
    let blocks = |ms: &[Value]| -> Vec<Value> {
        ms.iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "thinking")
            .cloned()
            .collect()
    };
    let known = blocks(originals);
    for block in blocks(messages) {
        assert!(known.contains(&block), "thinking block altered: {block}");
    }
}

async fn long_session(strategy: Strategy, stream: bool) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), strategy);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-claude");
    agent.stream = stream;
    let mut answers: Vec<Answer> = Vec::new();
    for n in 1..=24 {
        answers.extend(agent.turn(n).await);
    }
    let requests = sent(&provider);
    assert_eq!(requests.len(), 48);
    let first = answers
        .iter()
        .position(Answer::compacted)
        .unwrap_or_else(|| panic!("{strategy}: never compacted"));
    assert!(first > 4, "not before the session was long");
    let mut cache_hits = 0;
    let mut previous: Option<String> = None;
    for (i, request) in requests.iter().enumerate() {
        let body = request.json();
        assert_eq!(request.uri.query(), Some("beta=true"), "the query is kept");
        assert_eq!(body["system"], agent.system, "system untouched");
        let messages = body["messages"].as_array().unwrap().clone();
        assert_eq!(
            messages[..2],
            agent.messages[..2],
            "{strategy}: the ask and the environment stay"
        );
        assert_thinking_untouched(&messages, &agent.messages);
        if i < first {
            continue;
        }
        assert!(answers[i].compacted(), "{strategy}: request {i} compacted");
        let replaced = answers[i].header("x-abridge-messages-replaced");
        if previous == replaced && !stream {
            cache_hits +=
                u64::from(answers[i].body["usage"]["cache_read_input_tokens"].as_u64() > Some(0));
        }
        previous = replaced;
    }
    let after: u64 = answers
        .last()
        .unwrap()
        .header("x-abridge-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= THRESHOLD, "{strategy}: {after} over the threshold");
    let stats = proxy.stats();
    assert_eq!(stats.usage_reports, 48, "usage read from every answer");
    assert_eq!(stats.messages_requests, 48);
    if !stream {
        // Between compactions the forwarded prefix is byte-stable: the provider's cache
        // serves it (the fake simulates Anthropic's prompt cache).
        assert!(
            cache_hits > 0,
            "{strategy}: no cache reads between compactions"
        );
        assert!(
            stats.cached_tokens_reported > 0,
            "and the metric counts them"
        );
    }
}

#[tokio::test]
async fn a_long_claude_code_session_is_compacted_by_every_strategy() {
    for strategy in [
        Strategy::Recency,
        Strategy::Deterministic,
        Strategy::Structured,
        Strategy::LlmReplace,
    ] {
        long_session(strategy, false).await;
    }
}

#[tokio::test]
async fn streamed_messages_report_usage_from_message_start_and_delta() {
    long_session(Strategy::Recency, true).await;
}

/// Behind a provider that has context editing (`native`; where abridge serves it, see
/// `messages_compaction.rs`).
#[tokio::test]
async fn provider_managed_context_is_forwarded_untouched() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.provider_apis.messages_compaction = abridge::config::ProviderCompaction::Native;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-managed");
    agent
        .headers
        .push(("x-abridge-compact".into(), "force".into()));
    for n in 1..=2 {
        agent.turn(n).await;
    }
    agent.extra.insert(
        "context_management".into(),
        json!({"edits": [{"type": "clear_tool_uses_20250919"}]}),
    );
    let body = agent.body(false);
    let answer = agent.send_body(body.clone(), false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        provider.last_request().unwrap().body == body.as_bytes(),
        "byte for byte"
    );
    assert!(!answer.compacted());
    assert!(
        answer
            .header("x-abridge-note")
            .unwrap()
            .contains("context_management")
    );

    // Claude Code's own: keep all thinking (no edit) and the beta — compacted as usual.
    agent.extra.insert(
        "context_management".into(),
        json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
    );
    agent.headers.push((
        "anthropic-beta".into(),
        "context-management-2025-06-27".into(),
    ));
    let answer = agent.send(false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.compacted(),
        "forced, and nothing managed by the provider"
    );
}

#[tokio::test]
async fn prompt_too_long_is_compacted_and_retried() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.threshold_tokens = 100_000;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-overflow");
    for n in 1..=6 {
        agent.turn(n).await;
    }
    agent.headers.push(("x-fake-window".into(), "2500".into()));
    agent
        .messages
        .push(json!({"role": "user", "content": "Summarise the work so far."}));
    let answer = agent.send(false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.compacted());
    assert_eq!(proxy.stats().retries, 1);
}

#[tokio::test]
async fn abridge_answers_its_own_errors_in_anthropic_shape_there() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.limits.max_body_bytes = 1000;
    let proxy = Proxy::start_with(cfg).await;
    let big = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x".repeat(2000)}]});
    for (path, anthropic) in [("/v1/messages", true), ("/v1/chat/completions", false)] {
        let response = client()
            .post(proxy.url(path))
            .body(big.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 413);
        let body: Value = response.json().await.unwrap();
        if anthropic {
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], "request_too_large");
        } else {
            assert_eq!(body["error"]["code"], "request_too_large");
        }
    }
}

#[tokio::test]
async fn one_abridge_serves_an_openai_and_an_anthropic_upstream() {
    let openai = FakeProvider::start(Behavior::default()).await.unwrap();
    let anthropic = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&openai.url(), Strategy::Structured);
    cfg.compaction.background = false;
    cfg.anthropic_upstream = Some(anthropic.url().parse().unwrap());
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-both");
    let mut compacted = false;
    for n in 1..=20 {
        compacted |= agent.turn(n).await.iter().any(Answer::compacted);
        if compacted {
            break;
        }
    }
    assert!(compacted);
    let count = client()
        .post(proxy.url("/v1/messages/count_tokens"))
        .header("x-api-key", "sk-ant-both")
        .header("anthropic-version", "2023-06-01")
        .body(agent.body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(count.status(), 200);
    let count: Value = count.json().await.unwrap();
    assert!(count["input_tokens"].as_u64().unwrap() > 0);
    let chat = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-openai")
        .body(crate::common::chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    // OpenAI saw only the chat request; the Anthropic provider saw the Messages
    // requests, count_tokens and the summary of its own conversation — the client's
    // Anthropic key never went to the other provider.
    let seen = |p: &FakeProvider| -> Vec<(String, bool, bool)> {
        p.requests()
            .iter()
            .map(|r| {
                let summary = r.json()["messages"]
                    .as_array()
                    .is_some_and(|m| fake_provider::is_summary_request(m));
                (
                    r.uri.path().to_owned(),
                    r.headers.contains_key("x-api-key"),
                    summary,
                )
            })
            .collect()
    };
    assert_eq!(
        seen(&openai),
        [("/v1/chat/completions".to_owned(), false, false)]
    );
    let at_anthropic = seen(&anthropic);
    assert!(
        at_anthropic.iter().all(|(_, key, _)| *key),
        "{at_anthropic:?}"
    );
    assert!(
        at_anthropic
            .iter()
            .any(|(p, _, summary)| p == "/v1/messages" && *summary),
        "the summary, in the Messages API: {at_anthropic:?}"
    );
    assert!(
        at_anthropic
            .iter()
            .any(|(p, _, _)| p == "/v1/messages/count_tokens")
    );
    assert!(proxy.stats().summary_failures == 0, "{:?}", proxy.stats());
}

/// Claude Code's long turn: one ask, then tool rounds whose results (each a block of a
/// user message, two calls answered by one message) grow the turn past the threshold.
/// The bulky results the model has acted on are cleared in place — each block's content
/// a digest naming its own call, its `tool_use_id` and `is_error` and the message's
/// other blocks as they came — and the request is compacted under the threshold; the
/// ask, every call and the newest exchange go as they came, and the provider (strict
/// alternation, calls answered in the next message) takes every request.
#[tokio::test]
async fn a_claude_code_turn_longer_than_the_threshold_is_compacted_by_clearing_results() {
    let (provider, proxy) = long_turn_setup().await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-long-turn");
    agent.turn(1).await;
    let ask = json!({"role": "user", "content": [{"type": "text",
        "text": "Run every test suite and fix what fails (ticket ABC-9)."}]});
    agent.messages.push(ask.clone());
    let messages = long_turn(&provider, &mut agent).await;
    let at = messages
        .iter()
        .position(|m| *m == ask)
        .expect("the ask as it came");
    let turn = &agent.messages[agent.messages.iter().position(|m| *m == ask).unwrap()..];
    assert!(cleared(&messages[at..], turn) >= 4);
    assert!(
        !messages[at + 2].to_string().contains("zanzibar"),
        "the first cleared"
    );
}

/// A session of one ask (as many Claude Code sessions are): nothing but the head
/// precedes the final turn, so nothing can be elided, and the turn's results are cleared
/// alone — no marker, every message sent, the ask and the environment first as they came.
#[tokio::test]
async fn a_session_of_one_ask_is_compacted_by_clearing_its_results_alone() {
    let (provider, proxy) = long_turn_setup().await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-one-ask");
    agent.messages.truncate(2);
    let messages = long_turn(&provider, &mut agent).await;
    assert_eq!(
        messages.len(),
        agent.messages.len(),
        "every message is sent"
    );
    assert_eq!(messages[..2], agent.messages[..2]);
    assert!(
        !Value::from(messages.clone())
            .to_string()
            .contains("[abridge: reference material"),
        "no marker: nothing is elided"
    );
    assert!(cleared(&messages[2..], &agent.messages[2..]) >= 4);
}

async fn long_turn_setup() -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    (provider, proxy)
}

/// Eight tool rounds of the agent's final turn, each sent; then the last request, which
/// must be compacted under the threshold with the recall tool offered. What the
/// provider got last.
async fn long_turn(provider: &FakeProvider, agent: &mut ClaudeAgent) -> Vec<Value> {
    let mut compacted = 0;
    for round in 1..=8 {
        let answer = agent.send(false).await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.body);
        compacted += usize::from(answer.compacted());
        agent.messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Round {round}.")},
            {"type": "tool_use", "id": format!("toolu_run_{round}"), "name": "Bash",
             "input": {"command": format!("cargo test suite_{round}")}},
            {"type": "tool_use", "id": format!("toolu_read_{round}"), "name": "Read",
             "input": {"path": format!("src/suite_{round}.rs")}}]}));
        agent.messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_run_{round}"), "is_error": true,
             "content": format!("suite_{round}: {}\n{}", "test failed; ".repeat(300),
                if round == 1 { "zanzibar checksum: 0xBEEF7" } else { "no checksum" })},
            {"type": "tool_result", "tool_use_id": format!("toolu_read_{round}"),
             "content": [{"type": "text", "text": format!("fn suite_{round}() {{}}")}]},
            {"type": "text", "text": "<system-reminder>todo list unchanged</system-reminder>"}]}));
    }
    let last = agent.send(false).await;
    assert_eq!(last.status, 200, "{}", last.body);
    assert!(last.compacted(), "{:?}", last.header("x-abridge-note"));
    assert!(compacted >= 3, "{compacted} of the rounds compacted");
    let after: u64 = last
        .header("x-abridge-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= THRESHOLD, "{after} over the threshold");
    let request = sent(provider).last().unwrap().json();
    // What was cleared is condensed: the recall tool reads it back.
    let tools = request["tools"].to_string();
    assert!(tools.contains("abridge_recall"), "{tools}");
    let messages = request["messages"].as_array().unwrap().clone();
    assert_eq!(
        messages.last(),
        agent.messages.last(),
        "the newest results whole"
    );
    messages
}

/// How many of `turn`'s messages were sent (`sent`, in order, one for one) with their
/// bulky Bash output cleared — and only that: the call it answers, its error flag, the
/// short Read result and the reminder as they came.
fn cleared(sent: &[Value], turn: &[Value]) -> usize {
    assert_eq!(sent.len(), turn.len(), "no message of the turn left out");
    let mut cleared = 0;
    for (sent, original) in sent.iter().zip(turn) {
        if sent == original {
            continue;
        }
        let (s, o) = (&sent["content"], &original["content"]);
        assert_eq!(s[0]["tool_use_id"], o[0]["tool_use_id"], "{sent}");
        assert_eq!(s[0]["is_error"], true);
        let text = s[0]["content"].as_str().unwrap();
        assert!(
            text.starts_with("[abridge: tool output elided] Bash(command=\"cargo test suite_"),
            "{text}"
        );
        assert_eq!(
            (&s[1], &s[2]),
            (&o[1], &o[2]),
            "the other blocks as they came"
        );
        cleared += 1;
    }
    cleared
}
