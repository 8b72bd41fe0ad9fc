//! What compaction saved and what it cost, checked against the fake provider's own
//! counting: the tokens the clients' requests held (counted as the provider counts,
//! calibrated from abridge's estimate), what the provider was sent, the summariser's
//! spend, and the prompt cache's reads and writes as the provider reported them.

use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, count_tokens, is_summary_request};
use serde_json::Value;

use std::time::Duration;

use abridge::prices::Price;

use crate::common::agent::{Agent, main_requests};
use crate::common::claude::ClaudeAgent;
use crate::common::responses::ResponsesAgent;
use crate::common::{Proxy, compacting, eventually};

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

/// The prices the money tests apply, dollars per million tokens: input, cached input,
/// cache write, output.
const PRICE: (f64, f64, f64, f64) = (2.0, 0.5, 2.5, 8.0);

fn price_table() -> std::collections::BTreeMap<String, Price> {
    let (input, cached, write, output) = PRICE;
    let price = Price {
        input,
        cached_input: Some(cached),
        cache_write: Some(write),
        output,
    };
    [("fake-model", price), ("claude-sonnet-4-5", price)]
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p))
        .collect()
}

/// What one `usage` a provider reported costs at [`PRICE`], in millionths of a dollar,
/// worked out here by hand from the usage object in each format's naming.
fn priced(usage: &Value) -> f64 {
    let (input, cached, write, output) = PRICE;
    let n = |v: &Value| v.as_u64().unwrap_or(0) as f64;
    if usage.get("cache_read_input_tokens").is_some() {
        // Anthropic: input_tokens leaves out the cache's reads and writes.
        return n(&usage["input_tokens"]) * input
            + n(&usage["cache_read_input_tokens"]) * cached
            + n(&usage["cache_creation_input_tokens"]) * write
            + n(&usage["output_tokens"]) * output;
    }
    let prompt = n(&usage["prompt_tokens"]).max(n(&usage["input_tokens"]));
    let hit = n(&usage["prompt_tokens_details"]["cached_tokens"])
        .max(n(&usage["input_tokens_details"]["cached_tokens"]));
    (prompt - hit) * input
        + hit * cached
        + (n(&usage["completion_tokens"]) + n(&usage["output_tokens"])) * output
}

/// A summary request, in any API (a Responses summary asked after the conversation
/// goes to `/responses`, its messages in `input`).
fn is_summary(report: &fake_provider::Report) -> bool {
    let body = report.json();
    [&body["messages"], &body["input"]]
        .iter()
        .any(|m| m.as_array().is_some_and(|m| is_summary_request(m)))
}

/// The clients' requests sent as they were, in order, straight to a fresh fake provider
/// that counts and caches as the first one: what they cost there, by hand.
async fn direct_cost(
    path: &str,
    bodies: &[String],
    headers: &[(String, String)],
    scale: f64,
) -> Direct {
    let provider = FakeProvider::start(Behavior {
        token_scale: scale,
        ..Behavior::default()
    })
    .await
    .unwrap();
    for body in bodies {
        let mut request = crate::common::client()
            .post(format!("{}{path}", provider.url()))
            .header("authorization", "Bearer sk-direct")
            .header("x-api-key", "sk-ant-direct")
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body.clone());
        for (k, v) in headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let status = request.send().await.unwrap().status();
        assert_eq!(status, 200);
    }
    let reports = provider.reports();
    let input = |u: &Value| {
        [
            "prompt_tokens",
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ]
        .iter()
        .filter_map(|k| u[*k].as_u64())
        .sum::<u64>()
    };
    Direct {
        micros: reports.iter().map(|r| priced(&r.usage)).sum(),
        tokens: reports.iter().map(|r| input(&r.usage)).sum(),
    }
}

/// What the clients' requests cost sent straight to a provider, and its count of them.
struct Direct {
    micros: f64,
    tokens: u64,
}

#[derive(Clone, Copy, Debug)]
enum Client {
    Chat,
    Codex,
    Claude,
}

