//! A real OpenAI-compatible provider: llama.cpp's `llama-server` with SmolLM2-135M,
//! built and fetched by `scripts/setup-llama` (cached in target/llama). A conversation
//! driven through abridge with the official Python SDK grows past a small threshold, with
//! `recency` and with `structured` (the summariser is the same llama-server): the
//! provider-reported prompt tokens drop after compaction and stay under the threshold,
//! every turn is answered, streaming works, and a summary either passes the fidelity
//! check or falls back — never fails the request. Served with a small window (`-c 2048`)
//! to abridge in its default configuration, which does not know the model: the window
//! is asked of the server and a conversation grows to four windows without an overflow
//! (its compacted requests carry the `abridge_recall` tool, which the server accepts).
//! `#[ignore]`d for a bare `cargo test`; `scripts/test` runs it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use abridge::strategies::Strategy;

use crate::common::{Proxy, client, config_for};

const THRESHOLD: u64 = 1500;

fn llama_dir() -> PathBuf {
    std::env::var_os("ABRIDGE_LLAMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/llama"))
}

/// `llama-server` on a port it chose itself, killed when dropped.
struct LlamaServer {
    child: tokio::process::Child,
    url: String,
}

impl LlamaServer {
    async fn start() -> Self {
        Self::with_window(4096).await
    }

    /// Served with a context of `window` tokens, on port 0: the port it bound is read
    /// from its log, so no other process can take it first.
    async fn with_window(window: u64) -> Self {
        let dir = llama_dir();
        let (binary, model) = (
            dir.join("bin/llama-server"),
            dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        );
        assert!(
            binary.exists() && model.exists(),
            "run scripts/setup-llama (scripts/test does) to build llama-server"
        );
        let mut child = tokio::process::Command::new(binary)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            // One thread for generation, two for the prompt: stable timings on 2 cores.
            .args([
                "-c",
                &window.to_string(),
                "-t",
                "1",
                "-tb",
                "2",
                "--no-webui",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (sender, mut lines) = tokio::sync::mpsc::unbounded_channel();
        forward(child.stdout.take().unwrap(), sender.clone());
        forward(child.stderr.take().unwrap(), sender);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = String::new();
        let port = loop {
            match tokio::time::timeout_at(deadline.into(), lines.recv()).await {
                Ok(Some(line)) => match listening_port(&line) {
                    Some(port) => break port,
                    None => seen.push_str(&(line + "\n")),
                },
                Ok(None) => panic!("llama-server exited:\n{seen}"),
                Err(_) => panic!("llama-server named no port within 60 s:\n{seen}"),
            }
        };
        let health = format!("http://127.0.0.1:{port}/health");
        loop {
            if client()
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/v1"),
        }
    }
}

/// Sends `pipe`'s lines to `lines` until it closes; reading on after nobody listens
/// keeps the server from blocking on a full pipe.
fn forward(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    lines: tokio::sync::mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut reader = tokio::io::BufReader::new(pipe).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            let _ = lines.send(line);
        }
    });
}

