//! The Responses API route (`POST /v1/responses`) end to end, driven as Codex CLI drives
//! it: stateless, `store: false`, the whole input every turn, developer items as the
//! head, encrypted reasoning replayed before each call, calls paired with their outputs.
//! The fake provider validates every request as OpenAI does (a lone call or output, a
//! reasoning item without its following item: 400), so a green turn is a valid request.

use std::collections::HashSet;

use abridge::config::Config;
use abridge::secret::Secret;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, Recorded};
use serde_json::{Value, json};

use crate::common::Proxy;
use crate::common::agent::Answer;
use crate::common::redis::RedisServer;
use crate::common::responses::ResponsesAgent;

const THRESHOLD: u64 = 3000;

fn config(url: &str, strategy: Strategy) -> Config {
    crate::common::compacting(url, strategy, THRESHOLD)
}

/// The Responses requests the provider received (summary requests are chat).
/// The conversation's requests (not the summaries, which on the conversation's own
/// model are asked in the Responses API too).
fn sent(provider: &FakeProvider) -> Vec<Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/responses"))
        .filter(|r| {
            !r.json()["input"]
                .as_array()
                .is_some_and(|i| fake_provider::is_summary_request(i))
        })
        .collect()
}

fn input_of(r: &Recorded) -> Vec<Value> {
    r.json()["input"].as_array().unwrap().clone()
}

/// Every call has its output and every output its call; every reasoning item is
/// followed by the item it belongs to; nothing encrypted was altered.
fn assert_valid(input: &[Value], originals: &HashSet<String>) {
    let calls: HashSet<&str> = input
        .iter()
        .filter(|i| i["type"] == "function_call")
        .filter_map(|i| i["call_id"].as_str())
        .collect();
    let outputs: HashSet<&str> = input
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter_map(|i| i["call_id"].as_str())
        .collect();
    assert_eq!(calls, outputs, "calls and outputs stay paired");
    for (k, item) in input.iter().enumerate() {
        if item["type"] == "reasoning" {
            let next = input.get(k + 1).map(|n| n["type"].clone());
            assert_eq!(
                next,
                Some(json!("function_call")),
                "reasoning keeps its call"
            );
            assert!(
                originals.contains(&item.to_string()),
                "reasoning forwarded unchanged"
            );
        }
    }
}

async fn long_conversation(strategy: Strategy, stream: bool) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), strategy);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-codex");
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
    assert!(first > 4, "not before the conversation was long");
    let originals: HashSet<String> = agent.input.iter().map(Value::to_string).collect();
    let mut previous: Option<(String, Vec<String>)> = None;
    let mut stable = 0;
    for (i, request) in requests.iter().enumerate() {
        let body = request.json();
        let input = input_of(request);
        assert_valid(&input, &originals);
        assert_eq!(
            body["instructions"],
            json!(agent.instructions),
            "instructions kept"
        );
        assert_eq!(input[0], agent.input[0], "the developer item stays first");
        let sent_by_agent = serde_json::from_str::<Value>(&agent.body()).unwrap();
        for field in ["include", "text", "store", "tool_choice"] {
            assert_eq!(body[field], sent_by_agent[field]);
        }
        // The agent's tools, and — once compacted, streamed or not — abridge's recall
        // tool after them.
        let tools = body["tools"].as_array().unwrap();
        let agents = sent_by_agent["tools"].as_array().unwrap();
        assert_eq!(tools[..agents.len()], agents[..]);
        let recall = answers[i].compacted();
        assert_eq!(tools.len(), agents.len() + usize::from(recall));
        if recall {
            assert_eq!(tools[agents.len()]["name"], "abridge_recall");
        }
        if i < first {
            continue;
        }
        assert!(answers[i].compacted(), "{strategy}: request {i} compacted");
        let through = answers[i]
            .header("x-abridge-messages-replaced")
            .unwrap_or_default();
        // Between compactions (the same checkpoint) everything forwarded before is
        // forwarded again byte for byte, and the turn's new items follow it.
        let raw: Vec<String> = abridge::formats::responses::parse(&request.body)
            .unwrap()
            .raw_items
            .iter()
            .map(|r| r.get().to_owned())
            .collect();
        if let Some((at, before)) = &previous
            && *at == through
        {
            assert!(
                raw.len() > before.len() && raw[..before.len()] == before[..],
                "{strategy}: request {i}: the forwarded prefix moved"
            );
            stable += 1;
        }
        previous = Some((through, raw));
    }
    assert!(
        stable > 0,
        "{strategy}: no two requests shared a checkpoint"
    );
    let last = answers.last().unwrap();
    let after: u64 = last
        .header("x-abridge-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= THRESHOLD, "{strategy}: {after} over the threshold");
    let stats = proxy.stats();
    assert_eq!(stats.usage_reports, 48, "usage read from every answer");
    assert_eq!(stats.responses_api_requests, 48);
}

