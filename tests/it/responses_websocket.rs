//! The Responses WebSocket Codex CLI opens first on its built-in `openai` provider.
//! Where the upstream has it (`native`), abridge relays it: the handshake goes to the
//! provider first, frames pass both ways, each `response.create` is compacted as a POST
//! body would be and its usage recorded; at shutdown a session is closed going away
//! (`1001`) once its answer in flight, if any, has ended or the grace is over. Elsewhere
//! (`serve`) the handshake is answered at once with the 426 Codex falls back to HTTPS
//! from without retrying, and nothing reaches the provider.

use std::time::{Duration, Instant};

use abridge::config::{Config, ProviderCompaction};
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, client_async};

use crate::common::{Proxy, client, compacting, config_for, eventually};

type Ws = WebSocketStream<TcpStream>;

/// A WebSocket handshake as Codex sends it (tungstenite), on a fresh connection: the
/// status line and body of the answer.
async fn handshake(proxy: &Proxy, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Authorization: Bearer sk-codex\r\nOpenAI-Beta: responses_websockets=2026-02-06\r\n\r\n",
        proxy.addr
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the head and a body of the length it announces are in.
    loop {
        let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .expect("answered at once")
            .unwrap();
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|l| l.trim().parse::<usize>().ok());
            if n == 0 || length.is_some_and(|l| body.len() >= l) {
                return (head.lines().next().unwrap().to_owned(), body.to_owned());
            }
        }
        assert!(n > 0, "closed before an answer: {text}");
    }
}

/// A fake provider with the Responses WebSocket, and optionally a key list.
async fn provider_with_websocket(keys: &[&str]) -> FakeProvider {
    let mut behavior = Behavior {
        responses_websocket: true,
        ..Behavior::default()
    };
    behavior.faults.api_keys = keys.iter().map(|k| (*k).to_owned()).collect();
    FakeProvider::start(behavior).await.unwrap()
}

fn native(mut config: Config) -> Config {
    config.provider_apis.responses_compaction = ProviderCompaction::Native;
    config
}

/// Opens a WebSocket to abridge's `/v1/responses` as Codex does, with `key` and `extra`
/// headers.
async fn open(
    proxy: &Proxy,
    key: &str,
    extra: &[(&'static str, &'static str)],
) -> Result<(Ws, http::Response<Option<Vec<u8>>>), WsError> {
    let mut request = format!("ws://{}/v1/responses", proxy.addr)
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
    headers.insert(
        "openai-beta",
        "responses_websockets=2026-02-06".parse().unwrap(),
    );
    for (name, value) in extra {
        headers.insert(*name, value.parse().unwrap());
    }
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    client_async(request, tcp).await
}

/// Sends `body` as a `response.create` frame; the events answered, up to the terminal one.
async fn create(ws: &mut Ws, body: &Value) -> Vec<Value> {
    send_create(ws, body).await;
    answer(ws, Vec::new()).await
}

/// Sends `body` as a `response.create` frame.
async fn send_create(ws: &mut Ws, body: &Value) {
    let mut frame = body.clone();
    frame["type"] = json!("response.create");
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

/// `events` of an answer, and those that follow, up to the terminal one.
async fn answer(ws: &mut Ws, mut events: Vec<Value>) -> Vec<Value> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an event in time")
            .expect("the connection stays open")
            .unwrap();
        let Message::Text(text) = message else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        let done = matches!(
            event["type"].as_str(),
            Some("response.completed" | "response.failed" | "error")
        );
        events.push(event);
        if done {
            return events;
        }
    }
}

/// The `response.create` frames the provider received, as JSON.
fn frames(provider: &FakeProvider) -> Vec<Value> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::GET && !r.body.is_empty())
        .map(|r| r.json())
        .collect()
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

fn request(input: &[Value]) -> Value {
    json!({"model": "fake-model", "input": input, "store": false, "stream": true,
        "instructions": "You are a careful coding agent."})
}

