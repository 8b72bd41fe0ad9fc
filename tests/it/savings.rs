//! What compaction saved and what it cost, checked against the fake provider's own
//! counting: the tokens the clients' requests held (counted as the provider counts,
//! calibrated from abridge's estimate), what the provider was sent, the summariser's
//! spend, and the prompt cache's reads and writes as the provider reported them.

use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, count_tokens, is_summary_request};
use serde_json::Value;

use crate::common::agent::{Agent, main_requests};
use crate::common::claude::ClaudeAgent;
use crate::common::{Proxy, compacting};

const ADMIN_TOKEN: &str = "v8Rk3nQz6Wp1Xc9Lm4Ty7Hb2Jd5Fs0Ga";

/// The fake counts 30 % more tokens than abridge estimates, as a provider whose
/// tokenizer differs would.
const SCALE: f64 = 1.3;

fn counted(messages: &Value) -> u64 {
    (count_tokens(messages.as_array().unwrap()) as f64 * SCALE).ceil() as u64
}

#[tokio::test]
async fn saved_tokens_agree_with_the_providers_count_and_summaries_show_their_spend() {
    let provider = FakeProvider::start(Behavior {
        token_scale: SCALE,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut config = compacting(&provider.url(), Strategy::Structured, 3000);
    config.compaction.background = false;
    config.admin.token = Some(abridge::secret::Secret::new(ADMIN_TOKEN));
    let proxy = Proxy::start_with(config).await;
    let mut agent = Agent::new(&proxy, "sk-savings");
    for n in 1..=10 {
        agent.turn(n).await;
    }
    let stats = proxy.stats();
    assert!(stats.checkpoints_applied > 5, "{stats:?}");

    // What the provider would have counted had every request gone to it as sent.
    let sent = agent.sent.lock().unwrap().clone();
    let direct: u64 = sent
        .iter()
        .map(|b| counted(&serde_json::from_str::<Value>(b).unwrap()["messages"]))
        .sum();
    // What it counted for what abridge forwarded.
    let forwarded: u64 = main_requests(&provider)
        .iter()
        .map(|r| counted(&r.json()["messages"]))
        .sum();
    assert_eq!(stats.prompt_tokens_reported, forwarded);
    let off = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
    assert!(
        off(stats.client_prompt_tokens, direct) < 0.05,
        "clients sent {direct} as the provider counts; abridge says {}",
        stats.client_prompt_tokens
    );
    assert_eq!(
        stats.tokens_saved,
        stats.client_prompt_tokens - stats.prompt_tokens_reported
    );
    let saved = direct - forwarded;
    assert!(
        off(stats.tokens_saved, saved) < 0.08,
        "saved {saved} as the provider counts; abridge says {}",
        stats.tokens_saved
    );
    // abridge's own estimate is in the provider's units too (a checkpoint's saving,
    // made in abridge's, is scaled by the ratio learned from the reports).
    assert!(
        off(stats.tokens_saved_estimated, saved) < 0.10,
        "{} against {saved}",
        stats.tokens_saved_estimated
    );

    // The summariser's spend, as its provider reported it.
    let summaries: Vec<Value> = provider
        .requests()
        .iter()
        .map(|r| r.json())
        .filter(|b| {
            b["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .collect();
    assert!(!summaries.is_empty());
    assert_eq!(stats.summary_calls, summaries.len() as u64);
    let summary_input: u64 = summaries.iter().map(|b| counted(&b["messages"])).sum();
    assert_eq!(stats.summary_input_tokens, summary_input);
    assert!(stats.summary_output_tokens > 0, "{stats:?}");

    // /admin/stats says the same.
    let shown = proxy.admin_json("/admin/stats", ADMIN_TOKEN).await;
    let counters = &shown["counters"];
    for (field, value) in [
        ("client_prompt_tokens", stats.client_prompt_tokens),
        ("tokens_saved", stats.tokens_saved),
        ("summary_input_tokens", stats.summary_input_tokens),
    ] {
        assert_eq!(counters[field], value, "{field}: {counters}");
    }
}

#[tokio::test]
async fn prompt_cache_reads_and_writes_are_counted_as_the_provider_reported_them() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = compacting(&provider.url(), Strategy::Recency, 3000);
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let mut agent = ClaudeAgent::new(&proxy, "sk-ant-cache");
    let mut answers = Vec::new();
    for n in 1..=8 {
        answers.extend(agent.turn(n).await);
    }
    let reported = |field: &str| -> u64 {
        answers
            .iter()
            .map(|a| a.body["usage"][field].as_u64().unwrap_or(0))
            .sum()
    };
    let (read, written) = (
        reported("cache_read_input_tokens"),
        reported("cache_creation_input_tokens"),
    );
    assert!(read > 0 && written > 0, "the fake cached: {read} {written}");
    let stats = proxy.stats();
    assert_eq!(stats.cached_tokens_reported, read);
    assert_eq!(stats.cache_write_tokens_reported, written);
    assert!(stats.checkpoints_applied > 0, "{stats:?}");
}
