//! Abuse through the request path, in process: tenants told apart whatever header
//! carries their key, summaries paid only for accepted credentials and within their
//! rate, controls an operator refuses, absurd usage reports, decompression bombs.
//! (The release binary under faults and load is `tests/it/faults.rs`.)

use std::time::Duration;

use abridge::config::{Anonymous, Config};
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider, is_summary_request};
use serde_json::{Value, json};

use crate::common::agent::Answer;
use crate::common::{Proxy, client, config_for};

/// A conversation long enough to compact: system, four user turns with answers, a
/// final user message.
fn history() -> String {
    history_of(60)
}

/// [`history`] with `words` words of padding per message.
fn history_of(words: usize) -> String {
    let mut m = vec![json!({"role": "system", "content": "You are terse."})];
    for i in 0..4 {
        m.push(json!({"role": "user", "content": format!("Question {i}: what is in src/file_{i}.rs? {}", "context ".repeat(words))}));
        m.push(json!({"role": "assistant", "content": format!("Answer {i}: it holds parse_{i}. {}", "detail ".repeat(words))}));
    }
    m.push(json!({"role": "user", "content": "And now?"}));
    json!({"model": "fake-model", "messages": m}).to_string()
}

async fn post(proxy: &Proxy, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

fn config(url: &str) -> Config {
    let mut config = config_for(url);
    config.compaction.threshold_tokens = 3000;
    config.compaction.background = false;
    config
}

fn summaries(provider: &FakeProvider) -> Vec<fake_provider::Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| {
            r.json()["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .collect()
}

/// Pairs of tenants that send identical histories, each credential style: nothing of
/// one is ever visible to the other (conversation key, checkpoint, report).
#[tokio::test]
async fn tenants_never_share_state_whatever_header_carries_their_key() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url())).await;
    let body = history();
    let styles: [(&str, &str, &str); 5] = [
        ("authorization", "Bearer sk-alpha", "Bearer sk-beta"),
        ("x-api-key", "sk-ant-alpha", "sk-ant-beta"),
        ("api-key", "azure-alpha", "azure-beta"),
        ("x-goog-api-key", "goog-alpha", "goog-beta"),
        // The same value in two headers is two tenants.
        ("x-api-key", "same-value", "same-value-but-bearer"),
    ];
    let mut seen = std::collections::HashSet::new();
    for (header, a, b) in styles {
        let b_headers: Vec<(&str, &str)> = if b == "same-value-but-bearer" {
            vec![("authorization", "same-value")]
        } else {
            vec![(header, b)]
        };
        // A compacts (forced) and stores a checkpoint for exactly this history.
        let first = post(
            &proxy,
            &[(header, a), ("x-abridge-compact", "force")],
            &body,
        )
        .await;
        assert_eq!(first.status, 200);
        assert!(first.compacted(), "{header}: {:?}", first.headers);
        let again = post(&proxy, &[(header, a)], &body).await;
        assert!(
            again.compacted(),
            "{header}: A's own checkpoint applies to A"
        );
        // B sends the identical history: a conversation of its own, nothing applied.
        let other = post(&proxy, &b_headers, &body).await;
        assert_eq!(other.status, 200);
        assert!(!other.compacted(), "{header}: B got A's checkpoint");
        let (ka, kb) = (
            first.header("x-abridge-conversation").unwrap(),
            other.header("x-abridge-conversation").unwrap(),
        );
        assert_ne!(ka, kb, "{header}");
        assert!(seen.insert(ka) && seen.insert(kb), "keys are never reused");
    }
}

#[tokio::test]
async fn requests_without_a_credential_share_one_namespace_or_get_no_state() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let body = history();
    // shared (the default): a local single-user provider's clients are one tenant.
    let proxy = Proxy::start_with(config(&provider.url())).await;
    let first = post(&proxy, &[("x-abridge-compact", "force")], &body).await;
    assert!(first.compacted());
    let second = post(&proxy, &[], &body).await;
    assert_eq!(
        second.header("x-abridge-conversation"),
        first.header("x-abridge-conversation")
    );
    // A `Connection` header naming the credential removes it before the provider sees
    // it, and so from the tenant too: the request is anonymous, not the key's.
    let hop = post(
        &proxy,
        &[
            ("authorization", "Bearer sk-alpha"),
            ("connection", "authorization"),
        ],
        &body,
    )
    .await;
    assert_eq!(
        hop.header("x-abridge-conversation"),
        first.header("x-abridge-conversation")
    );
    assert!(
        provider
            .last_request()
            .unwrap()
            .headers
            .get("authorization")
            .is_none()
    );

    // none: no state at all, said so.
    let mut cfg = config(&provider.url());
    cfg.identity.anonymous = Anonymous::None;
    let proxy = Proxy::start_with(cfg).await;
    let answer = post(&proxy, &[("x-abridge-compact", "force")], &body).await;
    assert_eq!(answer.status, 200);
    assert!(!answer.compacted());
    assert!(answer.header("x-abridge-conversation").is_none());
    assert!(
        answer
            .header("x-abridge-note")
            .unwrap()
            .contains("identity.anonymous")
    );
    // With a credential, state as usual.
    let keyed = post(
        &proxy,
        &[("x-api-key", "k1"), ("x-abridge-compact", "force")],
        &body,
    )
    .await;
    assert!(keyed.compacted());
}