#[tokio::test]
async fn a_long_codex_conversation_is_compacted_by_every_strategy() {
    for strategy in [
        Strategy::Recency,
        Strategy::Deterministic,
        Strategy::Structured,
        Strategy::LlmReplace,
    ] {
        long_conversation(strategy, false).await;
    }
}

#[tokio::test]
async fn streamed_responses_report_usage_from_the_terminal_event() {
    long_conversation(Strategy::Recency, true).await;
}

#[tokio::test]
async fn state_on_the_provider_is_forwarded_untouched() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // A provider that has `context_management` itself (OpenAI's): behind one that lacks
    // it abridge serves it (tests/it/context_management.rs).
    let mut config = config(&provider.url(), Strategy::Recency);
    config.provider_apis.responses_compaction = abridge::config::ProviderCompaction::Native;
    let proxy = Proxy::start_with(config).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-stateful");
    agent
        .headers
        .push(("x-abridge-compact".into(), "force".into()));
    for (field, value) in [
        ("previous_response_id", json!("resp_123")),
        (
            "context_management",
            json!([{"type": "compaction", "compact_threshold": 1000}]),
        ),
    ] {
        agent.extra.clear();
        agent.extra.insert(field.into(), value);
        agent
            .input
            .push(json!({"role": "user", "content": "And now?"}));
        let body = agent.body();
        let answer = agent.send_body(body.clone()).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            provider.last_request().unwrap().body,
            body.as_bytes(),
            "{field}: byte for byte"
        );
        assert!(!answer.compacted());
        let note = answer.header("x-abridge-note").unwrap_or_default();
        assert!(note.contains(field), "{field}: {note}");
        assert!(
            answer.header("x-abridge-conversation").is_none(),
            "not even identified"
        );
    }
    assert_eq!(proxy.stats().identified, 0, "no store round trip for them");
}

#[tokio::test]
async fn context_overflow_is_compacted_and_retried() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    // abridge believes in a larger window than the provider has: only the provider's
    // `context_length_exceeded` says the prompt is too long.
    cfg.compaction.threshold_tokens = 100_000;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-overflow");
    for n in 1..=6 {
        agent.turn(n).await;
    }
    agent.headers.push(("x-fake-window".into(), "2500".into()));
    agent
        .input
        .push(json!({"role": "user", "content": "Summarise the work so far."}));
    let answer = agent.send().await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.compacted());
    let note = answer.header("x-abridge-note").unwrap_or_default();
    assert!(note.contains("context length exceeded"), "{note}");
    assert_eq!(proxy.stats().retries, 1);
}

#[tokio::test]
async fn the_prompt_cache_key_names_the_conversation_within_the_tenant() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url(), Strategy::Recency)).await;
    let conversation = async |tenant: &str, key: Option<&str>| {
        let mut agent = ResponsesAgent::new(&proxy, tenant);
        if let Some(key) = key {
            agent.extra.insert("prompt_cache_key".into(), json!(key));
        }
        agent
            .input
            .push(json!({"role": "user", "content": "Fix the build."}));
        let answer = agent.send().await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.header("x-abridge-conversation").unwrap()
    };
    let plain = conversation("sk-a", None).await;
    let thread_1 = conversation("sk-a", Some("thread-1")).await;
    let thread_2 = conversation("sk-a", Some("thread-2")).await;
    assert_ne!(
        plain, thread_1,
        "two sessions with the same first ask are told apart"
    );
    assert_ne!(thread_1, thread_2);
    assert_eq!(thread_1, conversation("sk-a", Some("thread-1")).await);
    assert_ne!(
        thread_1,
        conversation("sk-b", Some("thread-1")).await,
        "never across tenants"
    );
}

#[tokio::test]
async fn a_chat_conversation_and_a_responses_one_never_share_state() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url(), Strategy::Recency)).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-same");
    agent.instructions = None;
    agent.input = vec![json!({"role": "user", "content": "Hello there"})];
    let responses = agent.send().await;
    let chat = crate::common::client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-same")
        .body(json!({"model": "fake-model", "messages": [{"role": "user", "content": "Hello there"}]}).to_string())
        .send()
        .await
        .unwrap();
    let chat_id = chat.headers()["x-abridge-conversation"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_ne!(
        responses.header("x-abridge-conversation").unwrap(),
        chat_id,
        "a checkpoint written in one format is never spliced into the other"
    );
}

