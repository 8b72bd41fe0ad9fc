//! Context windows learned from the provider: a model abridge does not know, served with
//! a small window by each family users put behind abridge, in abridge's default
//! configuration — a conversation growing to four times the window gets 200 on every
//! request with at most one overflow at the provider in all; a restart with Redis, and
//! another replica, know the window without one; a configured window wins; a server
//! that can say its window (llama-server, vLLM, Ollama) is asked and never overflows;
//! an overflow reported inside a 200 stream is compacted and retried in every format;
//! and no request of one tenant changes the window another tenant is compacted to.

use abridge::config::Config;
use abridge::secret::Secret;
use fake_provider::overflow::Family;
use fake_provider::{Behavior, FakeProvider, count_tokens};
use serde_json::{Value, json};

use crate::common::agent::{idle, main_requests};
use crate::common::redis::RedisServer;
use crate::common::{Proxy, client, config_for};

const WINDOW: u64 = 4096;
const ADMIN_TOKEN: &str = "k7Qm2vXp9Lr4Tz8Wn3Ys6Bd1Hf5Gj0Ca";

/// The fake provider serving `fake-model` with [`WINDOW`] tokens, answering overflows
/// like `family`.
async fn provider(family: Family) -> FakeProvider {
    FakeProvider::start(Behavior {
        context_window: Some(WINDOW),
        overflow: family,
        ..Behavior::default()
    })
    .await
    .unwrap()
}

/// abridge's defaults, but for the upstream (and a store when given).
fn config(provider: &FakeProvider, redis: Option<&RedisServer>) -> Config {
    let mut cfg = config_for(&provider.url());
    if let Some(redis) = redis {
        cfg.store.redis_url = Some(Secret::new(redis.url()));
    }
    cfg
}

/// Requests the provider refused for their size: main requests over the window.
fn overflows(provider: &FakeProvider) -> usize {
    main_requests(provider)
        .iter()
        .filter(|r| {
            let body = r.json();
            count_tokens(body["messages"].as_array().unwrap()) > WINDOW
        })
        .count()
}

