//! Transparency: what the provider receives and what the client gets back are what they
//! would have been without abridge.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fake_provider::FakeProvider;

use crate::common::{Fetch, Proxy, chat_body, client, config_for, setup};

#[tokio::test]
async fn chat_body_reaches_the_provider_byte_identical() {
    let (provider, proxy) = setup().await;
    // Odd formatting, unknown fields, unicode, escapes: nothing may be normalised.
    let body = "{ \"model\" : \"gpt-4o\",\n  \"messages\": [ {\"role\":\"system\",\"content\":\"Sei breve. \\u00e9\"},\
                {\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"héllo 🌍\"}],\"x_vendor\":{\"k\":[1,2.50,null]}} ],\
                \"temperature\": 0.70, \"logit_bias\": {\"50256\": -100}, \"unknown_field\": true }";
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = provider.last_request().unwrap();
    assert_eq!(
        seen.body,
        body.as_bytes(),
        "the provider must receive the original bytes"
    );
    assert_eq!(seen.uri.path(), "/v1/chat/completions");

    // A streaming request that already asks for usage is not touched either.
    let streaming = chat_body(true).replace(
        r#""stream":true"#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
    );
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(streaming.clone())
        .send()
        .await
        .unwrap();
    response.bytes().await.unwrap();
    assert_eq!(provider.last_request().unwrap().body, streaming.as_bytes());
    assert_eq!(proxy.stats().unparseable_bodies, 0);
}

#[tokio::test]
async fn non_streaming_response_equals_the_direct_one_and_usage_is_read() {
    let (provider, proxy) = setup().await;
    let body = chat_body(false);
    let direct = client()
        .post(format!("{}/chat/completions", provider.url()))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let direct_status = direct.status();
    let direct_type = direct.headers()["content-type"].clone();
    let direct_body = direct.bytes().await.unwrap();

    let via = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(via.status(), direct_status);
    assert_eq!(via.headers()["content-type"], direct_type);
    assert_eq!(via.bytes().await.unwrap(), direct_body);

    let expected: serde_json::Value = serde_json::from_slice(&direct_body).unwrap();
    let prompt_tokens = expected["usage"]["prompt_tokens"].as_u64().unwrap();
    let completion_tokens = expected["usage"]["completion_tokens"].as_u64().unwrap();
    let stats = proxy.stats();
    assert_eq!(stats.usage_reports, 1);
    assert_eq!(stats.prompt_tokens_reported, prompt_tokens);
    assert_eq!(stats.completion_tokens_reported, completion_tokens);
    // abridge asks for an uncompressed body on the route it reads.
    assert_eq!(
        provider.last_request().unwrap().headers["accept-encoding"],
        "identity"
    );
}

#[tokio::test]
async fn gzip_response_is_decoded_and_its_usage_read() {
    let (provider, proxy) = setup().await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-gzip", "1")
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("content-encoding").is_none());
    let json: serde_json::Value = response.json().await.unwrap();
    let prompt_tokens = json["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(proxy.stats().prompt_tokens_reported, prompt_tokens);
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn input_tokens_naming_is_understood() {
    let (_provider, proxy) = setup().await;
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-usage", "input")
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        proxy.stats().prompt_tokens_reported,
        json["usage"]["input_tokens"].as_u64().unwrap()
    );
}

/// Sends a raw HTTP/1.1 request (full control over every header) and returns the
/// response head (lower-cased) and body.
fn raw_exchange(addr: std::net::SocketAddr, request: &str) -> (String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    (head, raw[split + 4..].to_vec())
}

#[tokio::test]
async fn credentials_arrive_unchanged_and_hop_by_hop_headers_do_not_cross() {
    let (provider, proxy) = setup().await;
    let body = chat_body(false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer sk-test-Abc123\r\n\
         OpenAI-Organization: org-42\r\nX-Stainless-Lang: python\r\nContent-Type: application/json\r\n\
         Connection: close, X-Custom-Hop\r\nX-Custom-Hop: secret-hop\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
         Proxy-Authorization: Basic cHJveHk6cHc=\r\nX-Abridge-Compact: off\r\nx-abridge-conversation: c-1\r\n\
         Content-Length: {}\r\n\r\n{body}",
        proxy.addr,
        body.len()
    );
    let addr = proxy.addr;
    let (head, _) = tokio::task::spawn_blocking(move || raw_exchange(addr, &request))
        .await
        .unwrap();
    assert!(head.starts_with("http/1.1 200"), "{head}");

    let seen = provider.last_request().unwrap();
    assert_eq!(seen.headers["authorization"], "Bearer sk-test-Abc123");
    assert_eq!(seen.headers["openai-organization"], "org-42");
    assert_eq!(seen.headers["x-stainless-lang"], "python");
    assert_eq!(seen.headers["host"], provider.addr().to_string());
    for name in [
        "x-custom-hop",
        "keep-alive",
        "te",
        "proxy-authorization",
        "x-abridge-compact",
        "x-abridge-conversation",
    ] {
        assert!(
            seen.headers.get(name).is_none(),
            "{name} crossed to the provider"
        );
    }
    // `Connection: close` was the client's business; upstream runs its own connection.
    assert_ne!(
        seen.headers.get("connection").map(|v| v.to_str().unwrap()),
        Some("close, X-Custom-Hop")
    );
}

