//! `recall.offer = "always"` (and `"auto"`, the default, for a conversation that starts
//! at half its threshold or more): an agent's requests (tools of their own) carry the
//! `abridge_recall` tool from their conversation's first, so the compaction that would
//! have added it leaves the provider's cached head as it is. A call before anything is
//! condensed is answered so, and never reaches the client; requests without tools of
//! their own, or that turn compaction off, go without it; the cost model counts the head
//! as cached for a first compaction.

use abridge::config::{Config, RecallOffer};
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use http::HeaderMap;
use serde_json::{Value, json};

use crate::common::{Proxy, compacting};

/// The client's own tool.
fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "run", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}])
}

/// `messages` sent as chat completions on `model`, with the client's tools when `tools`;
/// the answer's headers and body.
async fn send(
    proxy: &Proxy,
    (model, messages, tools): (&str, &[Value], bool),
    headers: &[(&str, &str)],
) -> (HeaderMap, Value) {
    let mut body = json!({"model": model, "messages": messages});
    if tools {
        body["tools"] = self::tools();
    }
    let response = crate::recall::post(proxy, "sk-offer", &body, headers).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    (headers, response.json().await.unwrap())
}

/// One agent turn on `model`: `ask`, each call of the client's tool answered with
/// `result`, until the model answers in text. Every answer's headers and body.
async fn turn(
    proxy: &Proxy,
    (model, messages): (&str, &mut Vec<Value>),
    (ask, result): (&str, &str),
) -> Vec<(HeaderMap, Value)> {
    messages.push(json!({"role": "user", "content": ask}));
    let mut answers = Vec::new();
    for _ in 0..4 {
        let (headers, body) = send(proxy, (model, messages, true), &[]).await;
        let message = body["choices"][0]["message"].clone();
        messages.push(message.clone());
        answers.push((headers, body));
        let Some(calls) = message["tool_calls"].as_array() else {
            return answers;
        };
        for call in calls {
            assert_eq!(call["function"]["name"], "run", "only the client's tool");
            messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": result}));
        }
    }
    panic!("the model never answered in text");
}

/// The names of the tools a forwarded body carried.
fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn offering(mut cfg: Config, offer: RecallOffer) -> Config {
    cfg.compaction.background = false;
    cfg.recall.offer = offer;
    cfg
}

