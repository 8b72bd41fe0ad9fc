//! Streaming: events reach the client as the provider sends them; usage is read from the
//! stream, and what abridge adds to read it is taken out again.

use std::io::Read;
use std::time::{Duration, Instant};

use fake_provider::Behavior;

use crate::common::{Proxy, chat_body, client, setup, setup_with};

/// Sends `body` with `headers` to `url` and returns the whole streamed body.
async fn fetch(url: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String, Vec<u8>) {
    let mut request = client().post(url).body(body.to_owned());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

fn expected_prompt_tokens(stream: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(stream);
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| v["usage"]["prompt_tokens"].as_u64())
        .last()
        .unwrap()
}

#[tokio::test]
async fn the_first_event_reaches_the_client_before_the_provider_has_finished() {
    let behavior = Behavior {
        chunk_delay: Duration::from_millis(150),
        reply_words: 8,
        ..Behavior::default()
    };
    let (provider, proxy) = setup_with(behavior).await;
    let started = Instant::now();
    let mut response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let first = response.chunk().await.unwrap().unwrap();
    let first_at = started.elapsed();
    assert!(
        String::from_utf8_lossy(&first).starts_with("data: {"),
        "{first:?}"
    );
    assert_eq!(
        provider.completed(),
        0,
        "the provider was still streaming when the first event arrived"
    );
    // 11 events at 150 ms: the whole stream takes ≥ 1.5 s; the first event came at once.
    assert!(
        first_at < Duration::from_millis(700),
        "first event after {first_at:?}"
    );
    let mut chunks = 1;
    while response.chunk().await.unwrap().is_some() {
        chunks += 1;
    }
    assert!(
        chunks >= 10,
        "events arrived one by one, not as one buffered body ({chunks} chunks)"
    );
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(provider.completed(), 1);
}

#[tokio::test]
async fn include_usage_is_added_upstream_and_its_traces_removed_downstream() {
    let (provider, proxy) = setup().await;
    let body = chat_body(true);
    let url = format!("{}/chat/completions", provider.url());
    let (_, _, direct) = fetch(&url, &body, &[]).await;
    assert!(!String::from_utf8_lossy(&direct).contains("usage"));

    let (status, content_type, via) = fetch(&proxy.url("/v1/chat/completions"), &body, &[]).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "text/event-stream; charset=utf-8")
    );
    assert_eq!(
        String::from_utf8_lossy(&via),
        String::from_utf8_lossy(&direct),
        "client sees the direct stream"
    );

    let seen = provider.last_request().unwrap().json();
    assert_eq!(seen["stream_options"]["include_usage"], true);
    assert_eq!(
        seen["messages"],
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["messages"]
    );

    // The usage abridge asked for was read: compare with a direct request that asks.
    let asking = body.replace(
        r#""stream":true"#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
    );
    let (_, _, with_usage) = fetch(&url, &asking, &[]).await;
    let stats = proxy.stats();
    assert_eq!(stats.usage_requested, 1);
    assert_eq!(stats.usage_reports, 1);
    assert_eq!(stats.stripped_events, 1);
    assert_eq!(
        stats.prompt_tokens_reported,
        expected_prompt_tokens(&with_usage)
    );
}

#[tokio::test]
async fn a_client_that_asked_for_usage_gets_it_untouched() {
    let (provider, proxy) = setup().await;
    let body = chat_body(true).replace(
        r#""stream":true"#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
    );
    let (_, _, direct) = fetch(&format!("{}/chat/completions", provider.url()), &body, &[]).await;
    let (_, _, via) = fetch(&proxy.url("/v1/chat/completions"), &body, &[]).await;
    assert_eq!(via, direct);
    assert!(String::from_utf8_lossy(&via).contains(r#""choices":[],"#));
    let stats = proxy.stats();
    assert_eq!((stats.usage_requested, stats.stripped_events), (0, 0));
    assert_eq!(stats.prompt_tokens_reported, expected_prompt_tokens(&via));
}

#[tokio::test]
async fn usage_is_read_from_events_split_across_chunks_and_data_lines() {
    let (provider, proxy) = setup().await;
    let direct_url = format!("{}/chat/completions", provider.url());
    let flags = [("x-fake-split", "1"), ("x-fake-multiline", "1")];
    for asks in [false, true] {
        let mut body = chat_body(true);
        if asks {
            body = body.replace(
                r#""stream":true"#,
                r#""stream":true,"stream_options":{"include_usage":true}"#,
            );
        }
        let (_, _, direct) = fetch(&direct_url, &body, &flags).await;
        let before = proxy.stats();
        let (_, _, via) = fetch(&proxy.url("/v1/chat/completions"), &body, &flags).await;
        let after = proxy.stats();
        assert!(
            String::from_utf8_lossy(&direct).contains("\ndata: "),
            "multi-line events were sent"
        );
        assert_eq!(
            String::from_utf8_lossy(&via),
            String::from_utf8_lossy(&direct),
            "asks usage: {asks}"
        );
        assert_eq!(
            after.usage_reports - before.usage_reports,
            1,
            "asks usage: {asks}"
        );
        assert!(after.prompt_tokens_reported > before.prompt_tokens_reported);
    }
}

#[tokio::test]
async fn a_gzip_stream_is_decoded_for_the_client_and_usage_read() {
    let (provider, proxy) = setup().await;
    let body = chat_body(true);
    let flags = [("x-fake-gzip", "1")];
    let (_, _, direct_gz) = fetch(
        &format!("{}/chat/completions", provider.url()),
        &body,
        &flags,
    )
    .await;
    let mut direct = Vec::new();
    flate2::read::GzDecoder::new(direct_gz.as_slice())
        .read_to_end(&mut direct)
        .unwrap();

    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-gzip", "1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("content-encoding").is_none());
    let via = response.bytes().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&via),
        String::from_utf8_lossy(&direct)
    );
    assert_eq!(proxy.stats().usage_reports, 1);
}

