//! The fault and abuse suite: the release binary (`target/release/abridge`, built by
//! `scripts/test`) as a separate process against real Redis servers and the fake
//! provider, under load and under attack. Each test writes what it measured to
//! `target/fault-report.txt`, which `scripts/test` prints.
//!
//! Ignored by a bare `cargo test` (it needs the release build); `scripts/test` runs it.
//!
//! Here: the release-binary harness and the faults (Redis killed and paused, provider
//! faults, clients that leave); `abuse` has the attacks.

mod abuse;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::binary::{Binary, Launch};
use crate::common::chat_body;
use crate::common::redis::{RedisServer, command_list};

/// The release binary, running, in front of `upstream`, with `env` on top of a clean
/// environment, on ports it chose itself. Killed when dropped.
struct Release {
    binary: Binary,
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
}

fn release_binary() -> PathBuf {
    std::env::var_os("ABRIDGE_RELEASE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/abridge"),
        PathBuf::from,
    )
}

impl Release {
    async fn start(upstream: &str, env: &[(&str, String)]) -> Self {
        let bin = release_binary();
        assert!(
            bin.exists(),
            "{} is missing: `cargo build --release --bin abridge` (scripts/test does)",
            bin.display()
        );
        let mut all = vec![
            ("ABRIDGE_UPSTREAM", upstream.to_owned()),
            ("ABRIDGE_LOG__FILTER", "error".to_owned()),
        ];
        all.extend(env.iter().cloned());
        let binary = Launch::new(&bin, all).start().await;
        Self {
            addr: binary.listen,
            admin: binary.admin,
            binary,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Peak resident memory of the process so far (VmHWM), in MB.
    fn peak_rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.binary.pid()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

/// Appends a section to the report (one write, so parallel tests do not interleave).
fn report(title: &str, lines: &[String]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fault-report.txt");
    let mut text = format!("## {title}\n");
    for line in lines {
        text.push_str("- ");
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A conversation of `turns` user turns, for tenant `key`.
fn conversation(key: &str, turns: usize) -> Value {
    let mut m = vec![json!({"role": "system", "content": "You are terse."})];
    for i in 0..turns {
        m.push(
            json!({"role": "user", "content": format!("{key} asks {i}: {}", "words ".repeat(80))}),
        );
        m.push(
            json!({"role": "assistant", "content": format!("Answer {i}. {}", "more ".repeat(80))}),
        );
    }
    m.push(json!({"role": "user", "content": "Go on."}));
    json!({"model": "fake-model", "messages": m})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn redis_killed_and_paused_under_load_fails_no_request() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(
        &provider.url(),
        &[
            ("ABRIDGE_REDIS_URL", redis.url()),
            ("ABRIDGE_COMPACTION__THRESHOLD_TOKENS", "2000".into()),
        ],
    )
    .await;
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let slowest = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(12);
    let mut clients = Vec::new();
    for c in 0..8 {
        let (url, ok, failed, slowest) = (
            abridge.url("/v1/chat/completions"),
            ok.clone(),
            failed.clone(),
            slowest.clone(),
        );
        clients.push(tokio::spawn(async move {
            let client = http();
            let mut turns = 1;
            while Instant::now() < stop_at {
                let started = Instant::now();
                let answer = client
                    .post(&url)
                    .header("authorization", format!("Bearer sk-load-{c}"))
                    .json(&conversation(&format!("c{c}"), turns))
                    .send()
                    .await;
                let status = answer.map(|r| r.status().as_u16()).unwrap_or(0);
                if status == 200 {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                slowest.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                turns = turns % 12 + 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.pause();
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.resume();
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.restart();
    for c in clients {
        c.await.unwrap();
    }
    // State is written again after the recovery.
    let client = http();
    let mut recovered = false;
    for _ in 0..150 {
        client
            .post(abridge.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-after")
            .json(&conversation("after", 2))
            .send()
            .await
            .unwrap();
        if !command_list(redis.port, &["KEYS", "abridge:*:state"]).is_empty() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, failed, slowest) = (
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        slowest.load(Ordering::Relaxed),
    );
    report(
        "Redis paused (SIGSTOP, 2 s) and killed (SIGKILL, 2 s) under 8 concurrent clients",
        &[
            format!("{ok} requests answered 200, {failed} failed"),
            format!("slowest request {slowest} ms (store.response_timeout_ms is 200)"),
            format!("state written again after the restart: {recovered}"),
        ],
    );
    assert_eq!(failed, 0, "requests failed by abridge's machinery");
    assert!(ok > 50, "{ok}");
    assert!(recovered);
}

/// Reads a streamed response to its end: the bytes, and whether it ended cleanly.
async fn drain(response: reqwest::Response) -> (Vec<u8>, bool) {
    let mut response = response;
    let mut out = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(c)) => out.extend_from_slice(&c),
            Ok(None) => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn provider_faults_end_in_honest_errors_with_bounded_memory() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(
        &provider.url(),
        &[("ABRIDGE_TIMEOUTS__STREAM_IDLE_MS", "500".into())],
    )
    .await;
    let client = http();
    let post = |fault: (&'static str, &'static str)| {
        client
            .post(abridge.url("/v1/chat/completions"))
            .header(fault.0, fault.1)
            .body(chat_body(true))
            .send()
    };
    let mut lines = Vec::new();
    // Reset after the first event: the client's stream fails, it never sees [DONE]. On
    // a loaded machine the reset can beat abridge's response head out of the door: the
    // connection then closes before any response, which is as honest (never a
    // complete-looking answer).
    // A reset that comes before abridge has relayed anything (it reads a stream's first
    // event to see whether it reports an overflow) is answered as an error instead.
    let (status, bytes, clean) = match post(("x-fake-reset", "1")).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let (bytes, clean) = drain(response).await;
            (status, bytes, clean)
        }
        Err(_) => (0, Vec::new(), false),
    };
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains("[DONE]"), "{text}");
    if status == 200 {
        assert!(!clean, "{text}");
        lines.push(format!(
            "reset mid-stream: the client's stream failed after {} bytes, no [DONE]",
            bytes.len()
        ));
    } else {
        assert!(status == 0 || status == 502, "{status}: {text}");
        lines.push(format!(
            "reset mid-stream before anything was relayed: {status} (0: connection closed)"
        ));
    }
    // A stall after the first event: cut at stream_idle_ms, incomplete.
    let started = Instant::now();
    let (bytes, clean) = match post(("x-fake-stall", "body")).await {
        Ok(response) => drain(response).await,
        Err(_) => (Vec::new(), false),
    };
    assert!(!clean && !String::from_utf8_lossy(&bytes).contains("[DONE]"));
    lines.push(format!(
        "stall mid-stream: cut after {} ms (stream_idle_ms 500), incomplete",
        started.elapsed().as_millis()
    ));
    // Garbage: relayed as the provider sent it; abridge adds nothing and fails nothing.
    let response = post(("x-fake-garbage", "1")).await.unwrap();
    assert_eq!(response.status(), 200);
    let (bytes, _) = drain(response).await;
    assert_eq!(bytes.len(), 4096);
    lines.push("garbage stream: relayed byte for byte (4,096 bytes), usage not read".to_owned());
    // Gzip bombs of 256 MB each: cut at limits.max_decoded_bytes (64 MB), memory bounded.
    let before = abridge.peak_rss_mb();
    let mut cut = 0;
    for _ in 0..8 {
        let sent = client
            .post(abridge.url("/v1/chat/completions"))
            .header("x-fake-gzip-bomb", (256usize << 20).to_string())
            .body(chat_body(false))
            .send()
            .await;
        let complete = match sent {
            Ok(r) => drain(r).await.1,
            Err(_) => false,
        };
        if !complete {
            cut += 1;
        }
    }
    let peak = abridge.peak_rss_mb();
    assert_eq!(cut, 8, "every bomb is cut");
    assert!(peak < 400.0, "peak RSS {peak:.0} MB");
    lines.push(format!(
        "8 gzip bombs of 256 MB: all cut; peak RSS {before:.0} MB before, {peak:.0} MB after"
    ));
    report(
        "A provider that resets, stalls, sends garbage or gzip bombs",
        &lines,
    );
}

/// `n` gzip bombs of `size` bytes at once (`stream`: as event streams), each read by a
/// client to its end: how many were cut.
async fn bombs_at_once(abridge: &Release, n: usize, size: usize, stream: bool) -> usize {
    let sends = (0..n).map(|_| {
        http()
            .post(abridge.url("/v1/chat/completions"))
            .header("x-fake-gzip-bomb", size.to_string())
            .body(chat_body(stream))
            .send()
    });
    let mut cut = 0;
    for sent in futures_util::future::join_all(sends).await {
        let complete = match sent {
            Ok(r) => drain(r).await.1,
            Err(_) => false,
        };
        cut += usize::from(!complete);
    }
    cut
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn gzip_bombs_at_once_are_bounded_across_the_process() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(&provider.url(), &[]).await;
    let mut lines = Vec::new();
    let before = abridge.peak_rss_mb();
    // 1 GB each, decoded at most 64 MB each (limits.max_decoded_bytes): every one cut.
    for stream in [false, true] {
        let cut = bombs_at_once(&abridge, 8, 1 << 30, stream).await;
        assert_eq!(cut, 8, "every bomb is cut (stream: {stream})");
    }
    let peak = abridge.peak_rss_mb();
    // Each response holds one decoded chunk at most (~0.5 MB) and what its tap keeps
    // to read usage (a JSON body up to 16 MB, shared limits.max_inflight_body_bytes):
    // eight at once used to take ~40 MB each on top.
    assert!(peak < 180.0, "peak RSS {peak:.0} MB");
    lines.push(format!(
        "8 gzip bombs of 1 GB at once, as JSON, then as event streams: all cut; peak RSS {before:.0} MB before, {peak:.0} MB after"
    ));
    report("Gzip bombs at once", &lines);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the fault suite: needs the release build, which scripts/test makes"]
async fn a_client_that_leaves_cancels_the_upstream_request_within_a_second() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let abridge = Release::start(&provider.url(), &[]).await;
    let mut lines = Vec::new();
    for (what, header, value) in [
        ("mid-stream", "x-fake-delay-ms", "200"),
        ("before the response", "x-fake-latency-ms", "20000"),
    ] {
        let before = provider.cancelled();
        let seen = provider.requests().len();
        let mut stream = TcpStream::connect(abridge.addr).await.unwrap();
        let body = chat_body(true);
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{header}: {value}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        if what == "mid-stream" {
            let mut buf = [0u8; 512];
            let _ = stream.read(&mut buf).await.unwrap();
        } else {
            assert!(
                provider
                    .wait_until(Duration::from_secs(5), |p| p.requests().len() > seen)
                    .await
            );
        }
        let left = Instant::now();
        drop(stream);
        let cancelled = provider
            .wait_until(Duration::from_secs(5), |p| p.cancelled() > before)
            .await;
        let after = left.elapsed();
        assert!(
            cancelled && after < Duration::from_secs(1),
            "{what}: {after:?}"
        );
        lines.push(format!(
            "client gone {what}: upstream cancelled after {} ms",
            after.as_millis()
        ));
    }
    report("Client disconnects", &lines);
}
