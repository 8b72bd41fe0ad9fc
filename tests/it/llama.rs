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
use std::time::Duration;

use abridge::strategies::Strategy;

use crate::common::llama::{LlamaServer, listening_port};
use crate::common::{Proxy, config_for};

const THRESHOLD: u64 = 1500;

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

async fn conversation(strategy: Strategy) -> String {
    let llama = LlamaServer::start(4096, &[]).await;
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
    let llama = LlamaServer::start(WINDOW, &[]).await;
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
