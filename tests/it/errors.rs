//! Errors: abridge's own in OpenAI's shape, the provider's passed through unchanged, and
//! bad client input forwarded rather than rejected.

use std::time::{Duration, Instant};

use fake_provider::{Behavior, FakeProvider};

use crate::common::{Fetch, Proxy, chat_body, client, closed_port, config_for, setup, setup_with};

/// Asserts an OpenAI-shaped error body with `code` and returns its message.
async fn openai_error(response: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(response.headers()["content-type"], "application/json");
    let json: serde_json::Value = response.json().await.unwrap();
    let error = &json["error"];
    assert_eq!(error["code"], code, "{json}");
    assert!(error["type"].is_string(), "{json}");
    assert!(error.get("param").is_some(), "{json}");
    error["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn unreachable_provider_is_502() {
    let proxy = Proxy::start(&format!("http://{}/v1", closed_port().await)).await;
    for (method, path) in [("POST", "/v1/chat/completions"), ("GET", "/v1/models")] {
        let request = client().request(method.parse().unwrap(), proxy.url(path));
        let response = request.body(chat_body(false)).send().await.unwrap();
        let message = openai_error(response, 502, "upstream_unreachable").await;
        assert!(message.to_lowercase().contains("refused"), "{message}");
    }
    assert_eq!(proxy.stats().upstream_errors, 2);
}

#[tokio::test]
async fn a_provider_that_does_not_answer_is_504() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.timeouts.first_byte_ms = 300;
    let proxy = Proxy::start_with(config).await;
    let started = Instant::now();
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-stall", "headers")
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    openai_error(response, 504, "upstream_timeout").await;
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_never_forwarded() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.limits.max_body_bytes = 1000;
    let proxy = Proxy::start_with(config).await;
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    let message = openai_error(response, 413, "request_too_large").await;
    assert!(message.contains("1000"), "{message}");

    // Without a Content-Length (chunked), the limit holds while reading.
    let pieces: Vec<Result<String, std::io::Error>> = big
        .as_bytes()
        .chunks(300)
        .map(|c| Ok(String::from_utf8(c.to_vec()).unwrap()))
        .collect();
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .unwrap();
    openai_error(response, 413, "request_too_large").await;
    assert!(provider.requests().is_empty());

    // Under the limit it goes through.
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn unknown_paths_are_404_and_never_forwarded() {
    let (provider, proxy) = setup().await;
    for path in ["/", "/v2/models", "/v1models", "/admin/stats", "/healthz"] {
        let response = client().get(proxy.url(path)).send().await.unwrap();
        let message = openai_error(response, 404, "unknown_url").await;
        assert!(message.contains(path), "{message}");
    }
    let response = client()
        .get(proxy.url("/v1/../admin"))
        .send()
        .await
        .unwrap();
    // reqwest normalises `..` away; a raw path must be refused by abridge itself.
    assert_eq!(response.status(), 404);
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn dot_segments_are_refused() {
    use std::io::{Read, Write};
    let (provider, proxy) = setup().await;
    let addr = proxy.addr;
    let head = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /v1/%2e%2e/admin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(head.contains("invalid_path"), "{head}");
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn provider_errors_pass_through_unchanged() {
    let (provider, proxy) = setup().await;
    for status in ["400", "401", "429", "500", "503"] {
        let direct = client()
            .post(format!("{}/chat/completions", provider.url()))
            .header("x-fake-status", status)
            .body(chat_body(false))
            .send()
            .await
            .unwrap();
        let (direct_status, direct_body) = (direct.status(), direct.bytes().await.unwrap());
        let via = client()
            .post(proxy.url("/v1/chat/completions"))
            .header("x-fake-status", status)
            .body(chat_body(false))
            .send()
            .await
            .unwrap();
        assert_eq!(via.status(), direct_status);
        assert_eq!(via.bytes().await.unwrap(), direct_body);
    }
    assert_eq!(
        proxy.stats().upstream_errors,
        0,
        "a provider error is not abridge's error"
    );
}

#[tokio::test]
async fn an_oversized_provider_error_passes_through_whatever_the_compaction_mode() {
    // abridge reads a 400 whole (up to 1 MiB) only when it could retry after it; a larger
    // one, or any one when no retry can follow, is the provider's answer untouched, never
    // a 502 of abridge's.
    let (provider, proxy) = setup().await;
    for (padding, compact) in [
        ("2000000", "auto"),
        ("2000000", "off"),
        ("1000", "off"),
        ("1000", "auto"),
    ] {
        let ask = |url: String| {
            client()
                .post(url)
                .header("x-fake-status", "400")
                .header("x-fake-error-bytes", padding)
                .header("x-abridge-compact", compact)
                .body(chat_body(false))
                .send()
        };
        let direct = ask(format!("{}/chat/completions", provider.url()))
            .await
            .unwrap();
        let direct_body = direct.bytes().await.unwrap();
        let via = ask(proxy.url("/v1/chat/completions")).await.unwrap();
        assert_eq!(via.status(), 400, "{padding} bytes, compact {compact}");
        let body = via.bytes().await.unwrap();
        assert!(body.len() > padding.parse().unwrap());
        assert_eq!(body, direct_body, "{padding} bytes, compact {compact}");
    }
}

#[tokio::test]
async fn context_length_exceeded_passes_through() {
    let (provider, proxy) = setup_with(Behavior {
        context_window: Some(10),
        ..Behavior::default()
    })
    .await;
    let direct = client()
        .post(format!("{}/chat/completions", provider.url()))
        .body(chat_body(false))
        .fetch()
        .await;
    let via = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(via.status(), 400);
    let body = via.bytes().await.unwrap();
    assert_eq!(body, direct);
    assert!(String::from_utf8_lossy(&body).contains("context_length_exceeded"));
}

#[tokio::test]
async fn bodies_abridge_does_not_understand_are_forwarded_untouched() {
    let (provider, proxy) = setup().await;
    let deep = format!(
        r#"{{"model":"m","messages":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases: Vec<String> = vec![
        "{not json".into(),
        r#"{"model":"m","messages":"hello"}"#.into(),
        r#"{"model":"m","messages":[{"role":"wizard","content":"hi"}]}"#.into(),
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"model":"dup"}"#.into(),
        deep,
        String::new(),
    ];
    for (i, body) in cases.iter().enumerate() {
        let direct = client()
            .post(format!("{}/chat/completions", provider.url()))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let (direct_status, direct_body) = (direct.status(), direct.bytes().await.unwrap());
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            direct_status,
            "case {i}: the provider's own answer"
        );
        assert_eq!(response.bytes().await.unwrap(), direct_body, "case {i}");
        assert_eq!(
            provider.last_request().unwrap().body,
            body.as_bytes(),
            "case {i} forwarded untouched"
        );
    }
    assert_eq!(proxy.stats().unparseable_bodies, cases.len() as u64);
    assert_eq!(provider.requests().len(), 2 * cases.len());
}

#[tokio::test]
async fn a_slow_stream_that_never_pauses_for_the_idle_timeout_is_not_cut() {
    // Events 100 ms apart for ~2 s, idle timeout 300 ms: the timeout counts from the last
    // event, not from the start of the stream or of the timer.
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.timeouts.stream_idle_ms = 300;
    let proxy = Proxy::start_with(config).await;
    let started = Instant::now();
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-delay-ms", "100")
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.expect("the whole stream");
    assert!(started.elapsed() > Duration::from_millis(900), "paced");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(body.matches("data: ").count() > 10);
    assert_eq!(proxy.stats().idle_timeouts, 0);
}

#[tokio::test]
async fn a_silent_stream_is_cut_after_the_idle_timeout() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.timeouts.stream_idle_ms = 300;
    let proxy = Proxy::start_with(config).await;
    let mut response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-stall", "body")
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let started = Instant::now();
    let rest = loop {
        match response.chunk().await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(
        rest.is_err(),
        "the stream must end in an error, not look complete: {rest:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        crate::common::eventually(Duration::from_secs(3), || proxy.stats().idle_timeouts == 1)
            .await
    );
    assert!(
        provider
            .wait_until(Duration::from_secs(3), |p| p.cancelled() == 1)
            .await,
        "upstream dropped"
    );
}