/// A conversation `k` grown turn by turn until its history is four windows long; every
/// answer must be a 200.
async fn grow(proxy: &Proxy, k: usize, family: Family) {
    let mut messages =
        vec![json!({"role": "system", "content": format!("You are assistant {k}.")})];
    let mut turn = 0;
    loop {
        turn += 1;
        messages.push(json!({"role": "user", "content": format!(
            "Turn {turn} of conversation {k}: {}",
            "the deployment notes say the rollout waits for the canary to stay healthy. ".repeat(12)
        )}));
        let answer = client()
            .post(proxy.url("/v1/chat/completions"))
            .bearer_auth("sk-windows")
            .json(&json!({"model": "fake-model", "messages": messages}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap();
        assert_eq!(status, 200, "{} turn {turn}: {body}", family.name());
        messages.push(body["choices"][0]["message"].clone());
        idle(proxy).await;
        if count_tokens(&messages) > 4 * WINDOW {
            break;
        }
    }
}

#[tokio::test]
async fn every_family_gets_its_window_learned_with_at_most_one_overflow() {
    for family in Family::ALL {
        let provider = provider(family).await;
        let proxy = Proxy::start_with(config(&provider, None)).await;
        grow(&proxy, 0, family).await;
        assert!(
            overflows(&provider) <= 1,
            "{}: {} overflows at the provider",
            family.name(),
            overflows(&provider)
        );
        assert!(proxy.stats().context_overflows <= 1);
        let learned = proxy.state.compactor().learned_windows();
        assert_eq!(learned.len(), 1, "{}: {learned:?}", family.name());
        // Where the family states its window, it is read exactly (Fireworks says one
        // short, and is read right); where not, abridge took less than it sent.
        let window = learned[0].learned.window;
        match family {
            Family::Ollama | Family::Groq => assert!(window < WINDOW + WINDOW / 4, "{window}"),
            _ => assert_eq!(window, WINDOW, "{}", family.name()),
        }
        assert_eq!(learned[0].model, "fake-model");
    }
}

#[tokio::test]
async fn a_restart_and_another_replica_know_the_window_without_an_overflow() {
    let redis = RedisServer::start();
    // A hosted API's overflow (it cannot be asked for its window).
    let provider = provider(Family::OpenAi).await;
    let mut cfg = config(&provider, Some(&redis));
    cfg.admin.token = Some(Secret::new(ADMIN_TOKEN));
    let first = Proxy::start_with(cfg.clone()).await;
    let other = Proxy::start_with(cfg.clone()).await;
    grow(&first, 0, Family::OpenAi).await;
    assert_eq!(overflows(&provider), 1);

    // The other replica reads it at its next refresh (here, now).
    other.state.compactor().refresh_windows().await;
    grow(&other, 1, Family::OpenAi).await;
    assert_eq!(overflows(&provider), 1, "the other replica knew");

    // A restarted abridge reads it at start.
    first.shutdown().await.unwrap();
    let restarted = Proxy::start_with(cfg).await;
    crate::common::eventually(std::time::Duration::from_secs(10), || {
        !restarted.state.compactor().learned_windows().is_empty()
    })
    .await;
    grow(&restarted, 2, Family::OpenAi).await;
    assert_eq!(overflows(&provider), 1, "the restart knew");

    // `/admin/stats` lists it, and where it came from.
    let stats = restarted.admin_json("/admin/stats", ADMIN_TOKEN).await;
    let learned = &stats["learned_windows"][0];
    assert_eq!(learned["window"], WINDOW, "{stats}");
    assert_eq!(learned["source"], "overflow");
    assert_eq!(learned["model"], "fake-model");
}

#[tokio::test]
async fn a_configured_window_always_wins() {
    let provider = provider(Family::OpenAi).await;
    let mut cfg = config(&provider, None);
    cfg.compaction
        .context_windows
        .insert("fake-model".to_owned(), 3000);
    let proxy = Proxy::start_with(cfg).await;
    grow(&proxy, 0, Family::OpenAi).await;
    assert_eq!(
        overflows(&provider),
        0,
        "compacted for the configured 3,000"
    );
    assert!(proxy.state.compactor().learned_windows().is_empty());
    assert_eq!(
        proxy
            .state
            .compactor()
            .window(abridge::headers::Provider::Main, "fake-model", None),
        3000
    );
}

/// The three wire formats, streamed, for [`grow_streamed`].
#[derive(Debug, Clone, Copy)]
enum Streamed {
    Chat(Family),
    Responses,
    Messages,
}

impl Streamed {
    fn path(self) -> &'static str {
        match self {
            Streamed::Chat(_) => "/v1/chat/completions",
            Streamed::Responses => "/v1/responses",
            Streamed::Messages => "/v1/messages",
        }
    }

    fn body(self, history: &[Value], stream: bool) -> Value {
        match self {
            Streamed::Chat(_) => {
                json!({"model": "fake-model", "messages": history, "stream": stream})
            }
            Streamed::Responses => {
                json!({"model": "fake-model", "input": history, "stream": stream})
            }
            Streamed::Messages => {
                json!({"model": "fake-model", "max_tokens": 256, "messages": history, "stream": stream})
            }
        }
    }

    fn tokens(self, body: &Value) -> u64 {
        match self {
            Streamed::Chat(_) => count_tokens(body["messages"].as_array().unwrap()),
            Streamed::Responses => fake_provider::count_response_tokens(body),
            Streamed::Messages => fake_provider::count_message_tokens(body),
        }
    }

    /// The stream ended as a complete answer, and nothing of an overflow reached the
    /// client.
    fn complete(self, stream: &str) -> bool {
        match self {
            Streamed::Chat(_) => stream.ends_with("data: [DONE]\n\n") && !stream.contains("error"),
            Streamed::Responses => {
                stream.contains("event: response.completed") && !stream.contains("response.failed")
            }
            Streamed::Messages => {
                stream.contains("event: message_stop") && !stream.contains("event: error")
            }
        }
    }
}

/// [`grow`], streamed in `format`, against a provider that reports overflows inside a 200
/// stream; the provider's overflows.
async fn grow_streamed(format: Streamed) -> usize {
    grow_in(format, true).await
}

/// [`grow_streamed`], or — `streamed` false — whole, the overflows answered 400.
async fn grow_in(format: Streamed, streamed: bool) -> usize {
    let family = match format {
        Streamed::Chat(family) => family,
        _ => Family::OpenAi,
    };
    let provider = FakeProvider::start(Behavior {
        context_window: Some(WINDOW),
        overflow: family,
        overflow_in_stream: streamed,
        // Asked, llama-server would say its window before any overflow.
        window_endpoints: false,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let proxy = Proxy::start_with(config(&provider, None)).await;
    let mut history: Vec<Value> = Vec::new();
    let mut retried = 0;
    for turn in 1.. {
        history.push(json!({"role": "user", "content": format!(
            "Turn {turn}: {}",
            "the deployment notes say the rollout waits for the canary to stay healthy. ".repeat(12)
        )}));
        let answer = client()
            .post(proxy.url(format.path()))
            .bearer_auth("sk-windows")
            .header("x-api-key", "sk-ant-windows")
            .header("anthropic-version", "2023-06-01")
            .json(&format.body(&history, streamed))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{format:?} turn {turn}");
        let note = answer
            .headers()
            .get("x-abridge-note")
            .map(|v| v.to_str().unwrap().to_owned());
        retried += usize::from(note.is_some_and(|n| n.contains("compacted and retried")));
        let stream = answer.text().await.unwrap();
        if streamed {
            assert!(format.complete(&stream), "{format:?} turn {turn}: {stream}");
        }
        history.push(json!({"role": "assistant", "content": "Noted; the canary stays."}));
        idle(&proxy).await;
        if format.tokens(&format.body(&history, streamed)) > 4 * WINDOW {
            break;
        }
    }
    let overflows = provider
        .requests()
        .iter()
        .filter(|r| r.uri.path() == format.path() && format.tokens(&r.json()) > WINDOW)
        .count();
    assert_eq!(retried, overflows, "{format:?}: every overflow was retried");
    assert_eq!(proxy.stats().context_overflows, overflows as u64);
    assert_eq!(
        proxy.state.compactor().learned_windows().len(),
        1,
        "{format:?}"
    );
    overflows
}

#[tokio::test]
async fn an_overflow_reported_inside_a_stream_is_compacted_and_retried_in_every_format() {
    for format in [
        Streamed::Chat(Family::LmStudio),
        Streamed::Chat(Family::LlamaServer),
        Streamed::Chat(Family::OpenAi),
        Streamed::Responses,
        Streamed::Messages,
    ] {
        let overflows = grow_streamed(format).await;
        assert_eq!(
            overflows, 1,
            "{format:?}: one overflow, then the window is known"
        );
    }
}

#[tokio::test]
async fn a_server_that_can_say_its_window_is_asked_and_never_overflows() {
    for family in [Family::LlamaServer, Family::VllmFlat, Family::Ollama] {
        let provider = provider(family).await;
        let proxy = Proxy::start_with(config(&provider, None)).await;
        grow(&proxy, 0, family).await;
        assert_eq!(overflows(&provider), 0, "{}", family.name());
        let learned = proxy.state.compactor().learned_windows();
        assert_eq!(learned.len(), 1, "{}: {learned:?}", family.name());
        assert_eq!(learned[0].learned.window, WINDOW, "{}", family.name());
        assert_eq!(learned[0].learned.source, abridge::windows::Source::Asked);
        // Asked once, whatever the number of requests.
        let asks = provider.asks().len();
        assert!((1..=3).contains(&asks), "{}: {asks} asks", family.name());
    }
    // A server that answers none of them teaches nothing by asking.
    let provider = provider(Family::OpenAi).await;
    let proxy = Proxy::start_with(config(&provider, None)).await;
    grow(&proxy, 0, Family::OpenAi).await;
    let learned = proxy.state.compactor().learned_windows();
    assert_eq!(
        learned[0].learned.source,
        abridge::windows::Source::Overflow
    );
}

#[tokio::test]
async fn responses_and_messages_whole_learn_the_window_from_one_overflow() {
    for format in [Streamed::Responses, Streamed::Messages] {
        let overflows = grow_in(format, false).await;
        assert_eq!(
            overflows, 1,
            "{format:?}: one overflow, then the window is known"
        );
    }
}

/// One tenant's conversation of `n` messages, sent once: whether abridge compacted it.
async fn compacted(proxy: &Proxy, key: &str, n: usize) -> bool {
    let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant."})];
    for i in 0..n {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!(
            "Message {i}: the deployment notes say the rollout waits for the canary. {}",
            "More detail about the rollout plan and its checks. ".repeat(8)
        )}));
    }
    let answer = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "fake-model", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{key}");
    answer.headers()["x-abridge-compacted"] == "true"
}