#[tokio::test]
async fn streamed_tool_calls_pass_intact() {
    let (provider, proxy) = setup().await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"read the file"}],
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]}"#;
    let (_, _, direct) = fetch(&format!("{}/chat/completions", provider.url()), body, &[]).await;
    let (_, _, via) = fetch(&proxy.url("/v1/chat/completions"), body, &[]).await;
    assert!(String::from_utf8_lossy(&via).contains(r#""finish_reason":"tool_calls""#));
    assert_eq!(via, direct);
    assert_eq!(proxy.stats().usage_reports, 1);
}

/// The chunks of an HTTP/1.1 chunked response to a raw request: `(chunks, body)`.
async fn raw_chunks(addr: std::net::SocketAddr, body: &str, headers: &str) -> (usize, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: abridge\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let (mut rest, mut chunks, mut out) = (&raw[head_end..], 0, Vec::new());
    // Until the last chunk, or where a cut connection left it.
    while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..line_end]).unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        let Some(data) = rest.get(line_end + 2..line_end + 2 + size) else {
            break;
        };
        if size == 0 {
            break;
        }
        chunks += 1;
        out.extend_from_slice(data);
        rest = rest.get(line_end + 2 + size + 2..).unwrap_or_default();
    }
    (chunks, out)
}

/// A provider that answers one request with `events` as an SSE stream whose chunks
/// (one per event) all leave in a single write, as a fast model's reach a proxy, then
/// `end` (the last chunk, or bytes that break the chunked framing).
async fn one_write_provider(events: Vec<String>, end: &'static [u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        // The head, then the body its content-length announces.
        let body_at = loop {
            let n = tcp.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
            if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&request[..body_at]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while request.len() < body_at + length {
            let n = tcp.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
        }
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
            transfer-encoding: chunked\r\n\r\n"
            .to_vec();
        for event in &events {
            out.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
        }
        out.extend_from_slice(end);
        tcp.write_all(&out).await.unwrap();
        tcp.flush().await.unwrap();
    });
    url
}

/// Events that reach abridge together leave it together: a stream whose chunks arrived
/// in one read is not relayed as one write per event (it was: one chunk, one `writev`,
/// per event), and arrives whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_arrive_together_are_relayed_in_few_writes() {
    let mut events: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n"
            )
        })
        .collect();
    events.push("data: [DONE]\n\n".to_owned());
    let upstream = one_write_provider(events.clone(), b"0\r\n\r\n").await;
    let proxy = Proxy::start(&upstream).await;
    let (chunks, body) = raw_chunks(proxy.addr, &chat_body(true), "").await;
    assert_eq!(String::from_utf8(body).unwrap(), events.concat());
    assert!(
        chunks * 4 <= events.len(),
        "{chunks} chunks for {} events: relayed one write per event",
        events.len()
    );
}

/// The events that came before a broken stream reach the client whole, though they
/// were gathered into one write and the upstream's error came in the same read (hyper
/// closes the connection on a body error without flushing what it buffered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_gathered_before_an_upstream_error_still_reach_the_client() {
    let events: Vec<String> = (0..30)
        .map(|i| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"w{i}\"}}}}]}}\n\n"))
        .collect();
    let upstream = one_write_provider(events.clone(), b"zz\r\nnot a chunk").await;
    let proxy = Proxy::start(&upstream).await;
    let (_, body) = raw_chunks(proxy.addr, &chat_body(true), "").await;
    assert_eq!(String::from_utf8(body).unwrap(), events.concat());
}