/// With a separate summary provider (the operator's key), a client the main provider
/// rejects never gets a summary made; an accepted one does, with the operator's model,
/// and only as often as its rate allows.
#[tokio::test]
async fn summaries_are_paid_only_for_accepted_credentials_within_their_rate() {
    let provider = FakeProvider::start(Behavior {
        faults: fake_provider::faults::Faults {
            api_keys: vec!["sk-good".to_owned()],
            ..Default::default()
        },
        ..Behavior::default()
    })
    .await
    .unwrap();
    let cheap = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url());
    cfg.compaction.strategy = Strategy::Structured;
    cfg.summary.upstream = Some(cheap.url().parse().unwrap());
    cfg.summary.model = "operator-model".to_owned();
    cfg.summary.max_per_tenant_per_minute = 1;
    cfg.compaction.threshold_tokens = 50_000;
    let proxy = Proxy::start_with(cfg).await;
    // Big enough that half of it (a forced compaction's budget) holds a summary.
    let body = history_of(400);
    let force = ("x-abridge-compact", "force");

    for bad in [
        vec![force],
        vec![force, ("authorization", "Bearer sk-wrong")],
        vec![force, ("x-api-key", "sk-wrong")],
    ] {
        let answer = post(&proxy, &bad, &body).await;
        assert_eq!(answer.status, 401, "the provider's own answer");
        assert_eq!(
            answer.header("x-abridge-strategy").as_deref(),
            Some("recency")
        );
        assert!(
            answer
                .header("x-abridge-note")
                .unwrap()
                .contains("accepted this request's credential"),
            "{:?}",
            answer.header("x-abridge-note")
        );
    }
    assert!(
        summaries(&cheap).is_empty(),
        "nothing spent on rejected clients"
    );

    // The first request of a good key is forwarded (recency: not yet accepted); the
    // provider's 2xx accepts it; the next forced compaction is a summary.
    let good = ("authorization", "Bearer sk-good");
    assert_eq!(post(&proxy, &[good], &body).await.status, 200);
    let mut longer: Value = serde_json::from_str(&body).unwrap();
    let push = |v: &mut Value, text: &str| {
        v["messages"].as_array_mut().unwrap().extend([
            json!({"role": "assistant", "content": "Noted."}),
            json!({"role": "user", "content": text}),
        ]);
    };
    push(&mut longer, "One more step.");
    let answer = post(&proxy, &[good, force], &longer.to_string()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-abridge-strategy").as_deref(),
        Some("structured"),
        "{:?}",
        answer.header("x-abridge-note")
    );
    let made = summaries(&cheap);
    assert_eq!(made.len(), 1);
    assert_eq!(
        made[0].json()["model"],
        "operator-model",
        "never the client's model"
    );
    // Its rate (one a minute) is spent: the next is recency, and says why.
    push(&mut longer, "And another.");
    let answer = post(&proxy, &[good, force], &longer.to_string()).await;
    assert_eq!(
        answer.header("x-abridge-strategy").as_deref(),
        Some("recency"),
        "{:?} {:?}",
        answer.header("x-abridge-note"),
        answer.header("x-abridge-messages-replaced")
    );
    assert!(
        answer
            .header("x-abridge-note")
            .unwrap()
            .contains("max_per_tenant_per_minute")
    );
    assert_eq!(summaries(&cheap).len(), 1);
    assert!(proxy.stats().summary_refused >= 4);
}

#[tokio::test]
async fn an_operator_can_refuse_clients_force_and_their_choice_of_strategy() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url());
    cfg.compaction.client_force = false;
    cfg.compaction.client_strategy = false;
    let proxy = Proxy::start_with(cfg).await;
    let answer = post(
        &proxy,
        &[
            ("authorization", "Bearer sk-x"),
            ("x-abridge-compact", "force"),
            ("x-abridge-strategy", "structured"),
        ],
        &history(),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert!(!answer.compacted(), "force ignored: under the threshold");
    let note = answer.header("x-abridge-note").unwrap();
    assert!(
        note.contains("client_force") && note.contains("client_strategy"),
        "{note}"
    );
    assert_eq!(summaries(&provider).len(), 0);
}