/// The completed response's id and output items.
fn completed(events: &[Value]) -> (String, Vec<Value>) {
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{events:?}");
    assert_eq!(events[0]["type"], "response.created");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "response.output_text.delta"),
        "{events:?}"
    );
    let response = &last["response"];
    (
        response["id"].as_str().unwrap().to_owned(),
        response["output"].as_array().unwrap().clone(),
    )
}

#[tokio::test]
async fn serve_mode_answers_426_at_once_and_forwards_nothing() {
    let provider = provider_with_websocket(&[]).await;
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    let proxy = Proxy::start_with(config).await;
    for path in ["/v1/responses", "/openai/v1/responses"] {
        let started = Instant::now();
        let (status, body) = handshake(&proxy, path).await;
        assert!(started.elapsed() < Duration::from_millis(500), "{path}");
        assert_eq!(status, "HTTP/1.1 426 Upgrade Required", "{path}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("HTTP"),
            "{body}"
        );
    }
    assert!(
        provider.requests().is_empty(),
        "nothing forwarded: {:?}",
        provider.requests()
    );

    // A plain GET on the same path still passes through to the provider.
    let answer = client()
        .get(proxy.url("/v1/responses"))
        .send()
        .await
        .unwrap();
    assert_ne!(answer.status(), 426);
    assert_eq!(provider.last_request().unwrap().uri.path(), "/v1/responses");
}

#[tokio::test]
async fn native_relays_a_conversation_over_one_connection() {
    let provider = provider_with_websocket(&[]).await;
    let proxy = Proxy::start_with(native(config_for(&provider.url()))).await;
    let extra = [("session_id", "thread-1"), ("x-abridge-compact", "off")];
    let (mut ws, answer) = open(&proxy, "sk-codex", &extra).await.unwrap();
    assert_eq!(answer.status(), 101);
    // The provider's own handshake headers reach the client (Codex reads them).
    assert_eq!(answer.headers()["x-models-etag"], "fake-etag");

    let mut input = vec![user("Say hello.")];
    let (_, output) = completed(&create(&mut ws, &request(&input)).await);
    input.extend(output);
    input.push(user("And once more."));
    let (second, _) = completed(&create(&mut ws, &request(&input)).await);
    // Codex on a reused connection: only what is new, after the previous response.
    let mut incremental = request(&[user("A third time.")]);
    incremental["previous_response_id"] = json!(second);
    completed(&create(&mut ws, &incremental).await);
    // Another frame type passes through; the connection goes on.
    ws.send(Message::text(
        json!({"type": "response.processed", "response_id": second}).to_string(),
    ))
    .await
    .unwrap();
    completed(&create(&mut ws, &request(&[user("Fresh.")])).await);
    ws.close(None).await.unwrap();

    let sent = frames(&provider);
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!(sent[1]["input"].as_array().unwrap().len(), input.len());
    assert_eq!(sent[2]["previous_response_id"], json!(second));
    assert_eq!(sent[2]["input"].as_array().unwrap().len(), 1, "untouched");
    assert_eq!(sent[2]["type"], "response.create");
    let handshakes: Vec<_> = provider
        .requests()
        .into_iter()
        .filter(|r| r.body.is_empty())
        .collect();
    assert_eq!(handshakes.len(), 1, "one upstream connection");
    let headers = &handshakes[0].headers;
    assert_eq!(headers["authorization"], "Bearer sk-codex");
    assert_eq!(headers["openai-beta"], "responses_websockets=2026-02-06");
    assert_eq!(headers["session_id"], "thread-1");
    assert!(!headers.contains_key("x-abridge-compact"));
    assert_eq!(handshakes[0].uri.path(), "/v1/responses");
    assert!(
        eventually(Duration::from_secs(5), || proxy.stats().usage_reports == 4).await,
        "every answer's usage read: {}",
        proxy.stats().usage_reports
    );
}

