//! A tenant's summary budget under real traffic: one key driving several conversations
//! at once gets every conversation's first summary (the floor), and an update the
//! budget refuses is built in the background once it refills instead of becoming
//! `recency` while the request still fits.

use std::time::Duration;

use abridge::config::Config;
use abridge::strategies::Strategy;
use fake_provider::{FakeProvider, is_summary_request};
use serde_json::{Value, json};

use crate::common::turns::{Answer, send};
use crate::common::{Proxy, compacting, eventually};

const THRESHOLD: u64 = 3000;

/// Conversation `k` with `pairs` user/assistant turns and a final question: about 200
/// tokens a pair, each naming its own file and port.
fn conversation(k: usize, pairs: usize) -> Vec<Value> {
    let filler = "The change touches the request path, so the benchmarks and the tests run before it lands. ";
    let mut messages =
        vec![json!({"role": "system", "content": format!("You help with project-{k}.")})];
    for i in 0..pairs {
        messages.push(json!({"role": "user", "content": format!(
            "Step {i} of project-{k}: look at src/mod_{k}_{i}.rs and port {}. {}", 8000 + i, filler.repeat(3))}));
        messages.push(
            json!({"role": "assistant", "content": format!("Done step {i}. {}", filler.repeat(3))}),
        );
    }
    messages.push(json!({"role": "user", "content": format!("What is next for project-{k}?")}));
    messages
}

fn config(provider: &FakeProvider, tokens_per_minute: u64) -> Config {
    let mut cfg = compacting(&provider.url(), Strategy::Structured, THRESHOLD);
    cfg.summary.max_tokens_per_tenant_per_minute = tokens_per_minute;
    cfg
}

/// The summary requests' cost as abridge charges it (prompt bytes / 4 + the cap), in
/// the order they came.
fn summary_costs(provider: &FakeProvider) -> Vec<u64> {
    provider
        .requests()
        .iter()
        .map(|r| r.json())
        .filter(|b| {
            b["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .map(|b| {
            let text: usize = b["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["content"].as_str().unwrap_or_default().len())
                .sum();
            text as u64 / 4 + b["max_tokens"].as_u64().unwrap()
        })
        .collect()
}

/// A started proxy whose tenant the provider has accepted (one 2xx).
async fn accepted(cfg: Config) -> Proxy {
    let proxy = Proxy::start_with(cfg).await;
    let hello = [json!({"role": "user", "content": "Hello."})];
    assert_eq!(send(&proxy, &hello).await.status, 200);
    proxy
}

fn strategy_of(answer: &Answer) -> bool {
    answer.compacted
        && answer
            .note
            .as_deref()
            .is_none_or(|n| !n.contains("recency"))
}

#[tokio::test]
async fn four_conversations_on_one_key_each_get_their_first_summary() {
    // What one first summary costs, measured with a budget nothing reaches.
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = accepted(config(&provider, 10_000_000)).await;
    let first = send(&proxy, &conversation(0, 30)).await;
    assert!(strategy_of(&first), "{:?}", first.note);
    let cost = summary_costs(&provider).into_iter().max().unwrap();

    // A budget of two of them: the third and fourth start on the floor.
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = accepted(config(&provider, 2 * cost)).await;
    let c: Vec<Vec<Value>> = (0..4).map(|k| conversation(k, 30)).collect();
    let (a, b, c2, d) = tokio::join!(
        send(&proxy, &c[0]),
        send(&proxy, &c[1]),
        send(&proxy, &c[2]),
        send(&proxy, &c[3])
    );
    let answers = [a, b, c2, d];
    for (k, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, 200);
        assert!(
            strategy_of(answer),
            "conversation {k}: {:?} (costs {:?}, budget {})",
            answer.note,
            summary_costs(&provider),
            2 * cost
        );
    }
    assert_eq!(proxy.stats().summary_refused, 0, "{:?}", proxy.stats());
    assert!(summary_costs(&provider).len() >= 4);
}

#[tokio::test]
async fn an_update_the_budget_refuses_is_built_in_the_background() {
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = accepted(config(&provider, 10_000_000)).await;
    send(&proxy, &conversation(0, 30)).await;
    let cost: u64 = summary_costs(&provider).iter().sum();

    // Four fifths of the first summary's cost: it overdraws the budget by a fifth, which
    // refills in about a quarter of a minute.
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = accepted(config(&provider, cost * 4 / 5)).await;
    let mut messages = conversation(0, 30);
    let first = send(&proxy, &messages).await;
    assert!(strategy_of(&first), "{:?}", first.note);
    let summaries = summary_costs(&provider).len();

    // Grown past the threshold again: an update is due, and refused for now.
    messages.push(json!({"role": "assistant", "content": "Next is step 30."}));
    // Pairs 30 to 45 of the same project, then a new question.
    messages.extend(conversation(0, 46).drain(61..93));
    messages.push(json!({"role": "user", "content": "And now?"}));
    let deferred = send(&proxy, &messages).await;
    assert_eq!(deferred.status, 200);
    let note = deferred.note.clone().unwrap_or_default();
    assert!(
        deferred.compacted && note.contains("built in the background"),
        "forwarded with the first summary, and says why: {note}"
    );
    assert!(!note.contains("recency"), "{note}");
    assert_eq!(proxy.stats().summary_deferred, 1);
    assert_eq!(
        summary_costs(&provider).len(),
        summaries,
        "nothing spent now"
    );

    // Once the budget refills, the update is made in the background …
    assert!(
        eventually(Duration::from_secs(90), || summary_costs(&provider).len()
            > summaries)
        .await,
        "the update was never built"
    );
    assert!(
        eventually(Duration::from_secs(20), || proxy
            .stats()
            .compactions_total()
            >= 2)
        .await
    );
    // … and the next turn goes with it: no deferral, no recency.
    messages.push(json!({"role": "assistant", "content": "Next is the release."}));
    messages.push(json!({"role": "user", "content": "Go on."}));
    let next = send(&proxy, &messages).await;
    let note = next.note.unwrap_or_default();
    assert!(
        next.compacted && !note.contains("background") && !note.contains("recency"),
        "{note}"
    );
    assert_eq!(proxy.stats().summary_deferred, 1);
    assert_eq!(proxy.stats().fallbacks, 0);
}
