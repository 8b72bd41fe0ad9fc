//! The fault suite under attack: slow clients (slowloris, slow bodies), adversarial
//! bodies forced through every strategy, and tenants probing for each other's data.

use std::time::{Duration, Instant};

use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::chat_body;
use crate::common::redis::RedisServer;

use super::{Release, conversation, http, report};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn slowloris_and_slow_bodies_are_closed_while_everyone_else_is_served() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(
        &provider.url(),
        &[
            ("ABRIDGE_TIMEOUTS__CLIENT_HEADER_MS", "1000".into()),
            ("ABRIDGE_TIMEOUTS__CLIENT_BODY_MS", "1000".into()),
        ],
    )
    .await;
    let mut held = Vec::new();
    for (addr, n) in [(abridge.addr, 400), (abridge.admin, 40)] {
        for i in 0..n {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let part: &[u8] = if i % 2 == 0 {
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow"
            } else {
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"mo"
            };
            s.write_all(part).await.unwrap();
            held.push(s);
        }
    }
    let opened = Instant::now();
    let client = http();
    let mut slowest_health = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        assert_eq!(
            client
                .get(abridge.admin_url("/healthz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        slowest_health = slowest_health.max(t.elapsed());
        let chat = client
            .post(abridge.url("/v1/chat/completions"))
            .body(chat_body(false))
            .send()
            .await
            .unwrap();
        assert_eq!(chat.status(), 200);
    }
    let mut latest = Duration::ZERO;
    for (i, s) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => panic!("slow connection {i} still open after 10 s"),
            }
        }
        latest = latest.max(opened.elapsed());
    }
    report(
        "Slowloris (half heads) and slow bodies: 400 connections on the proxy, 40 on admin",
        &[
            format!(
                "all closed {} ms after they were opened (deadlines 1,000 ms)",
                latest.as_millis()
            ),
            format!(
                "meanwhile 20 chat requests answered 200, slowest /healthz {} ms",
                slowest_health.as_millis()
            ),
        ],
    );
    assert!(slowest_health < Duration::from_secs(1));
}

/// The shapes of `benches/adversarial.rs`, at 8 MB, forced through each strategy while
/// /healthz is polled.
fn adversarial(shape: &str) -> Value {
    let size = 8 << 20;
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Start."}),
    ];
    match shape {
        "huge_argument" => {
            let arguments = json!({"path": "a/b ".repeat(size / 4)}).to_string();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "write", "arguments": arguments}}]}));
            m.push(json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}));
        }
        "parallel_calls" => {
            let n = size / 160;
            let calls: Vec<Value> = (0..n).map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "read", "arguments": format!("{{\"path\":\"f{i}.rs\"}}")}})).collect();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for i in 0..n {
                m.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "fn f() {}"}));
            }
        }
        "tiny_messages" => {
            for i in 0..size / 40 {
                m.push(json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("m{i}")}));
            }
        }
        _ => {
            m.push(json!({"role": "assistant", "content": "Send it."}));
            m.push(json!({"role": "user", "content": "a".repeat(size)}));
        }
    }
    m.push(json!({"role": "assistant", "content": "Done."}));
    m.push(json!({"role": "user", "content": "Carry on."}));
    json!({"model": "gpt-4o", "messages": m})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn adversarial_bodies_are_bounded_and_health_stays_responsive() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(&provider.url(), &[]).await;
    let health = {
        let url = abridge.admin_url("/healthz");
        tokio::spawn(async move {
            let client = http();
            let mut slowest = Duration::ZERO;
            let until = Instant::now() + Duration::from_secs(600);
            loop {
                let t = Instant::now();
                if client.get(&url).send().await.is_err() || Instant::now() > until {
                    return slowest;
                }
                slowest = slowest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let client = http();
    let mut lines = Vec::new();
    let mut slowest = Duration::ZERO;
    for shape in [
        "huge_argument",
        "parallel_calls",
        "tiny_messages",
        "letter_run",
    ] {
        let body = adversarial(shape).to_string();
        for strategy in ["deterministic", "recency", "structured", "llm_replace"] {
            let t = Instant::now();
            let response = client
                .post(abridge.url("/v1/chat/completions"))
                .header("authorization", "Bearer sk-adversary")
                .header("x-abridge-compact", "force")
                .header("x-abridge-strategy", strategy)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = response.status();
            let _ = response.bytes().await;
            let took = t.elapsed();
            assert!(status.is_success(), "{shape} {strategy}: {status}");
            assert!(
                took < Duration::from_secs(20),
                "{shape} {strategy}: {took:?}"
            );
            slowest = slowest.max(took);
            lines.push(format!(
                "{shape} (8 MB), {strategy}: {} ms",
                took.as_millis()
            ));
        }
    }
    drop(abridge);
    let slowest_health = health.await.unwrap();
    lines.push(format!(
        "slowest request {} ms; slowest /healthz meanwhile {} ms",
        slowest.as_millis(),
        slowest_health.as_millis()
    ));
    report(
        "Adversarial 8 MB bodies, forced through every strategy",
        &lines,
    );
    assert!(
        slowest_health < Duration::from_secs(1),
        "{slowest_health:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn cross_tenant_canaries_share_nothing() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(
        &provider.url(),
        &[
            ("ABRIDGE_REDIS_URL", redis.url()),
            ("ABRIDGE_COMPACTION__THRESHOLD_TOKENS", "100000".into()),
        ],
    )
    .await;
    let client = http();
    let styles = ["authorization", "x-api-key", "api-key", "x-goog-api-key"];
    let (mut pairs, mut shared) = (0, 0);
    let mut keys = std::collections::HashSet::new();
    for pair in 0..25 {
        for style in styles {
            let body = conversation(&format!("canary-{pair}"), 4);
            let value = |who: &str| match style {
                "authorization" => format!("Bearer sk-{who}-{pair}"),
                _ => format!("{who}-{pair}"),
            };
            let a = client
                .post(abridge.url("/v1/chat/completions"))
                .header(style, value("alice"))
                .header("x-abridge-compact", "force")
                .json(&body)
                .send()
                .await
                .unwrap();
            let b = client
                .post(abridge.url("/v1/chat/completions"))
                .header(style, value("bob"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let header = |r: &reqwest::Response, n: &str| {
                r.headers().get(n).map(|v| v.to_str().unwrap().to_owned())
            };
            assert_eq!(header(&a, "x-abridge-compacted").as_deref(), Some("true"));
            let (ka, kb) = (
                header(&a, "x-abridge-conversation").unwrap(),
                header(&b, "x-abridge-conversation").unwrap(),
            );
            if ka == kb || header(&b, "x-abridge-compacted").as_deref() == Some("true") {
                shared += 1;
            }
            keys.insert(ka);
            keys.insert(kb);
            pairs += 1;
        }
    }
    report(
        "Cross-tenant canaries (Redis)",
        &[format!(
            "{pairs} tenant pairs over 4 credential headers sent identical histories: {shared} shared anything, {} distinct conversation keys",
            keys.len()
        )],
    );
    assert_eq!(shared, 0);
    assert_eq!(keys.len(), pairs * 2);
}
