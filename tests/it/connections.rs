//! Connections as an attacker holds them: half-sent heads (slowloris), silent
//! keep-alive connections, bodies that trickle, more connections and requests than the
//! caps allow — on both listeners, with real sockets.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use abridge::config::Config;
use fake_provider::{Behavior, FakeProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Proxy, chat_body, client, config_for};

fn tight(url: &str) -> Config {
    let mut config = config_for(url);
    config.timeouts.client_header_ms = 300;
    config.timeouts.client_idle_ms = 600;
    config.timeouts.client_body_ms = 400;
    config
}

/// Reads until the peer closes (or errors); what it sent, and when it closed.
async fn until_closed(stream: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Duration)> {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(
            tokio::time::Instant::from_std(started + limit),
            stream.read(&mut buf),
        )
        .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => return Some((out, started.elapsed())),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[tokio::test]
async fn a_half_sent_head_is_closed_on_both_listeners_while_others_are_served() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(tight(&provider.url())).await;
    let mut held = Vec::new();
    for (addr, n) in [(proxy.addr, 100), (proxy.admin, 30)] {
        for _ in 0..n {
            let mut s = connect(addr).await;
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-")
                .await
                .unwrap();
            held.push(s);
        }
    }
    // Meanwhile, real requests and health checks are answered at once.
    let health = client()
        .get(format!("http://{}/healthz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let chat = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    // Every half-sent head is closed within the header deadline (generously bounded).
    for (i, s) in held.iter_mut().enumerate() {
        let closed = until_closed(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "connection {i} still open after 5 s");
    }
}

#[tokio::test]
async fn a_silent_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(tight(&provider.url())).await;
    for addr in [proxy.addr, proxy.admin] {
        let mut s = connect(addr).await;
        let path = if addr == proxy.admin {
            "/healthz"
        } else {
            "/v1/models"
        };
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (answer, after) = until_closed(&mut s, Duration::from_secs(5))
            .await
            .expect("closed after the idle timeout");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        // Not before the idle timeout (600 ms; the header deadline is 300 ms), and not
        // much after.
        assert!(after >= Duration::from_millis(550), "{after:?}");
    }
}

#[tokio::test]
async fn a_trickling_body_is_cut_at_the_body_deadline() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(tight(&provider.url())).await;
    // A body abridge reads whole: 408 in OpenAI's shape.
    let mut s = connect(proxy.addr).await;
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"mod",
    )
    .await
    .unwrap();
    let (answer, after) = until_closed(&mut s, Duration::from_secs(5))
        .await
        .expect("answered and closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
    assert!(after >= Duration::from_millis(350), "{after:?}");
    // A body streamed through: the upstream request fails, the connection ends.
    let mut s = connect(proxy.addr).await;
    s.write_all(b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
        .await
        .unwrap();
    assert!(
        until_closed(&mut s, Duration::from_secs(5)).await.is_some(),
        "a streamed body that stops is not held open"
    );
}

#[tokio::test]
async fn over_the_caps_clients_get_503_with_retry_after() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.limits.max_inflight_requests = 1;
    let proxy = Proxy::start_with(config).await;

    // One request in flight (the provider never answers it)...
    let stalled = {
        let url = proxy.url("/v1/chat/completions");
        tokio::spawn(async move {
            client()
                .post(url)
                .header("x-fake-stall", "headers")
                .body(chat_body(false))
                .send()
                .await
        })
    };
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| !p.requests().is_empty())
            .await
    );
    // ...so the next is refused, in OpenAI's shape, with Retry-After.
    let refused = reqwest::Client::new()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    stalled.abort();

    // Two connections open: a third is answered 503 and closed.
    let mut config = config_for(&provider.url());
    config.limits.max_connections = 2;
    let proxy = Proxy::start_with(config).await;
    let _a = connect(proxy.addr).await;
    let _b = connect(proxy.addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut c = connect(proxy.addr).await;
    let (answer, _) = until_closed(&mut c, Duration::from_secs(5))
        .await
        .expect("refused at once");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("max_connections"), "{text}");
}