#[tokio::test]
async fn one_tenant_never_changes_the_window_another_is_compacted_to() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut cfg = config(&provider, Some(&redis));
    cfg.admin.token = Some(Secret::new(ADMIN_TOKEN));
    let proxy = Proxy::start_with(cfg).await;
    // A 62-message conversation of another tenant (~7,000 tokens): far under the
    // default window, never compacted.
    assert!(!compacted(&proxy, "sk-good", 61).await);

    // 1. A provider's invalid-value error quoting the client's own words back.
    let quoted = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth("sk-evil")
        .json(&json!({"model": "fake-model", "messages": [
            {"role": "user", "content": "hello"},
            {"role": "This model's maximum context length is 2000 tokens", "content": "x"},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(quoted.status(), 400);
    let text = quoted.text().await.unwrap();
    assert!(text.contains("maximum context length is 2000"), "{text}");
    // 2. A bare 413 (a gateway's byte limit: no credential needed).
    let bare = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth("sk-evil")
        .header("x-fake-status", "413")
        .json(&json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 413);
    assert!(
        proxy.state.compactor().learned_windows().is_empty(),
        "nothing learned from either: {:?}",
        proxy.state.compactor().learned_windows()
    );

    // 3. A real overflow stated by the provider for this tenant's requests (its own
    //    plan, say): learned for that tenant alone.
    let own = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth("sk-evil")
        .header("x-fake-window", "2100")
        .json(&json!({"model": "fake-model", "messages": [
            {"role": "user", "content": "the rollout plan and its checks ".repeat(400)},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        own.status(),
        400,
        "one message cannot be compacted: the overflow is relayed"
    );
    let learned = proxy.state.compactor().learned_windows();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert!(learned[0].tenant.is_some(), "the tenant's own: {learned:?}");
    assert_eq!(learned[0].learned.window, 2100);

    // The other tenant's conversations are compacted to what they were before.
    assert!(!compacted(&proxy, "sk-good", 61).await);
    assert!(!compacted(&proxy, "sk-newcomer", 61).await);
    // The tenant that overflowed is compacted to its own window.
    assert!(compacted(&proxy, "sk-evil", 61).await);

    // Kept in Redis with a TTL; an operator can forget it.
    let ttl: i64 = redis
        .command(&["PTTL", "abridge:windows"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl > 0, "the learned windows expire: PTTL {ttl}");
    let forgotten = client()
        .delete(format!(
            "http://{}/admin/windows?model=FAKE-MODEL",
            proxy.admin
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(forgotten.status(), 200);
    assert_eq!(forgotten.json::<Value>().await.unwrap()["forgotten"], 1);
    assert!(proxy.state.compactor().learned_windows().is_empty());
    assert_eq!(redis.command(&["HLEN", "abridge:windows"]).unwrap(), "0");
}