#[tokio::test]
async fn checkpoints_survive_a_restart_with_redis() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Deterministic);
    cfg.store.redis_url = Some(Secret::new(redis.url()));
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg.clone()).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-restart");
    let mut compacted = false;
    for n in 1..=20 {
        compacted |= agent.turn(n).await.iter().any(Answer::compacted);
        if compacted {
            break;
        }
    }
    assert!(compacted);
    proxy.shutdown().await.unwrap();

    let proxy = Proxy::start_with(cfg).await;
    agent.url = proxy.url("/v1/responses");
    agent
        .input
        .push(json!({"role": "user", "content": "Carry on."}));
    let answer = agent.send().await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.compacted(),
        "the stored checkpoint applies after a restart"
    );
    assert_eq!(proxy.stats().compactions_total(), 0, "applied, not rebuilt");
    assert_eq!(proxy.stats().checkpoints_applied, 1);
}

/// A Codex turn is an ask and every tool round the agent made for it. Once that turn
/// alone is over the threshold, the outputs the model has acted on since are cleared
/// (digested, each still naming its call) and the request is compacted under the
/// threshold; the ask, every call and reasoning item, and the newest output go as they
/// came, and the provider takes every request. What was cleared is recalled when the
/// model needs it.
#[tokio::test]
async fn a_turn_longer_than_the_threshold_is_compacted_by_clearing_the_outputs_acted_on() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url(), Strategy::Recency);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut agent = ResponsesAgent::new(&proxy, "sk-long-turn");
    for n in 1..=2 {
        agent.turn(n).await;
    }
    let ask = json!({"type": "message", "role": "user", "content": [{"type": "input_text",
        "text": "Run every test suite and fix what fails (ticket ABC-9)."}]});
    agent.input.push(ask.clone());
    let mut compacted = 0;
    for round in 1..=8 {
        let answer = agent.send().await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.body);
        let reported = answer.body["usage"]["input_tokens"].as_u64().unwrap();
        if answer.compacted() {
            compacted += 1;
            assert!(
                reported <= THRESHOLD + THRESHOLD / 5,
                "round {round}: {reported} at the provider"
            );
        }
        agent.input.push(json!({"type": "reasoning", "id": format!("rs_long_{round}"),
            "summary": [], "content": null, "encrypted_content": format!("gAAAA{}", "y7".repeat(40))}));
        agent.input.push(json!({"type": "function_call", "call_id": format!("call_long_{round}"),
            "name": "exec_command", "arguments": json!({"cmd": format!("cargo test suite_{round}")}).to_string()}));
        agent.input.push(
            json!({"type": "function_call_output", "call_id": format!("call_long_{round}"),
            "output": format!("suite_{round}: {}\n{}", "test ok; ".repeat(400),
                if round == 1 { "zanzibar checksum: 0xBEEF7" } else { "no checksum" })}),
        );
    }
    let last = agent.send().await;
    assert_eq!(last.status, 200, "{}", last.body);
    assert!(last.compacted(), "{:?}", last.header("x-abridge-note"));
    assert!(compacted >= 3, "{compacted} of the rounds compacted");
    // What the provider got last: the turn from its ask, each item there in order.
    let input = input_of(sent(&provider).last().unwrap());
    let originals: HashSet<String> = agent.input.iter().map(Value::to_string).collect();
    assert_valid(&input, &originals);
    let at = input
        .iter()
        .position(|i| *i == ask)
        .expect("the ask as it came");
    let turn = &agent.input[agent.input.iter().position(|i| *i == ask).unwrap()..];
    assert_eq!(input.len() - at, turn.len(), "no item of the turn left out");
    let mut cleared = 0;
    for (sent, original) in input[at..].iter().zip(turn) {
        if sent == original {
            continue;
        }
        assert_eq!(original["type"], "function_call_output", "{sent}");
        assert_eq!(sent["call_id"], original["call_id"]);
        let text = sent["output"].as_str().unwrap();
        assert!(
            text.starts_with("[abridge: tool output elided] exec_command(cmd="),
            "{text}"
        );
        cleared += 1;
    }
    assert!(cleared >= 4, "{cleared} outputs cleared");
    assert_eq!(input.last(), agent.input.last(), "the newest output whole");
    assert!(
        !input[at + 3].to_string().contains("zanzibar"),
        "the first output cleared"
    );
    // What was cleared is condensed: the recall tool reads it back.
    let tools = sent(&provider).last().unwrap().json()["tools"].clone();
    assert!(tools.to_string().contains("abridge_recall"), "{tools}");
}