/// A provider reporting an absurd prompt size: the prediction saturates instead of
/// wrapping to a small number, so the conversation is still compacted.
#[tokio::test]
async fn absurd_usage_reports_saturate_and_never_switch_compaction_off() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(config(&provider.url())).await;
    let mut body: Value = serde_json::from_str(&history()).unwrap();
    let huge = (u64::MAX - 5).to_string();
    let first = post(
        &proxy,
        &[
            ("authorization", "Bearer sk-x"),
            ("x-fake-prompt-tokens", &huge),
        ],
        &body.to_string(),
    )
    .await;
    assert_eq!(first.status, 200);
    body["messages"].as_array_mut().unwrap().extend([
        first.body["choices"][0]["message"].clone(),
        json!({"role": "user", "content": "Next question, please."}),
    ]);
    // Wait for the usage record (written after the response).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = post(
        &proxy,
        &[("authorization", "Bearer sk-x")],
        &body.to_string(),
    )
    .await;
    assert_eq!(second.status, 200);
    assert!(second.compacted(), "{:?}", second.header("x-abridge-note"));
}

/// A provider's gzip bomb: abridge decodes at most `limits.max_decoded_bytes` and cuts
/// the response, instead of inflating it whole.
#[tokio::test]
async fn a_decompression_bomb_is_cut_at_the_limit() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url());
    cfg.limits.max_decoded_bytes = 1024 * 1024;
    let proxy = Proxy::start_with(cfg).await;
    let sent = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-gzip-bomb", (64 * 1024 * 1024).to_string())
        .body(history())
        .send()
        .await;
    // The client gets an honest error: the connection fails before the head (the very
    // first frame is over the limit) or the body ends early. Never the 64 MB.
    let mut received = 0usize;
    if let Ok(mut response) = sent {
        let outcome = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => received += chunk.len(),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        assert!(outcome.is_err(), "the client sees an incomplete body");
    }
    assert!(received <= 1024 * 1024, "{received} bytes decoded");
    assert!(proxy.stats().upstream_errors >= 1);
}

/// A provider that does not know `stream_options` (Azure's older API versions): the
/// request abridge added it to is retried with the client's own bytes, and this
/// provider is not sent it again. Directly, the same request streams fine; through
/// abridge it must too.
#[tokio::test]
async fn a_provider_refusing_what_abridge_adds_gets_the_clients_own_request() {
    let provider = FakeProvider::start(Behavior {
        faults: fake_provider::faults::Faults {
            reject_stream_options: true,
            ..Default::default()
        },
        ..Behavior::default()
    })
    .await
    .unwrap();
    let proxy = Proxy::start_with(config(&provider.url())).await;
    let body = crate::common::chat_body(true);
    for round in 0..2 {
        let before = provider.requests().len();
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-azure")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "round {round}");
        let text = response.text().await.unwrap();
        assert!(text.contains("data: [DONE]"), "{text}");
        let sent = &provider.requests()[before..];
        let expected = if round == 0 { 2 } else { 1 };
        assert_eq!(sent.len(), expected, "round {round}");
        assert_eq!(
            sent.last().unwrap().body,
            body.as_bytes(),
            "the client's own bytes"
        );
    }
    let stats = proxy.stats();
    assert_eq!(stats.usage_option_refused, 1);
    assert_eq!(stats.usage_not_asked, 2);
}

/// Every strategy through the request path with the CPU pool at its smallest (one
/// permit): a strategy that took the pool's permit twice would hang here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_strategy_completes_with_a_cpu_pool_of_one() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider.url());
    cfg.compaction.cpu_concurrency = 1;
    let proxy = Proxy::start_with(cfg).await;
    // The first request of the key is answered before summaries may be made for it.
    post(&proxy, &[("authorization", "Bearer sk-pool")], &history()).await;
    for strategy in ["deterministic", "recency", "structured", "llm_replace"] {
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            post(
                &proxy,
                &[
                    ("authorization", "Bearer sk-pool"),
                    ("x-abridge-compact", "force"),
                    ("x-abridge-strategy", strategy),
                    // A conversation of its own for each.
                    ("x-abridge-conversation", strategy),
                ],
                &history_of(300),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{strategy} hung"));
        assert_eq!(answer.status, 200, "{strategy}");
        assert!(answer.compacted(), "{strategy}");
        assert_eq!(
            answer.header("x-abridge-strategy").as_deref(),
            Some(strategy),
            "{:?}",
            answer.header("x-abridge-note")
        );
    }
}
