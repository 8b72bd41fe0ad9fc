//! Lifecycle: client disconnects cancel the upstream, the binary drains on SIGTERM,
//! refuses bad configuration (TLS settings for Redis included), keeps credentials out
//! of its logs, warns about unverified TLS to Redis, and serves health on the admin
//! listener only.

use std::process::Command;
use std::time::Duration;

use fake_provider::{Behavior, FakeProvider};

use crate::common::binary::{Binary, Launch};
use crate::common::{Fetch, chat_body, client, closed_port, eventually, setup, setup_with};

#[tokio::test]
async fn a_client_leaving_a_stream_closes_the_upstream_connection() {
    let (provider, proxy) = setup_with(Behavior {
        chunk_delay: Duration::from_millis(200),
        reply_words: 30,
        ..Behavior::default()
    })
    .await;
    let mut response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    response.chunk().await.unwrap().unwrap();
    drop(response);
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| p.cancelled() == 1)
            .await,
        "the provider must see its connection close"
    );
    assert_eq!(provider.completed(), 0);
    assert!(eventually(Duration::from_secs(2), || proxy.stats().client_gone == 1).await);
}

#[tokio::test]
async fn a_client_leaving_before_the_response_cancels_the_upstream_request() {
    let (provider, proxy) = setup().await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let result = impatient
        .post(proxy.url("/v1/chat/completions"))
        .header("x-fake-stall", "headers")
        .body(chat_body(false))
        .send()
        .await;
    assert!(result.is_err());
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| p.cancelled() == 1)
            .await,
        "the provider must see its connection close"
    );
}

