//! Summaries that ride the prompt cache, through the proxy against the fake provider
//! with its prompt cache (OpenAI's automatic prefix caching on chat and Responses,
//! Anthropic's breakpoints on Messages): a conversation compacted with `llm_replace` on
//! its own model has its summary asked after the conversation as it was forwarded, and
//! the provider reads most of that request from its cache; with a separate summary
//! model the transcript is asked, as before, and read from no cache.

use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, Report, text_of_content};
use serde_json::Value;

use crate::common::agent::{Agent, idle};
use crate::common::claude::ClaudeAgent;
use crate::common::responses::ResponsesAgent;
use crate::common::{Proxy, compacting};

/// A threshold a few agent turns cross.
const THRESHOLD: u64 = 4000;

/// The three APIs, each driven by its agent.
#[derive(Clone, Copy, Debug)]
enum Api {
    Chat,
    Responses,
    Messages,
}

/// Whether the request a report answers asked for a summary, and in which form: after
/// the conversation (`Some(true)`) or as a transcript (`Some(false)`).
fn summary_form(report: &Report) -> Option<bool> {
    let body = report.json();
    let items = body["messages"]
        .as_array()
        .or(body["input"].as_array())?
        .clone();
    let text = text_of_content(&items.last()?["content"]);
    if text.contains("write a handoff summary of the conversation above") {
        Some(true)
    } else if text.contains("<transcript-") || text.contains("<new-messages-") {
        Some(false)
    } else {
        None
    }
}

/// A report's prompt tokens and those read from the cache.
fn prompt_and_cached(usage: &Value) -> (u64, u64) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    if usage.get("cache_read_input_tokens").is_some() {
        let read = n(&usage["cache_read_input_tokens"]);
        let all = n(&usage["input_tokens"]) + n(&usage["cache_creation_input_tokens"]) + read;
        (all, read)
    } else if usage.get("prompt_tokens").is_some() {
        (
            n(&usage["prompt_tokens"]),
            n(&usage["prompt_tokens_details"]["cached_tokens"]),
        )
    } else {
        (
            n(&usage["input_tokens"]),
            n(&usage["input_tokens_details"]["cached_tokens"]),
        )
    }
}

/// What a summary call costs in millionths of a dollar, at one price table for both
/// forms (gpt-5's: $1.25 input, $0.125 cached, $10 output a million tokens; Anthropic's
/// cache writes at 1.25 times input).
fn priced(usage: &Value) -> f64 {
    let n = |v: &Value| v.as_u64().unwrap_or(0) as f64;
    let (all, read) = prompt_and_cached(usage);
    let written = n(&usage["cache_creation_input_tokens"]);
    let output = n(&usage["completion_tokens"]).max(n(&usage["output_tokens"]));
    (all as f64 - read as f64 - written) * 1.25
        + written * 1.5625
        + read as f64 * 0.125
        + output * 10.0
}

/// A conversation in `api` run through abridge until its first summary has been made
/// (`summary_model`: a separate model for summaries); the summary requests' reports.
async fn conversation(api: Api, summary_model: Option<&str>) -> Vec<(bool, Value)> {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = compacting(&provider.url(), Strategy::LlmReplace, THRESHOLD);
    if let Some(model) = summary_model {
        cfg.summary.model = model.to_owned();
    }
    let proxy = Proxy::start_with(cfg).await;
    let (mut chat, mut responses, mut claude) = (
        Agent::new(&proxy, "sk-cache-summary"),
        ResponsesAgent::new(&proxy, "sk-cache-summary"),
        ClaudeAgent::new(&proxy, "sk-ant-cache-summary"),
    );
    for n in 1..=12 {
        match api {
            Api::Chat => drop(chat.turn(n).await),
            Api::Responses => drop(responses.turn(n).await),
            Api::Messages => drop(claude.turn(n).await),
        }
        idle(&proxy).await;
        let summaries: Vec<(bool, Value)> = provider
            .reports()
            .iter()
            .filter_map(|r| summary_form(r).map(|form| (form, r.usage.clone())))
            .collect();
        if !summaries.is_empty() {
            // The summary was used: no fall back to recency, and counted by its form.
            let stats = proxy.stats();
            assert_eq!(stats.fallbacks, 0, "{api:?}");
            let riding = summaries.iter().filter(|(form, _)| *form).count() as u64;
            assert_eq!(stats.summaries_in_context, riding, "{api:?}");
            return summaries;
        }
    }
    panic!("{api:?}: no summary in twelve turns");
}

#[tokio::test]
async fn a_summary_on_the_conversations_own_model_is_read_from_the_cache() {
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let riding = conversation(api, None).await;
        let separate = conversation(api, Some("another-model")).await;
        let (form, usage) = &riding[0];
        assert!(form, "{api:?}: asked after the conversation");
        let (prompt, cached) = prompt_and_cached(usage);
        let share = cached as f64 / prompt as f64;
        assert!(
            share >= 0.8,
            "{api:?}: {cached} of {prompt} prompt tokens from the cache"
        );
        let (form, transcript_usage) = &separate[0];
        assert!(!form, "{api:?}: a separate model gets the transcript");
        let (t_prompt, t_cached) = prompt_and_cached(transcript_usage);
        eprintln!(
            "{api:?}: in context {prompt} prompt tokens, {cached} cached ({:.0} %), {:.0} µ$; \
             transcript {t_prompt} prompt tokens, {t_cached} cached, {:.0} µ$",
            share * 100.0,
            priced(usage),
            priced(transcript_usage),
        );
        assert!(
            priced(usage) < priced(transcript_usage),
            "{api:?}: the summary that rides the cache costs less"
        );
    }
}

/// A conversation first seen already long (resumed after a restart, or a client new to
/// abridge): no request of it was forwarded, so no cache holds it, and its summary is
/// the transcript (its items cut) rather than the whole conversation paid in full.
#[tokio::test]
async fn a_conversation_no_cache_holds_gets_the_transcript() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy =
        Proxy::start_with(compacting(&provider.url(), Strategy::LlmReplace, THRESHOLD)).await;
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a coding agent."})];
    for i in 0..12 {
        messages.push(serde_json::json!({"role": "user", "content": format!("Step {i}: {}", "change the parser. ".repeat(60))}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("Step {i} done: {}", "edited src/parser.rs. ".repeat(40))}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "What is left?"}));
    let send = |messages: Vec<Value>| {
        crate::common::client()
            .post(proxy.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-cold-summary")
            .body(serde_json::json!({"model": "fake-model", "messages": messages}).to_string())
            .send()
    };
    // The tenant accepted by the provider first (summaries are asked only for such).
    let hello = vec![serde_json::json!({"role": "user", "content": "Hello."})];
    assert_eq!(send(hello).await.unwrap().status(), 200);
    let answer = send(messages).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-abridge-compacted"], "true");
    let forms: Vec<bool> = provider.reports().iter().filter_map(summary_form).collect();
    assert_eq!(forms, [false], "one summary, the transcript");
    assert_eq!(proxy.stats().summaries_in_context, 0);
}