#[tokio::test]
async fn an_agents_requests_carry_the_tool_from_the_first_and_an_early_call_is_answered() {
    let provider = FakeProvider::start(Behavior {
        uses_recall: true,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let cfg = compacting(&provider.url(), Strategy::Recency, 100_000);
    let proxy = Proxy::start_with(offering(cfg, RecallOffer::Always)).await;
    let mut messages =
        vec![json!({"role": "system", "content": "You know the harbour and its old lighthouse."})];
    let ask = (
        "Tell me about the harbour and its old lighthouse.",
        "harbour: lighthouse",
    );
    let answers = turn(&proxy, ("fake-model", &mut messages), ask).await;
    assert_eq!(answers.len(), 2, "the client's tool called, then an answer");
    for request in provider.requests() {
        assert_eq!(tool_names(&request.json()), ["run", "abridge_recall"]);
    }
    for (headers, _) in &answers {
        assert_eq!(headers["x-abridge-compacted"], "false");
    }

    // Asked about something never said, the model calls the tool: abridge answers that
    // nothing is condensed yet, and the client gets the model's answer, never the call.
    let before = provider.requests().len();
    messages.push(json!({"role": "user", "content": "Which port does the zanzibar gateway use?"}));
    let (headers, body) = send(&proxy, ("fake-model", &messages, true), &[]).await;
    let answer = &body["choices"][0];
    assert!(answer["message"].get("tool_calls").is_none(), "{body}");
    assert_eq!(answer["finish_reason"], "stop");
    assert!(
        answer["message"]["content"]
            .as_str()
            .unwrap()
            .contains("could not find"),
        "{body}"
    );
    assert_eq!(headers["x-abridge-compacted"], "false");
    assert_eq!(
        headers["x-abridge-recalls"], "0",
        "no condensed text was served"
    );
    let rounds = crate::recall::rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2, "the call, then the answer to its result");
    let result = &rounds[1]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(result["role"], "tool");
    assert_eq!(result["content"], abridge::recall::NOTHING_CONDENSED);
    // Streamed, the same: the call is served within the stream, never relayed.
    let body =
        json!({"model": "fake-model", "messages": messages, "stream": true, "tools": tools()});
    let response = crate::recall::post(&proxy, "sk-offer", &body, &[]).await;
    assert_eq!(response.status(), 200);
    let sse = response.text().await.unwrap();
    assert!(!sse.contains("abridge_recall"), "{sse}");
    let (_, text, calls) = crate::recall_stream::chat_stream(&sse);
    assert!(calls.is_empty() && text.contains("could not find"), "{sse}");

    // A request without tools of its own, or that turns compaction off, goes without it.
    let before = provider.requests().len();
    assert_eq!(
        before, 6,
        "two rounds each for the question, whole and streamed"
    );
    let plain = [json!({"role": "user", "content": "Tell me about the harbour."})];
    send(&proxy, ("fake-model", &plain, false), &[]).await;
    let off = [("x-abridge-compact", "off")];
    send(&proxy, ("fake-model", &plain, true), &off).await;
    let sent = provider.requests();
    assert_eq!(sent.len(), before + 2);
    assert!(sent[before].json().get("tools").is_none());
    assert_eq!(tool_names(&sent[before + 1].json()), ["run"]);
}

/// A long agent conversation (chat completions, OpenAI's automatic prefix caching) at a
/// threshold of 4,000 tokens, its system prompt `head` sentences long, with `offer`:
/// the tools its first request was forwarded with, and the usage the answer to the
/// request that first compacted it reported.
async fn first_compaction(offer: RecallOffer, head: usize) -> (Vec<String>, Value) {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let cfg = compacting(&provider.url(), Strategy::Recency, 4000);
    let proxy = Proxy::start_with(offering(cfg, offer)).await;
    // An agent's head: a long system prompt, read from the cache on every request.
    let system =
        "You are a careful coding agent; keep every change small and tested. ".repeat(head);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let result = "fn check() -> u32 { let value = compute(input) + offset; value } ".repeat(20);
    for n in 1..30 {
        let ask = format!("Step {n}: fix the failing check in the module and keep it small.");
        for (headers, body) in turn(&proxy, ("fake-model", &mut messages), (&ask, &result)).await {
            if headers["x-abridge-compacted"] == "true" {
                let first = tool_names(&provider.requests()[0].json());
                return (first, body["usage"].clone());
            }
        }
    }
    panic!("{offer:?}: never compacted");
}

async fn first_compaction_usage(offer: RecallOffer) -> Value {
    first_compaction(offer, 90).await.1
}

/// What the usage of a first compaction says the provider read from its cache, checked
/// to be some of the prompt and not all of it.
fn cached(usage: &Value) -> u64 {
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached < usage["prompt_tokens"].as_u64().unwrap(), "{usage}");
    cached
}

#[tokio::test]
async fn by_default_a_conversation_that_starts_at_half_its_threshold_carries_the_tool_from_the_first()
 {
    assert_eq!(Config::default().recall.offer, RecallOffer::Auto);
    // A head of ~2,600 tokens against a threshold of 4,000: offered from the first
    // request, so the first compaction reads the head from the cache.
    let (first, usage) = first_compaction(RecallOffer::Auto, 160).await;
    assert_eq!(first, ["run", "abridge_recall"]);
    assert!(cached(&usage) >= 2048, "{usage}");
    // A head of ~1,500: the first requests go as the client sent them; the compaction
    // adds the tool and the provider reads nothing from its cache.
    let (first, usage) = first_compaction(RecallOffer::Auto, 90).await;
    assert_eq!(first, ["run"]);
    assert_eq!(cached(&usage), 0, "{usage}");

    // Under the default threshold (three quarters of an 8,000-token window here), whether
    // crossing it compacts is the cost policy's call: a ~3,600-token start goes without
    // the tool until a compaction adds it.
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let cfg = crate::cost::windowed(&provider, 8000);
    let proxy = Proxy::start_with(offering(cfg, RecallOffer::Auto)).await;
    let system = "You are a careful coding agent; keep every change small and tested. ".repeat(220);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let ask = ("Step 1: fix the failing check.", "ok");
    turn(&proxy, ("gpt-5", &mut messages), ask).await;
    assert_eq!(tool_names(&provider.requests()[0].json()), ["run"]);
}