/// An agent of `client` for `count` turns through abridge: the bodies it sent, the
/// path, its headers.
async fn turns(
    client: Client,
    proxy: &Proxy,
    count: usize,
) -> (Vec<String>, &'static str, Vec<(String, String)>) {
    match client {
        Client::Chat => {
            let mut agent = Agent::new(proxy, "sk-net-chat");
            for n in 1..=count {
                agent.turn(n).await;
            }
            let sent = agent.sent.lock().unwrap().clone();
            (sent, "/v1/chat/completions", Vec::new())
        }
        Client::Codex => {
            let mut agent = ResponsesAgent::new(proxy, "sk-net-codex");
            for n in 1..=count {
                agent.turn(n).await;
            }
            let sent = agent.sent.lock().unwrap().clone();
            (sent, "/v1/responses", Vec::new())
        }
        Client::Claude => {
            let mut agent = ClaudeAgent::new(proxy, "sk-ant-net");
            agent.stream = true;
            for n in 1..=count {
                agent.turn(n).await;
            }
            let sent = agent.sent.lock().unwrap().clone();
            (sent, "/v1/messages", agent.headers.clone())
        }
    }
}

/// The money figures against the fake provider's own log: what the forwarded requests
/// and the summaries cost (exactly, at the price table, worked out by hand from what the
/// fake reported), what the clients' requests would have cost sent as sent (within 5 %
/// of the same requests sent to a fresh fake, its prompt cache included), and the net
/// figure; the same in `/admin/stats` and in the conversation's account.
async fn net_saving_agrees_with_the_providers_log(client: Client) {
    let provider = FakeProvider::start(Behavior {
        token_scale: SCALE,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut config = compacting(&provider.url(), Strategy::Structured, 3000);
    config.compaction.background = false;
    config.admin.token = Some(abridge::secret::Secret::new(ADMIN_TOKEN));
    config.prices = price_table();
    let proxy = Proxy::start_with(config).await;
    let (sent, path, headers) = turns(client, &proxy, 10).await;
    let reports = provider.reports();
    let main: Vec<_> = reports.iter().filter(|r| !is_summary(r)).collect();
    let all = main.len() as u64;
    let recorded = eventually(Duration::from_secs(10), || {
        proxy.stats().usage_reports == all
    })
    .await;
    assert!(
        recorded,
        "{client:?}: {} of {all} reports recorded",
        proxy.stats().usage_reports
    );
    let stats = proxy.stats();
    assert!(stats.checkpoints_applied > 5, "{client:?}: {stats:?}");
    assert!(
        stats.cached_tokens_reported > 0,
        "{client:?}: the fake cached: {stats:?}"
    );

    let forwarded: f64 = main.iter().map(|r| priced(&r.usage)).sum();
    let summaries: f64 = reports
        .iter()
        .filter(|r| is_summary(r))
        .map(|r| priced(&r.usage))
        .sum();
    assert!(summaries > 0.0, "{client:?}: no summary was made");
    let close = |ours: u64, theirs: f64, within: f64| (ours as f64 - theirs).abs() <= within;
    let rounding = reports.len() as f64;
    assert!(
        close(stats.cost_forwarded, forwarded, rounding),
        "{client:?}: forwarded cost {} µ$, the fake's log says {forwarded}",
        stats.cost_forwarded
    );
    assert!(
        close(stats.cost_summaries, summaries, rounding),
        "{client:?}: summaries cost {} µ$, the fake's log says {summaries}",
        stats.cost_summaries
    );
    let Direct {
        micros: direct,
        tokens,
    } = direct_cost(path, &sent, &headers, SCALE).await;
    assert!(
        close(
            stats.client_prompt_tokens,
            tokens as f64,
            tokens as f64 * 0.05
        ),
        "{client:?}: the clients sent {tokens} tokens as the provider counts; abridge says {}",
        stats.client_prompt_tokens
    );
    assert!(
        close(stats.cost_direct, direct, direct * 0.05),
        "{client:?}: sent as sent: abridge says {} µ$, the fake charged {direct}",
        stats.cost_direct
    );
    // Here, ten short turns at a 3,000-token threshold with a summary for every
    // compaction, the net is a loss on every format: the figure must say so as it is.
    let net = direct - forwarded - summaries;
    assert!(
        (stats.net_saved_micros() as f64 - net).abs() <= direct * 0.05,
        "{client:?}: net {} µ$ against {net}",
        stats.net_saved_micros()
    );

    // /admin/stats and the conversation's own account say the same.
    let shown = proxy.admin_json("/admin/stats", ADMIN_TOKEN).await;
    let usd = &shown["savings"]["usd"];
    assert!(
        (usd["net_saved"].as_f64().unwrap() * 1e6 - stats.net_saved_micros() as f64).abs() < 1.0,
        "{shown}"
    );
    let list = proxy.admin_json("/admin/conversations", ADMIN_TOKEN).await;
    let listed = &list["conversations"][0];
    let format = match client {
        Client::Chat => "chat",
        Client::Codex => "responses",
        Client::Claude => "messages",
    };
    assert_eq!(listed["format"], format, "{list}");
    let id = listed["id"].as_str().unwrap();
    let one = proxy
        .admin_json(&format!("/admin/conversations/{id}"), ADMIN_TOKEN)
        .await;
    let own = &one["savings"];
    assert_eq!(own["requests"], main.len() as u64, "{own}");
    assert_eq!(own["summaries"]["calls"], stats.summary_calls, "{own}");
    assert!(
        (own["usd"]["net_saved"].as_f64().unwrap() * 1e6 - stats.net_saved_micros() as f64).abs()
            < 1.0,
        "{own}"
    );
    // Its plot: a point per request, the client's prompt against the forwarded one, and
    // compactions where the checkpoint in force changes.
    let series = one["series"].as_array().unwrap();
    assert_eq!(series.len(), main.len(), "{one}");
    assert!(
        series
            .iter()
            .any(|p| p["client"].as_u64() > p["forwarded"].as_u64())
    );
    assert!(series.iter().any(|p| !p["applied"].is_null()));
}

#[tokio::test]
async fn net_saving_on_chat_agrees_with_the_providers_log() {
    net_saving_agrees_with_the_providers_log(Client::Chat).await;
}

#[tokio::test]
async fn net_saving_on_responses_agrees_with_the_providers_log() {
    net_saving_agrees_with_the_providers_log(Client::Codex).await;
}

#[tokio::test]
async fn net_saving_on_messages_agrees_with_the_providers_log() {
    net_saving_agrees_with_the_providers_log(Client::Claude).await;
}

/// Live accounting against the provider's own count, in every format: thirty requests
/// of an agent through abridge (structured, 3,000 tokens), the checkpoint changing
/// several times, against a provider that counts ⌈bytes/4⌉ + 4 per item (not abridge's
/// estimate), and one that counts 30 % more. What abridge says the clients sent is
/// within 2 % of what the provider counts for the same bodies sent straight to it, and
/// what it says was saved within 5 %. (Where the checkpoint changes, what the client
/// appended is abridge's estimate, scaled by the ratio its history's turns taught,
/// weighed by their size: a Responses turn alternates long code-heavy tool output with
/// short prose, which the provider counts at different rates.)
#[tokio::test]
async fn live_accounting_agrees_with_the_providers_count_in_every_format() {
    for client in [Client::Chat, Client::Codex, Client::Claude] {
        for scale in [1.0, SCALE] {
            let provider = FakeProvider::start(Behavior {
                token_scale: scale,
                ..Behavior::default()
            })
            .await
            .unwrap();
            let config = compacting(&provider.url(), Strategy::Structured, 3000);
            let proxy = Proxy::start_with(config).await;
            let (sent, path, headers) = turns(client, &proxy, 15).await;
            assert_eq!(sent.len(), 30);
            let all = provider.reports().iter().filter(|r| !is_summary(r)).count() as u64;
            assert!(
                eventually(Duration::from_secs(10), || proxy.stats().usage_reports
                    == all)
                .await
            );
            let stats = proxy.stats();
            assert!(stats.checkpoints_applied >= 10, "{client:?}: {stats:?}");
            let direct = direct_cost(path, &sent, &headers, scale).await.tokens;
            let saved = direct - stats.prompt_tokens_reported;
            let off = |a: u64, b: u64| (a as f64 - b as f64) / b as f64;
            let (sent_off, saved_off) = (
                off(stats.client_prompt_tokens, direct),
                off(stats.tokens_saved, saved),
            );
            let said = format!(
                "{client:?} ×{scale}: clients sent {direct} as the provider counts, abridge says {} ({:+.2} %); saved {saved}, abridge says {} ({:+.2} %)",
                stats.client_prompt_tokens,
                sent_off * 100.0,
                stats.tokens_saved,
                saved_off * 100.0
            );
            assert!(sent_off.abs() < 0.02 && saved_off.abs() < 0.05, "{said}");
        }
    }
}
