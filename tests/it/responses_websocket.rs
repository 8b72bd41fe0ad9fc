//! The Responses WebSocket handshake Codex CLI opens first on its built-in `openai`
//! provider: answered at once with the 426 Codex falls back to HTTPS from without
//! retrying, whichever upstream, and nothing reaches the provider.

use std::time::{Duration, Instant};

use abridge::config::ProviderCompaction;
use fake_provider::{Behavior, FakeProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Proxy, client, config_for};

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

#[tokio::test]
async fn a_websocket_handshake_gets_426_at_once_and_nothing_is_forwarded() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    for mode in [ProviderCompaction::Serve, ProviderCompaction::Native] {
        let mut config = config_for(&provider.url());
        config.provider_apis.responses_compaction = mode;
        let proxy = Proxy::start_with(config).await;
        for path in ["/v1/responses", "/openai/v1/responses"] {
            let started = Instant::now();
            let (status, body) = handshake(&proxy, path).await;
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "{mode:?} {path}"
            );
            assert_eq!(status, "HTTP/1.1 426 Upgrade Required", "{mode:?} {path}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(body["error"]["type"], "invalid_request_error");
            assert!(
                body["error"]["message"].as_str().unwrap().contains("HTTP"),
                "{body}"
            );
        }
        proxy.shutdown().await.unwrap();
    }
    assert!(
        provider.requests().is_empty(),
        "nothing forwarded: {:?}",
        provider.requests()
    );

    // A plain GET on the same path still passes through to the provider.
    let proxy = Proxy::start(&provider.url()).await;
    let answer = client()
        .get(proxy.url("/v1/responses"))
        .send()
        .await
        .unwrap();
    assert_ne!(answer.status(), 426);
    assert_eq!(provider.last_request().unwrap().uri.path(), "/v1/responses");
}
