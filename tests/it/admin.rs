//! The admin listener: auth on every route, figures that match the traffic, Prometheus
//! text a real parser reads, readiness that follows the store, a preview that is exactly
//! what gets forwarded, delete and scheduled recompaction.

use std::time::Duration;

use abridge::config::Config;
use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::agent::{Agent, main_requests, messages_of};
use crate::common::redis::RedisServer;
use crate::common::{Fetch, Proxy, chat_body, client, config_for, eventually};

pub(crate) const TOKEN: &str = "admin-test-token-123";

pub(crate) fn admin_config(url: &str) -> Config {
    let mut config = config_for(url);
    config.admin.token = Some(Secret::new(TOKEN));
    config.compaction.threshold_tokens = 3000;
    config.compaction.background = false;
    config
}

/// The admin listener's `/metrics` text.
pub(crate) async fn metrics(proxy: &Proxy) -> String {
    client()
        .get(format!("http://{}/metrics", proxy.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub(crate) async fn admin(
    proxy: &Proxy,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut request = client().request(
        method.parse().unwrap(),
        format!("http://{}{path}", proxy.admin),
    );
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

const ZERO_ID: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn guarded_routes() -> Vec<(&'static str, String, Option<Value>)> {
    vec![
        ("GET", "/admin/stats".into(), None),
        ("GET", "/admin/compactions".into(), None),
        ("GET", "/admin/conversations".into(), None),
        ("GET", format!("/admin/conversations/{ZERO_ID}"), None),
        ("DELETE", format!("/admin/conversations/{ZERO_ID}"), None),
        (
            "POST",
            format!("/admin/conversations/{ZERO_ID}/compact"),
            Some(json!({})),
        ),
        (
            "POST",
            "/admin/preview".into(),
            Some(
                json!({"request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}),
            ),
        ),
    ]
}

#[tokio::test]
async fn every_admin_route_needs_the_token_and_without_one_is_disabled() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    // No token configured: 403 explaining how to set one.
    let proxy = Proxy::start(&provider.url()).await;
    for (method, path, body) in guarded_routes() {
        let (status, json, _) = admin(&proxy, method, &path, Some("anything"), body).await;
        assert_eq!(status, 403, "{method} {path}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("admin.token"),
            "{json}"
        );
    }
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    for (method, path, body) in guarded_routes() {
        let (status, _, headers) = admin(&proxy, method, &path, None, body.clone()).await;
        assert_eq!(status, 401, "{method} {path} without a token");
        assert_eq!(headers["www-authenticate"], "Bearer");
        let (status, _, _) = admin(
            &proxy,
            method,
            &path,
            Some("admin-test-token-12"),
            body.clone(),
        )
        .await;
        assert_eq!(status, 401, "{method} {path} with a wrong token");
        let (status, json, _) = admin(&proxy, method, &path, Some(TOKEN), body).await;
        assert!(
            matches!(status, 200 | 202 | 204 | 404),
            "{method} {path}: {status} {json}"
        );
    }
    // Open routes: health, readiness, metrics, and the dashboard page (which holds no data).
    for path in ["/healthz", "/readyz", "/metrics", "/admin/"] {
        let (status, _, _) = admin(&proxy, "GET", path, None, None).await;
        assert_eq!(status, 200, "{path}");
    }
    // The proxy port serves none of it.
    assert_eq!(
        client()
            .get(proxy.url("/admin/stats"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn stats_and_metrics_match_the_traffic() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    let mut prompt = 0;
    let mut completion = 0;
    for stream in [false, false, true] {
        let body = if stream {
            chat_body(true).replace(
                r#""stream":true"#,
                r#""stream":true,"stream_options":{"include_usage":true}"#,
            )
        } else {
            chat_body(false)
        };
        let text = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let usage = text
            .split("\n\n")
            .map(|e| e.strip_prefix("data: ").unwrap_or(e))
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .find_map(|v| v["usage"].as_object().cloned())
            .unwrap();
        prompt += usage["prompt_tokens"].as_u64().unwrap();
        completion += usage["completion_tokens"].as_u64().unwrap();
    }
    client().get(proxy.url("/v1/models")).fetch().await;
    client().get(proxy.url("/v1/nothing-here")).fetch().await;
    assert!(
        eventually(Duration::from_secs(2), || proxy.stats().inflight_requests
            == 0)
        .await
    );

    let (status, stats, _) = admin(&proxy, "GET", "/admin/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let c = &stats["counters"];
    assert_eq!(c["requests"], 5);
    assert_eq!(c["chat_requests"], 3);
    assert_eq!(c["responses_2xx"], 4);
    assert_eq!(
        c["responses_4xx"], 1,
        "the provider's 404 for an unknown path"
    );
    assert_eq!(c["usage_reports"], 3);
    assert_eq!(c["prompt_tokens_reported"], prompt);
    assert_eq!(c["completion_tokens_reported"], completion);
    assert_eq!(c["inflight_requests"], 0);
    assert_eq!(stats["store"]["backend"], "memory");
    assert_eq!(
        stats["active_conversations"], 1,
        "three turns of one conversation"
    );
    assert!(stats["uptime_secs"].is_u64());

    // The Prometheus text parses, and says the same.
    let text = metrics(&proxy).await;
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert_eq!(
        value(
            "abridge_requests_total",
            &[("route", "chat"), ("class", "2xx")]
        ),
        3.0
    );
    assert_eq!(
        value("abridge_requests_total", &[("route", "passthrough")]),
        2.0
    );
    assert_eq!(
        value("abridge_prompt_tokens_reported_total", &[]),
        prompt as f64
    );
    assert_eq!(value("abridge_store_healthy", &[]), 1.0);
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("abridge_added_latency_seconds"))
    );
    assert!(
        scrape
            .samples
            .iter()
            .all(|s| s.metric.starts_with("abridge_")),
        "every metric is abridge_*"
    );
}

#[tokio::test]
async fn reading_the_stats_adds_no_series_to_the_metrics() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    let before = metrics(&proxy).await;
    let (status, stats, _) = admin(&proxy, "GET", "/admin/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    assert_eq!(stats["counters"]["requests"], 0, "{stats}");
    assert_eq!(metrics(&proxy).await, before, "no zero series appeared");
    assert!(!before.contains("abridge_compactions_total{"), "{before}");
}

#[tokio::test]
async fn readiness_follows_the_store_while_requests_keep_succeeding() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = admin_config(&provider.url());
    config.store.redis_url = Some(Secret::new(redis.url()));
    let proxy = Proxy::start_with(config).await;
    let (status, body, _) = admin(&proxy, "GET", "/readyz", None, None).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ready")));

    redis.stop();
    for _ in 0..3 {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .body(chat_body(false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "fail-open: requests succeed without the store"
        );
    }
    let degraded = async {
        for _ in 0..50 {
            let (status, body, _) = admin(&proxy, "GET", "/readyz", None, None).await;
            if status == 503 {
                return Some(body);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    };
    let body = degraded.await.expect("readyz reports the store down");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["store"]["healthy"], false);
    // The store's own error text only for the operator.
    assert!(body["store"]["last_error"].is_null(), "{body}");
    let (_, body, _) = admin(&proxy, "GET", "/readyz", Some(TOKEN), None).await;
    assert!(body["store"]["last_error"].is_string(), "{body}");
    let (_, stats, _) = admin(&proxy, "GET", "/admin/stats", Some(TOKEN), None).await;
    assert_eq!(stats["store"]["healthy"], false);

    redis.restart();
    let recovered = async {
        for _ in 0..100 {
            let (status, _, _) = admin(&proxy, "GET", "/readyz", None, None).await;
            if status == 200 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(
        recovered.await,
        "readyz recovers after the store is back, without a restart"
    );
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// Drives `agent` until it has been compacted (a checkpoint exists).
async fn until_compacted(agent: &mut Agent) {
    for n in 1..=20 {
        if agent.turn(n).await.iter().any(|a| a.compacted()) {
            return;
        }
    }
    panic!("never compacted");
}

#[tokio::test]
async fn preview_is_exactly_what_is_forwarded_and_stores_nothing() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    let mut agent = Agent::new(&proxy, "sk-preview");
    until_compacted(&mut agent).await;
    agent
        .messages
        .push(json!({"role": "user", "content": "What is left to do?"}));
    let request: Value = serde_json::from_str(&agent.body()).unwrap();
    let before = proxy.stats();
    let received_before = provider.requests().len();
    let (status, preview, _) = admin(
        &proxy,
        "POST",
        "/admin/preview",
        Some(TOKEN),
        Some(json!({"request": request, "headers": {"authorization": "Bearer sk-preview"}})),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["compacted"], true);
    assert!(preview["plan"]["through"].is_u64());
    assert_eq!(proxy.stats(), before, "a preview counts nothing");
    assert_eq!(
        provider.requests().len(),
        received_before,
        "and forwards nothing"
    );

    agent.send().await;
    let forwarded = messages_of(main_requests(&provider).last().unwrap());
    assert_eq!(
        preview["messages"].as_array().unwrap(),
        &forwarded,
        "the preview is what the provider received"
    );

    // A preview of a conversation over the threshold with no checkpoint shows the plan
    // without storing it.
    let mut other = Agent::new(&proxy, "sk-preview-2");
    other.messages = agent.messages.clone();
    let request: Value = serde_json::from_str(&other.body()).unwrap();
    let (_, preview, _) = admin(
        &proxy,
        "POST",
        "/admin/preview",
        Some(TOKEN),
        Some(json!({"request": request, "headers": {"authorization": "Bearer sk-preview-2"}})),
    )
    .await;
    assert_eq!(preview["compacted"], true);
    let id = preview["conversation"].as_str().unwrap().to_owned();
    let (status, _, _) = admin(
        &proxy,
        "GET",
        &format!("/admin/conversations/{id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(
        status, 404,
        "nothing was stored for the previewed conversation"
    );
}

#[tokio::test]
async fn conversations_can_be_inspected_deleted_and_recompacted() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    let mut agent = Agent::new(&proxy, "sk-inspect");
    until_compacted(&mut agent).await;

    let (_, list, _) = admin(
        &proxy,
        "GET",
        "/admin/conversations?limit=10",
        Some(TOKEN),
        None,
    )
    .await;
    let items = list["conversations"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let id = items[0]["id"].as_str().unwrap().to_owned();
    assert!(items[0]["compactions"].as_u64().unwrap() >= 1);

    let (status, detail, _) = admin(
        &proxy,
        "GET",
        &format!("/admin/conversations/{id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let checkpoint = &detail["checkpoints"][0];
    assert_eq!(checkpoint["strategy"], "recency");
    assert!(checkpoint["tokens_before"].as_u64() > checkpoint["tokens_after"].as_u64());
    assert!(
        checkpoint["replacement"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    );
    let (_, recent, _) = admin(&proxy, "GET", "/admin/compactions", Some(TOKEN), None).await;
    assert_eq!(recent["compactions"][0]["conversation"], id);

    // Scheduled recompaction: the next turn is compacted, forced.
    let before = proxy.stats().compactions_total();
    let (status, _, _) = admin(
        &proxy,
        "POST",
        &format!("/admin/conversations/{id}/compact"),
        Some(TOKEN),
        Some(json!({"focus": "file names"})),
    )
    .await;
    assert_eq!(status, 202);
    agent
        .messages
        .push(json!({"role": "user", "content": "Continue."}));
    let answer = agent.send().await;
    assert!(answer.compacted());
    assert_eq!(
        proxy.stats().compactions_total(),
        before + 1,
        "the scheduled compaction ran"
    );
    agent
        .messages
        .push(answer.body["choices"][0]["message"].clone());
    agent
        .messages
        .push(json!({"role": "user", "content": "And then?"}));
    agent.send().await;
    assert_eq!(proxy.stats().compactions_total(), before + 1, "once");

    // Delete: the next turn is forwarded as sent (under the threshold it is not compacted).
    let (status, _, _) = admin(
        &proxy,
        "DELETE",
        &format!("/admin/conversations/{id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = admin(
        &proxy,
        "GET",
        &format!("/admin/conversations/{id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let mut short = Agent::new(&proxy, "sk-inspect");
    short.messages = agent.messages[..4].to_vec();
    short
        .messages
        .push(json!({"role": "user", "content": "Short again."}));
    let answer = short.send().await;
    assert!(!answer.compacted(), "no checkpoint survives the delete");
    assert_eq!(
        main_requests(&provider).last().unwrap().body,
        short.body().as_bytes()
    );
}

#[tokio::test]
async fn wrong_tokens_are_limited_per_address_and_the_dashboard_cannot_be_framed() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    // No token at all is not an attempt; ten wrong ones are the limit.
    for _ in 0..20 {
        let (status, _, _) = admin(&proxy, "GET", "/admin/stats", None, None).await;
        assert_eq!(status, 401);
    }
    for i in 0..10 {
        let (status, _, _) = admin(
            &proxy,
            "GET",
            "/admin/stats",
            Some("wrong-token-000000"),
            None,
        )
        .await;
        assert_eq!(status, 401, "attempt {i}");
    }
    let (status, json, headers) = admin(
        &proxy,
        "GET",
        "/admin/stats",
        Some("wrong-token-000001"),
        None,
    )
    .await;
    assert_eq!(
        status, 429,
        "further guesses are refused for the minute: {json}"
    );
    assert_eq!(headers["retry-after"], "60");
    let (status, _, _) = admin(&proxy, "GET", "/admin/stats", None, None).await;
    assert_eq!(status, 429, "and so are requests without a token");
    // The operator is never locked out by someone guessing from the same address (an
    // ingress, a NAT): the right token still gets in.
    let (status, json, _) = admin(&proxy, "GET", "/admin/stats", Some(TOKEN), None).await;
    assert_eq!(status, 200, "the right token is never refused: {json}");
    // Health and metrics stay open.
    let (status, _, _) = admin(&proxy, "GET", "/healthz", None, None).await;
    assert_eq!(status, 200);

    let (status, page, headers) = admin(&proxy, "GET", "/admin/", None, None).await;
    assert_eq!(status, 200);
    assert!(page.as_str().unwrap().contains("<script>"));
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("frame-ancestors 'none'")
            && csp.contains("script-src 'sha256-"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["x-content-type-options"], "nosniff");
}