/// The port in llama-server's line saying it listens: `HTTP server is listening,
/// hostname: 127.0.0.1, port: 41234, ...` (its versions all print it once bound, the
/// port chosen for port 0), or `server is listening on http://127.0.0.1:41234 - ...`.
fn listening_port(line: &str) -> Option<u16> {
    if !line.contains("listening") {
        return None;
    }
    let (_, rest) = line
        .split_once("port: ")
        .or_else(|| line.split_once("http://127.0.0.1:"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&port| port != 0)
}

#[test]
fn the_port_llama_server_bound_is_read_from_its_log() {
    let lines = [
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 41234, http threads: 3",
        "main: server is listening on http://127.0.0.1:41235 - starting the main loop",
    ];
    assert_eq!(lines.map(listening_port), [Some(41234), Some(41235)]);
    for other in [
        "main: binding port with default address family",
        "srv  load_model: loading model 'SmolLM2.gguf' (port: 8080 in the docs)",
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 0",
    ] {
        assert_eq!(listening_port(other), None, "{other}");
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn conversation(strategy: Strategy) -> String {
    let llama = LlamaServer::start().await;
    let mut config = config_for(&llama.url);
    config.compaction.threshold_tokens = THRESHOLD;
    config.compaction.strategy = strategy;
    config.summary.timeout_ms = 120_000;
    let proxy = Proxy::start_with(config).await;
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sdk/venv/bin/python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/llama_conversation.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .args([proxy.url("/v1"), THRESHOLD.to_string(), "26".to_owned()])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(900), run)
        .await
        .expect("the conversation finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "{strategy}:\n{stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            what_was_compacted(&proxy).await
        );
    }
    let stats = proxy.stats();
    assert!(stats.compactions_total() >= 1, "{stats:?}");
    assert_eq!(stats.upstream_errors, 0);
    stdout
}

/// The compactions and the checkpoints they stored, summaries included: what a failure
/// report needs to tell a real model's answer from abridge's estimate of it.
async fn what_was_compacted(proxy: &Proxy) -> String {
    let events = proxy.state.compactor().recent_compactions();
    let mut report = format!("compactions, newest first: {events:#?}\n");
    let Some(conversation) = events.first().map(|e| e.conversation) else {
        return report;
    };
    if let Ok(loaded) = proxy.state.store().load(&conversation).await {
        for c in &loaded.checkpoints {
            report.push_str(&format!(
                "checkpoint head {} through {} {} tokens {} -> {} gate {:?}\nsummary:\n{}\n",
                c.head,
                c.through,
                c.strategy,
                c.tokens_before,
                c.tokens_after,
                c.gate,
                c.summary.as_deref().unwrap_or("(none)")
            ));
        }
    }
    report
}

#[tokio::test]
#[ignore = "needs llama-server from scripts/setup-llama (scripts/test runs it)"]
async fn a_real_model_conversation_compacts_with_recency() {
    let out = conversation(Strategy::Recency).await;
    assert!(out.contains(r#""strategies": ["recency"]"#), "{out}");
}

#[tokio::test]
#[ignore = "needs llama-server from scripts/setup-llama (scripts/test runs it)"]
async fn a_real_model_conversation_compacts_with_structured_or_falls_back() {
    let out = conversation(Strategy::Structured).await;
    // A 135M model rarely writes the whole template: the summary passes the fidelity
    // check or the turn falls back to recency and says so — either way it is answered.
    let summary = out.lines().last().unwrap();
    assert!(
        summary.contains(r#""structured""#) || summary.contains("fell back to recency"),
        "{out}"
    );
}

#[tokio::test]
#[ignore = "needs llama-server from scripts/setup-llama (scripts/test runs it)"]
async fn a_small_window_is_learned_from_the_server_and_never_overflowed() {
    const WINDOW: u64 = 2048;
    let llama = LlamaServer::with_window(WINDOW).await;
    let mut config = config_for(&llama.url);
    config.summary.timeout_ms = 120_000;
    let proxy = Proxy::start_with(config).await;
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a terse assistant."})];
    let slow = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let mut chars = 0;
    let mut turn = 0;
    while chars < 4 * 4 * WINDOW as usize {
        turn += 1;
        let ask = format!(
            "Note {turn}: the canary for release {turn} stays healthy on port {}. {}",
            8000 + turn,
            "Keep the rollout slow and watch the error budget. ".repeat(8)
        );
        messages.push(serde_json::json!({"role": "user", "content": ask}));
        // A real model on a loaded 2-core machine: minutes, not the shared client's 20 s.
        let answer = slow
            .post(proxy.url("/v1/chat/completions"))
            .json(&serde_json::json!({"model": "smollm2", "messages": messages, "max_tokens": 24}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(status, 200, "turn {turn}: {body}");
        let reply = body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
        chars = messages
            .iter()
            .map(|m| m["content"].as_str().unwrap_or("").len())
            .sum();
    }
    let stats = proxy.stats();
    assert_eq!(stats.context_overflows, 0, "{stats:?}");
    // The compacted requests carried the recall tool, and the real server took it.
    assert_eq!(stats.recall_failures, 0);
    assert!(stats.compactions_total() >= 1, "{stats:?}");
    let learned = proxy.state.compactor().learned_windows();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(learned[0].learned.window, WINDOW);
    assert_eq!(learned[0].learned.source, abridge::windows::Source::Asked);
}