#[tokio::test]
async fn health_is_on_the_admin_listener_only() {
    let (_provider, proxy) = setup().await;
    let response = client()
        .get(format!("http://{}/healthz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), r#"{"status":"ok"}"#);
    let response = client()
        .get(format!("http://{}/v1/models", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(
        client()
            .get(proxy.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

/// The binary in front of `provider`, on port 0, with `extra` in its environment; its
/// proxy's base URL.
async fn start_binary(provider: &FakeProvider, extra: &[(&str, String)]) -> (Binary, String) {
    let mut env = vec![("ABRIDGE_UPSTREAM", provider.url())];
    env.extend(extra.iter().cloned());
    let binary = Launch::new(env!("CARGO_BIN_EXE_abridge"), env)
        .start()
        .await;
    let base = format!("http://{}", binary.listen);
    (binary, base)
}

#[tokio::test]
async fn sigterm_stops_accepting_and_drains_in_flight_streams() {
    let provider = FakeProvider::start(Behavior {
        chunk_delay: Duration::from_millis(100),
        reply_words: 12,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let (mut binary, base) = start_binary(
        &provider,
        &[("ABRIDGE_TIMEOUTS__SHUTDOWN_GRACE_MS", "10000".into())],
    )
    .await;
    let mut response = client()
        .post(format!("{base}/v1/chat/completions"))
        .body(chat_body(true))
        .send()
        .await
        .unwrap();
    let mut received = response.chunk().await.unwrap().unwrap().to_vec();

    binary.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = reqwest::Client::new()
        .get(format!("{base}/v1/models"))
        .send()
        .await;
    assert!(
        fresh.is_err(),
        "a new connection after SIGTERM must be refused"
    );

    while let Some(chunk) = response.chunk().await.unwrap() {
        received.extend_from_slice(&chunk);
    }
    assert!(
        String::from_utf8_lossy(&received).ends_with("data: [DONE]\n\n"),
        "the in-flight stream completed"
    );
    let status = binary
        .wait(Duration::from_secs(5))
        .expect("abridge exits after draining");
    assert!(status.success(), "{status:?}: {}", binary.logs());
    assert!(binary.logs().contains("draining"), "{}", binary.logs());
}

#[tokio::test]
async fn healthcheck_mode_reports_the_running_instance() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let check = |admin: std::net::SocketAddr| {
        let admin = admin.to_string();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
                .arg("--healthcheck")
                .env_clear()
                .env("ABRIDGE_ADMIN__LISTEN", admin)
                .status()
                .await
                .unwrap()
        }
    };
    assert!(
        !check(closed_port().await).await.success(),
        "nothing listens there"
    );
    let (mut binary, _) = start_binary(&provider, &[]).await;
    assert!(check(binary.admin).await.success());
    binary.signal("TERM");
    binary.wait(Duration::from_secs(5)).unwrap();
}

#[tokio::test]
async fn the_grace_period_bounds_the_drain() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let (mut binary, base) = start_binary(
        &provider,
        &[("ABRIDGE_TIMEOUTS__SHUTDOWN_GRACE_MS", "300".into())],
    )
    .await;
    let stalled = tokio::spawn(
        client()
            .post(format!("{base}/v1/chat/completions"))
            .header("x-fake-stall", "body")
            .body(chat_body(true))
            .send(),
    );
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| p.requests().len() == 1)
            .await
    );
    binary.signal("TERM");
    let status = binary
        .wait(Duration::from_secs(5))
        .expect("abridge exits when the grace period ends");
    assert!(status.success());
    assert!(
        binary.logs().contains("grace period over"),
        "{}",
        binary.logs()
    );
    stalled.abort();
}

#[test]
fn bad_configuration_is_refused_naming_the_key_and_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("abridge.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:0\"\n[timeouts]\nconect_ms = 5\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("--config")
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("timeouts.conect_ms") && err.contains(&path.display().to_string()),
        "{err}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .env_clear()
        .env("ABRIDGE_UPSTREAM", "not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ABRIDGE_UPSTREAM") && err.contains("upstream"),
        "{err}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

/// The binary's stderr after a few requests of every kind (plain, streamed, a provider
/// error, a passthrough route) carrying `SECRET` as their key, at trace level.
async fn traffic_logs(format: &str) -> String {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let (mut binary, base) = start_binary(
        &provider,
        &[
            ("ABRIDGE_LOG__FILTER", "trace".into()),
            ("ABRIDGE_LOG__FORMAT", format.into()),
            ("ABRIDGE_ADMIN__TOKEN", "admin-token-Zq81".into()),
        ],
    )
    .await;
    for (stream, extra) in [
        (false, None),
        (true, None),
        (false, Some(("x-fake-status", "401"))),
    ] {
        let mut request = client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(SECRET)
            .header("api-key", SECRET)
            .body(chat_body(stream));
        if let Some((k, v)) = extra {
            request = request.header(k, v);
        }
        request.fetch().await;
    }
    client()
        .get(format!("{base}/v1/models"))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    binary.signal("TERM");
    binary.wait(Duration::from_secs(5)).unwrap();
    binary.logs()
}

const SECRET: &str = "sk-live-Secret0042";

/// Neither a credential nor what the conversation says appears in any log line.
fn assert_nothing_private(logs: &str) {
    assert!(
        logs.lines().count() > 3,
        "trace logging produced lines: {logs}"
    );
    assert!(!logs.contains(SECRET), "credential in logs:\n{logs}");
    assert!(!logs.contains("Secret0042"));
    assert!(
        !logs.contains("admin-token-Zq81"),
        "admin token in logs:\n{logs}"
    );
    assert!(
        !logs.contains("Hello there") && !logs.contains("Be brief"),
        "message content in logs:\n{logs}"
    );
}

#[tokio::test]
async fn credentials_never_reach_the_logs() {
    let logs = traffic_logs("text").await;
    assert!(logs.contains("abridge ready"), "{logs}");
    assert_nothing_private(&logs);
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let logs = traffic_logs("json").await;
    assert_nothing_private(&logs);
    let mut messages = Vec::new();
    for line in logs.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event.get(key).is_some(), "no {key}: {line}");
        }
        messages.push(event["message"].as_str().unwrap_or_default().to_owned());
    }
    assert!(
        messages.iter().any(|m| m.starts_with("abridge ready")),
        "{messages:?}"
    );
}

#[test]
fn bad_redis_tls_settings_stop_abridge_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem").display().to_string();
    let pki = crate::common::redis_tls::pki();
    let ca = pki.ca.display().to_string();
    // The environment, and what the error must name.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 3] = [
        (
            &[
                ("ABRIDGE_REDIS_URL", "rediss://:hunter2@127.0.0.1:6380"),
                ("ABRIDGE_STORE__TLS__CA_FILE", &missing),
            ],
            &["ABRIDGE_STORE__TLS__CA_FILE", "missing-ca.pem"],
        ),
        (
            &[
                ("ABRIDGE_REDIS_URL", "redis://:hunter2@127.0.0.1:6379"),
                ("ABRIDGE_STORE__TLS__CA_FILE", &ca),
            ],
            &["store.tls.ca_file", "rediss://"],
        ),
        (
            &[
                ("ABRIDGE_REDIS_URL", "rediss://:hunter2@127.0.0.1:6380"),
                ("ABRIDGE_STORE__TLS__CERT_FILE", &ca),
            ],
            &["store.tls.key_file"],
        ),
    ];
    for (env, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(expected.iter().all(|e| err.contains(e)), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[tokio::test]
async fn unverified_tls_to_redis_is_warned_at_start_up() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let redis = crate::common::redis::shared_tls();
    let (mut binary, base) = start_binary(
        &provider,
        &[
            ("ABRIDGE_REDIS_URL", redis.url()),
            ("ABRIDGE_STORE__TLS__INSECURE", "true".into()),
        ],
    )
    .await;
    let response = client()
        .post(format!("{base}/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    binary.signal("TERM");
    binary.wait(Duration::from_secs(5)).unwrap();
    let logs = binary.logs();
    let warning = logs
        .lines()
        .find(|l| l.contains("store.tls.insecure"))
        .unwrap_or_else(|| panic!("no warning about insecure: {logs}"));
    assert!(warning.contains("WARN"), "{warning}");
    // The store worked over it (the identity secret was agreed through it).
    assert!(logs.contains("shared through the store"), "{logs}");
}

/// The request's log lines carry its id (the span field `request_id`), those logged after
/// the provider answered also the provider's (`upstream_request_id`), even with a base
/// level above the span's target; never the credential.
#[tokio::test]
async fn the_requests_log_lines_carry_its_ids() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let (binary, base) = start_binary(
        &provider,
        &[(
            "ABRIDGE_LOG__FILTER",
            "warn,abridge::error=debug,abridge::proxy=debug".into(),
        )],
    )
    .await;
    let unknown = client()
        .get(format!("{base}/nowhere"))
        .send()
        .await
        .unwrap();
    let own = unknown.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let answered = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("authorization", "Bearer sk-log-secret")
        .header("api-key", "azure-log-secret")
        .header("content-type", "application/json")
        .body(crate::common::chat_body(false))
        .send()
        .await
        .unwrap();
    let theirs = answered.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = answered.bytes().await.unwrap();
    let logged = |what: &str| binary.logs().lines().any(|l| l.contains(what));
    assert!(
        crate::common::eventually(Duration::from_secs(5), || logged("usage")).await,
        "{}",
        binary.logs()
    );
    let logs = binary.logs();
    let line = |what: &str| {
        logs.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line:\n{logs}"))
            .to_owned()
    };
    let rejected = line("rejected request");
    assert!(
        rejected.contains(&format!("request_id={own}")),
        "{rejected}"
    );
    let usage = line("usage");
    assert!(usage.contains("request_id="), "{usage}");
    assert!(
        usage.contains(&format!("upstream_request_id={theirs}")),
        "{usage}"
    );
    assert!(!logs.contains("log-secret"), "no credential in the logs");
}