#[tokio::test]
async fn a_long_conversation_over_websocket_is_compacted_and_its_usage_recorded() {
    let provider = provider_with_websocket(&[]).await;
    let mut config = native(compacting(&provider.url(), Strategy::Recency, 3000));
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let (mut ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    let mut input = vec![json!({"type": "message", "role": "developer", "content": [
        {"type": "input_text", "text": "<permissions>sandbox: workspace-write</permissions>"}]})];
    let mut lengths = Vec::new();
    for n in 0..14 {
        input.push(user(&format!(
            "Step {n}: open src/module_{n}.rs and fix check {n}. {}",
            "The build must stay green and the change small. ".repeat(25)
        )));
        lengths.push(input.len());
        let (_, output) = completed(&create(&mut ws, &request(&input)).await);
        input.extend(output);
    }
    ws.close(None).await.unwrap();

    let sent = frames(&provider);
    assert_eq!(sent.len(), lengths.len());
    let shorter = sent
        .iter()
        .zip(&lengths)
        .filter(|(frame, len)| frame["input"].as_array().unwrap().len() < **len)
        .count();
    assert!(shorter > 0, "some frame went compacted");
    let last = sent.last().unwrap();
    assert_eq!(last["type"], "response.create");
    assert_eq!(last["input"][0], input[0], "the head is kept");
    assert!(
        last.to_string().len()
            < request(&input[..*lengths.last().unwrap()])
                .to_string()
                .len(),
        "the last frame went smaller than sent"
    );
    assert!(
        eventually(Duration::from_secs(5), || proxy.stats().usage_reports == 14).await,
        "usage read: {}",
        proxy.stats().usage_reports
    );
    let stats = proxy.stats();
    assert!(stats.checkpoints_applied > 0);
    assert!(stats.prompt_tokens_reported_compacted > 0, "{stats:?}");
}

#[tokio::test]
async fn a_refused_client_never_gets_a_websocket() {
    let provider = provider_with_websocket(&["sk-good"]).await;
    let proxy = Proxy::start_with(native(config_for(&provider.url()))).await;
    // abridge's own refusal (an invalid control): nothing reaches the provider.
    match open(&proxy, "sk-good", &[("x-abridge-compact", "sometimes")]).await {
        Err(WsError::Http(answer)) => assert_eq!(answer.status(), 400),
        other => panic!("refused: {:?}", other.map(|(_, r)| r.status())),
    }
    assert!(provider.requests().is_empty(), "{:?}", provider.requests());
    // The provider's refusal of the credential is the client's answer.
    match open(&proxy, "sk-bad", &[]).await {
        Err(WsError::Http(answer)) => assert_eq!(answer.status(), 401),
        other => panic!("refused: {:?}", other.map(|(_, r)| r.status())),
    }
    assert!(frames(&provider).is_empty());
    let (mut ws, _) = open(&proxy, "sk-good", &[]).await.unwrap();
    completed(&create(&mut ws, &request(&[user("hi")])).await);
}

#[tokio::test]
async fn native_toward_a_server_without_the_websocket_answers_426_at_once() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(native(config_for(&provider.url()))).await;
    let started = Instant::now();
    let (status, _) = handshake(&proxy, "/v1/responses").await;
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(status, "HTTP/1.1 426 Upgrade Required");
    // It was asked: the provider's 404 is what says it has none.
    assert_eq!(provider.last_request().unwrap().uri.path(), "/v1/responses");
}