#[tokio::test]
async fn provider_hop_by_hop_and_abridge_headers_do_not_reach_the_client() {
    let (_provider, proxy) = setup().await;
    for path in ["/v1/chat/completions", "/v1/models"] {
        let request = if path.ends_with("models") {
            client().get(proxy.url(path))
        } else {
            client().post(proxy.url(path)).body(chat_body(false))
        };
        let response = request
            .header("x-fake-leak-headers", "1")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let h = response.headers();
        assert!(h.get("x-request-id").is_some(), "end-to-end headers pass");
        for name in ["x-fake-hop", "keep-alive", "proxy-authenticate"] {
            assert!(h.get(name).is_none(), "{name} reached the client on {path}");
        }
        // The provider's forged x-abridge-* header is dropped; on the chat route the
        // header the client sees is abridge's own report.
        let compacted = h.get("x-abridge-compacted").map(|v| v.to_str().unwrap());
        if path.ends_with("models") {
            assert_eq!(compacted, None);
        } else {
            assert_eq!(compacted, Some("false"));
        }
    }
}

#[tokio::test]
async fn models_and_embeddings_pass_through_with_query_and_streamed_body() {
    let (provider, proxy) = setup().await;
    let direct = client()
        .get(format!("{}/models?limit=2", provider.url()))
        .fetch()
        .await;
    let via = client()
        .get(proxy.url("/v1/models?limit=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(via.status(), 200);
    assert_eq!(via.bytes().await.unwrap(), direct);
    let seen = provider.last_request().unwrap();
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.uri.path_and_query().unwrap().as_str(),
        "/v1/models?limit=2"
    );

    // A request body sent in pieces (chunked) arrives whole.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(br#"{"model":"text-embedding-3-small","#.to_vec()),
        Ok(br#""input":["alpha","beta"]}"#.to_vec()),
    ];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(pieces));
    let via = client()
        .post(proxy.url("/v1/embeddings"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(via.status(), 200);
    let json: serde_json::Value = via.json().await.unwrap();
    assert_eq!(json["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        provider.last_request().unwrap().body,
        br#"{"model":"text-embedding-3-small","input":["alpha","beta"]}"#.as_slice()
    );
    let stats = proxy.stats();
    assert_eq!((stats.requests, stats.chat_requests), (2, 0));
}

#[tokio::test]
async fn an_upstream_base_with_a_path_prefix_works() {
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = Proxy::start_with(config_for(&format!("http://{}/api/v1", provider.addr()))).await;
    let response = client()
        .post(proxy.url("/v1/chat/completions?trace=1"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = provider.last_request().unwrap();
    assert_eq!(
        seen.uri.path_and_query().unwrap().as_str(),
        "/api/v1/chat/completions?trace=1"
    );
}

#[tokio::test]
async fn other_methods_on_the_chat_path_pass_through() {
    // OpenAI lists stored completions with GET /v1/chat/completions.
    let (provider, proxy) = setup().await;
    let response = client()
        .get(proxy.url("/v1/chat/completions?limit=1"))
        .send()
        .await
        .unwrap();
    // The fake answers unknown routes with OpenAI's 404; it must be the provider's.
    assert_eq!(response.status(), 404);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        json["error"]["message"],
        "Invalid URL (GET /v1/chat/completions)"
    );
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(proxy.stats().chat_requests, 0);
}

#[tokio::test]
async fn bodyless_responses_count_as_complete() {
    let (provider, proxy) = setup().await;
    let response = client().head(proxy.url("/v1/models")).send().await.unwrap();
    assert_eq!(
        response.status(),
        404,
        "the fake serves GET only; HEAD gets its 404 head"
    );
    assert_eq!(provider.requests()[0].method, "HEAD");
    let stats = proxy.stats();
    assert_eq!(
        (stats.requests, stats.client_gone, stats.upstream_errors),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn a_client_expecting_100_continue_gets_its_chat_answered() {
    let (provider, proxy) = setup().await;
    let body = chat_body(false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let addr = proxy.addr;
    let (head, response) = tokio::task::spawn_blocking(move || raw_exchange(addr, &request))
        .await
        .unwrap();
    assert!(
        head.starts_with("http/1.1 100") || head.starts_with("http/1.1 200"),
        "{head}"
    );
    assert!(String::from_utf8_lossy(&response).contains("chat.completion"));
    let seen = provider.last_request().unwrap();
    assert!(seen.headers.get("expect").is_none());
    assert_eq!(seen.body, body.as_bytes());
}