#[tokio::test]
async fn the_first_compaction_reads_the_head_from_the_cache_when_the_tool_was_offered_all_along() {
    // Added by the compaction, the tool changes the tools that start the prompt: the
    // provider reads nothing from its cache, the long system prompt included.
    let added = first_compaction_usage(RecallOffer::Compacted).await;
    assert_eq!(
        added["prompt_tokens_details"]["cached_tokens"], 0,
        "{added}"
    );
    // Offered all along, the start is the same: the head is read from the cache.
    let offered = first_compaction_usage(RecallOffer::Always).await;
    assert!(cached(&offered) >= 1024, "{offered}");
}

/// What the cost model weighed for a conversation over gpt-5's threshold (its window
/// 8,000 tokens), its head a long document, with `offer`: the decision's figures.
async fn weighed(offer: RecallOffer) -> Value {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let cfg = crate::cost::with_admin(crate::cost::windowed(&provider, 8000));
    let proxy = Proxy::start_with(offering(cfg, offer)).await;
    let mut messages = crate::cost::opening(300);
    turn(
        &proxy,
        ("gpt-5", &mut messages),
        ("Question 1: what fails first?", "ok"),
    )
    .await;
    let more = format!(
        "More of it: {}",
        "Each retry waits twice as long as the one before it. ".repeat(40)
    );
    let answers = turn(&proxy, ("gpt-5", &mut messages), (&more, "ok")).await;
    let (headers, _) = &answers[0];
    let reason = headers["x-abridge-reason"].to_str().unwrap().to_owned();
    crate::common::agent::idle(&proxy).await;
    crate::cost::decided(&proxy, &reason).await["model"].clone()
}

#[tokio::test]
async fn the_cost_model_counts_the_head_as_cached_when_every_request_carried_the_tool() {
    let added = weighed(RecallOffer::Compacted).await;
    let offered = weighed(RecallOffer::Always).await;
    let usd = |m: &Value, k: &str| m[k].as_f64().unwrap();
    // The same conversation and target; compacted, the head (the document) is written
    // again at the input price when the compaction adds the tool, read from the cache
    // at a tenth of it when the tool was there all along.
    assert_eq!(added["target_tokens"], offered["target_tokens"]);
    assert!(
        usd(&offered, "compacted_usd") < usd(&added, "compacted_usd"),
        "{offered} against {added}"
    );
}

#[tokio::test]
async fn a_summary_asked_after_the_conversation_carries_the_tool_its_requests_carried() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let cfg = compacting(&provider.url(), Strategy::LlmReplace, 4000);
    let proxy = Proxy::start_with(offering(cfg, RecallOffer::Always)).await;
    let system = "You are a careful coding agent; keep every change small and tested. ".repeat(40);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let result = "fn check() -> u32 { let value = compute(input) + offset; value } ".repeat(20);
    for n in 1..30 {
        let ask = format!("Step {n}: fix the failing check in the module and keep it small.");
        turn(&proxy, ("fake-model", &mut messages), (&ask, &result)).await;
        crate::common::agent::idle(&proxy).await;
        let asked = "write a handoff summary of the conversation above";
        let Some(summary) = provider
            .reports()
            .into_iter()
            .find(|r| r.json().to_string().contains(asked))
        else {
            continue;
        };
        // The conversation's first summary: its tools are those of every request before
        // it (the tool among them), so the provider reads it from its cache.
        assert_eq!(tool_names(&summary.json()), ["run", "abridge_recall"]);
        let prompt = summary.usage["prompt_tokens"].as_u64().unwrap();
        let cached = summary.usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached * 10 >= prompt * 8,
            "{cached} of {prompt} from the cache"
        );
        assert_eq!(proxy.stats().fallbacks, 0);
        return;
    }
    panic!("no summary asked after the conversation");
}
