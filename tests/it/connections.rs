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

/// A connection that never sends a byte holds its place under the cap only for the
/// header deadline, not the keep-alive time: 64 silent sockets cannot starve a
/// listener for 75 s.
#[tokio::test]
async fn a_connection_that_never_speaks_is_closed_at_the_header_deadline() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.timeouts.client_header_ms = 300;
    config.timeouts.client_idle_ms = 30_000;
    let proxy = Proxy::start_with(config).await;
    for addr in [proxy.addr, proxy.admin] {
        let mut s = connect(addr).await;
        let (_, after) = until_closed(&mut s, Duration::from_secs(10))
            .await
            .expect("a silent connection is closed long before the idle timeout");
        assert!(after >= Duration::from_millis(250), "{after:?}");
    }
}

/// The admin listener full of silent connections still answers its probes (a liveness
/// probe must not restart a healthy abridge), and nothing else: the reserve serves only
/// `/healthz` and `/readyz`, a few connections, one request each.
#[tokio::test]
async fn health_probes_answer_while_the_admin_listener_is_at_its_cap() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.limits.admin_max_connections = 4;
    config.timeouts.client_header_ms = 20_000;
    let proxy = Proxy::start_with(config).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(connect(proxy.admin).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for path in ["/healthz", "/readyz"] {
        let answer = client()
            .get(format!("http://{}{path}", proxy.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{path} at the cap");
    }
    let other = client()
        .get(format!("http://{}/metrics", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 503, "the reserve is for the probes alone");
    // A reserve connection that does not send its request is closed within seconds.
    let mut lingering = connect(proxy.admin).await;
    let (_, after) = until_closed(&mut lingering, Duration::from_secs(10))
        .await
        .expect("a silent reserve connection is closed");
    assert!(after < Duration::from_secs(8), "{after:?}");
    // With the reserve full too, a connection is refused at once.
    let mut reserve = Vec::new();
    for _ in 0..abridge::admin::PROBE_CONNECTIONS {
        reserve.push(connect(proxy.admin).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = connect(proxy.admin).await;
    let (answer, _) = until_closed(&mut refused, Duration::from_secs(5))
        .await
        .expect("refused at once");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 503"));
}

/// An upload streamed through that never pauses long enough for the between-chunks
/// deadline still has to arrive whole within `timeouts.passthrough_body_ms`.
#[tokio::test]
async fn a_steadily_trickling_upload_is_cut_at_its_overall_deadline() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = tight(&provider.url());
    config.timeouts.client_body_ms = 2000;
    config.timeouts.passthrough_body_ms = 1000;
    let proxy = Proxy::start_with(config).await;
    let mut s = connect(proxy.addr).await;
    s.write_all(b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // A byte every 200 ms: well within the 2 s between chunks, for ever.
    let closed = loop {
        if s.write_all(b"x").await.is_err() {
            break started.elapsed();
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break started.elapsed(),
            Ok(Ok(_)) | Err(_) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a trickling upload was held open for 10 s"
        );
    };
    assert!(closed >= Duration::from_millis(900), "{closed:?}");
}

/// A stream the provider never ends is cut at `timeouts.max_stream_ms`, even though it
/// is never silent for `stream_idle_ms`.
#[tokio::test]
async fn an_endless_stream_is_cut_at_the_longest_stream_duration() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.timeouts.max_stream_ms = 800;
    let proxy = Proxy::start_with(config).await;
    let started = Instant::now();
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-words", "100000")
        .header("x-fake-delay-ms", "20")
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let read = tokio::time::timeout(Duration::from_secs(15), response.bytes()).await;
    assert!(read.is_ok(), "the stream was not cut");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Without the limit the same stream is relayed as long as it goes.
    let proxy = Proxy::start_with(config_for(&provider.url())).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-words", "150")
        .header("x-fake-delay-ms", "10")
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    let body = response.bytes().await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
}