#[tokio::test]
async fn a_silent_session_is_closed_and_an_oversized_frame_refused() {
    let provider = provider_with_websocket(&[]).await;
    let mut config = native(config_for(&provider.url()));
    config.timeouts.stream_idle_ms = 300;
    config.limits.max_body_bytes = 64 * 1024;
    let proxy = Proxy::start_with(config).await;
    let (mut ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("closed within the idle deadline");
    assert!(
        matches!(next, Some(Ok(Message::Close(_))) | None | Some(Err(_))),
        "{next:?}"
    );

    let (mut ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    let big = request(&[user(&"x".repeat(100 * 1024))]);
    let mut frame = big;
    frame["type"] = json!("response.create");
    let _ = ws.send(Message::text(frame.to_string())).await;
    let next = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("ended at once");
    assert!(
        !matches!(next, Some(Ok(Message::Text(_)))),
        "no answer to an oversized frame: {next:?}"
    );
    assert!(frames(&provider).is_empty());
}

#[tokio::test]
async fn a_session_outlives_the_connection_deadlines_and_holds_its_place_under_the_cap() {
    let provider = provider_with_websocket(&[]).await;
    let mut config = native(config_for(&provider.url()));
    config.timeouts.client_header_ms = 200;
    config.timeouts.client_idle_ms = 200;
    config.limits.max_connections = 1;
    let proxy = Proxy::start_with(config).await;
    let (mut ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    completed(&create(&mut ws, &request(&[user("one")])).await);
    // Past the header and keep-alive deadlines of an HTTP connection, between frames.
    tokio::time::sleep(Duration::from_millis(700)).await;
    completed(&create(&mut ws, &request(&[user("two")])).await);
    // The session is a connection under `limits.max_connections`.
    let over = client().get(proxy.url("/v1/models")).send().await;
    assert!(
        over.is_err() || over.is_ok_and(|r| r.status() == 503),
        "over the cap"
    );
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn a_client_that_never_waits_for_answers_is_closed_at_the_bound() {
    let mut behavior = Behavior {
        responses_websocket: true,
        ..Behavior::default()
    };
    // The provider answers slowly: the frames pile up unanswered.
    behavior.latency = Duration::from_secs(20);
    let provider = FakeProvider::start(behavior).await.unwrap();
    let proxy = Proxy::start_with(native(config_for(&provider.url()))).await;
    let (mut ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    let mut frame = request(&[user("hello")]);
    frame["type"] = json!("response.create");
    for _ in 0..=abridge::websocket::MAX_IN_FLIGHT {
        if ws.send(Message::text(frame.to_string())).await.is_err() {
            break;
        }
    }
    let closed = loop {
        let next = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("closed well before the provider answers");
        match next {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("a close frame, not {other:?}"),
        }
    };
    let frame = closed.expect("a close frame with a code");
    assert_eq!(u16::from(frame.code), 1008, "{frame:?}");
    assert!(frame.reason.contains("unanswered"));
}

/// A relayed session in front of `behavior`'s provider, with `grace_ms` of shutdown grace.
async fn session_behind(behavior: Behavior, grace_ms: u64) -> (FakeProvider, Proxy, Ws) {
    let provider = FakeProvider::start(Behavior {
        responses_websocket: true,
        ..behavior
    })
    .await
    .unwrap();
    let mut config = native(config_for(&provider.url()));
    config.timeouts.shutdown_grace_ms = grace_ms;
    let proxy = Proxy::start_with(config).await;
    let (ws, _) = open(&proxy, "sk-codex", &[]).await.unwrap();
    (provider, proxy, ws)
}

/// The close frame that comes next (within 10 s), its code and reason; no other frame
/// may come first. Then read to the end, as a client does (which sends the reply that
/// completes the closing handshake).
async fn next_close(ws: &mut Ws) -> (u16, String) {
    let next = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("closed in time");
    let closed = match next {
        Some(Ok(Message::Close(Some(frame)))) => (u16::from(frame.code), frame.reason.to_string()),
        other => panic!("a close frame with a code, not {other:?}"),
    };
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = ws.next().await {}
    });
    end.await.expect("the connection ends after the close");
    closed
}

/// Shuts `proxy` down; its `run` must return within `within`.
fn shut_down(proxy: Proxy, within: Duration) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let started = Instant::now();
        tokio::time::timeout(within, proxy.shutdown())
            .await
            .expect("shutdown waits no longer than the grace")
            .unwrap();
        started.elapsed()
    })
}

#[tokio::test]
async fn at_shutdown_a_session_with_nothing_in_flight_is_closed_going_away_at_once() {
    let (_provider, proxy, mut ws) = session_behind(Behavior::default(), 30_000).await;
    completed(&create(&mut ws, &request(&[user("hello")])).await);
    let shutdown = shut_down(proxy, Duration::from_secs(10));
    let (code, reason) = next_close(&mut ws).await;
    assert_eq!(code, 1001, "{reason}");
    assert!(reason.contains("shutting down"), "{reason}");
    // Not the 30 s grace: nothing was in flight.
    assert!(shutdown.await.unwrap() < Duration::from_secs(10));
}

#[tokio::test]
async fn at_shutdown_the_answer_in_flight_is_relayed_whole_then_the_session_closed() {
    let behavior = Behavior {
        chunk_delay: Duration::from_millis(100),
        ..Behavior::default()
    };
    let (_provider, proxy, mut ws) = session_behind(behavior, 30_000).await;
    send_create(&mut ws, &request(&[user("hello")])).await;
    // The answer has begun: shutdown comes in the middle of it.
    let first = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
    let Ok(Some(Ok(Message::Text(first)))) = first else {
        panic!("the answer's first event: {first:?}");
    };
    let first = serde_json::from_str::<Value>(&first).unwrap();
    let shutdown = shut_down(proxy, Duration::from_secs(20));
    let events = answer(&mut ws, vec![first]).await;
    completed(&events);
    assert!(events.len() > 3, "shutdown came mid-answer: {events:?}");
    let (code, _) = next_close(&mut ws).await;
    assert_eq!(code, 1001);
    assert!(shutdown.await.unwrap() < Duration::from_secs(20));
}

#[tokio::test]
async fn at_shutdown_a_new_response_create_is_not_sent_on() {
    let behavior = Behavior {
        chunk_delay: Duration::from_millis(200),
        ..Behavior::default()
    };
    let (provider, proxy, mut ws) = session_behind(behavior, 30_000).await;
    send_create(&mut ws, &request(&[user("hello")])).await;
    let first = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
    let Ok(Some(Ok(Message::Text(first)))) = first else {
        panic!("the answer's first event: {first:?}");
    };
    let first = serde_json::from_str::<Value>(&first).unwrap();
    let shutdown = shut_down(proxy, Duration::from_secs(30));
    // The drain has reached the session (it is in the same process) well before this.
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_create(&mut ws, &request(&[user("hello"), user("and then?")])).await;
    let events = answer(&mut ws, vec![first]).await;
    completed(&events);
    let (code, _) = next_close(&mut ws).await;
    assert_eq!(code, 1001);
    assert_eq!(
        frames(&provider).len(),
        1,
        "the second create never reached the provider"
    );
    assert!(shutdown.await.unwrap() < Duration::from_secs(30));
}

#[tokio::test]
async fn at_shutdown_an_answer_that_outlasts_the_grace_is_cut_at_its_end() {
    // The provider answers long after the grace (1 s) is over.
    let behavior = Behavior {
        latency: Duration::from_secs(30),
        ..Behavior::default()
    };
    let (provider, proxy, mut ws) = session_behind(behavior, 1_000).await;
    send_create(&mut ws, &request(&[user("hello")])).await;
    assert!(eventually(Duration::from_secs(10), || frames(&provider).len() == 1).await);
    let started = Instant::now();
    let shutdown = shut_down(proxy, Duration::from_secs(5));
    let (code, _) = next_close(&mut ws).await;
    let waited = started.elapsed();
    assert_eq!(code, 1001);
    // Not at once (an answer was in flight), and not past the grace.
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    assert!(shutdown.await.unwrap() < Duration::from_secs(5));
}
