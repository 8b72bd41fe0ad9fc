//! The provider compaction APIs abridge serves, asked by real clients of a real server
//! that lacks them: llama.cpp's `llama-server` (SmolLM2-135M, `scripts/setup-llama`),
//! which answers `/v1/responses` and `/v1/messages` but knows no compaction.
//!
//! - Codex CLI (the real binary) on its built-in `openai` provider, pointed at abridge
//!   (`responses_compaction = "serve"`): `codex exec` then `codex exec resume --last`
//!   until its `model_auto_compact_token_limit` makes it compact remotely (v2, a
//!   `compaction_trigger`), and on after that.
//! - The official Anthropic Python SDK with the compaction and context-management betas
//!   (`tests/sdk/anthropic_compaction.py`, as against the fake provider in `sdk.rs`).
//!
//! A recording relay between abridge and llama-server keeps what reached the server:
//! never a compaction item, trigger or block, nor `context_management`. The model's
//! answers are gibberish more often than not at this size; what is tested is the
//! plumbing. The window is 32,768 tokens (Codex's instructions and tools alone are about
//! 4,600 of SmolLM2's): over the model's trained 8,192, so the server is told the model's
//! context is that large, and abridge asks the server for it. `#[ignore]`d for a bare
//! `cargo test`; `scripts/test` runs them.

use std::path::Path;
use std::time::{Duration, Instant};

use abridge::config::ProviderCompaction;

use crate::codex_remote::{Run, ask, codex_home_for, codex_within, compacted_and_carried_on};
use crate::common::llama::LlamaServer;
use crate::common::recorder::{Recorded, Recorder};
use crate::common::{Proxy, config_for};
use crate::sdk::{run_within, script, sdk_dir};

const WINDOW: u64 = 32_768;

/// llama-server with a window of [`WINDOW`] and `extra` arguments, behind a recording
/// relay; abridge's upstream is the relay's `/v1`.
async fn llama_behind_relay(extra: &[&str]) -> (LlamaServer, Recorder) {
    // Flash attention: prompt processing of Codex's long prompt stays near linear.
    let mut args = vec!["-fa", "on"];
    args.extend_from_slice(extra);
    let llama = LlamaServer::start(WINDOW, &args).await;
    let relay = Recorder::start(llama.url.trim_end_matches("/v1")).await;
    (llama, relay)
}

/// abridge learned the server's window by asking it.
fn assert_window_asked(proxy: &Proxy) {
    let learned = proxy.state.compactor().learned_windows();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(learned[0].learned.window, WINDOW);
    assert_eq!(learned[0].learned.source, abridge::windows::Source::Asked);
}

/// Every answer is exactly this many tokens (`-n` with `--ignore-eos`): the history grows
/// by a known amount a turn whatever the model says.
const REPLY_TOKENS: &str = "256";

/// Codex's limit, in the server's tokens: its instructions and tools (about 4,600) and
/// four turns (about 300 each) pass it, so it compacts before the fifth or sixth; a
/// compacted history (the instructions, the user messages, abridge's summary, about
/// 5,300) stays under it, or Codex would compact again at once, for ever.
const LIMIT: u64 = 6_200;

/// Turns before the question (each its own `codex exec`).
const TURNS: usize = 7;

#[tokio::test]
#[ignore = "needs Codex CLI and llama-server, which scripts/test installs"]
async fn codex_builtin_provider_compacts_remotely_in_front_of_llama_server() {
    let started = Instant::now();
    let (_llama, relay) = llama_behind_relay(&["-n", REPLY_TOKENS, "--ignore-eos"]).await;
    let mut config = config_for(&relay.url("/v1"));
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    let proxy = Proxy::start_with(config).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let model = format!("model = \"smollm2\"\nmodel_context_window = {WINDOW}");
    codex_home_for(home.path(), &model, &proxy.url("/v1"), LIMIT);
    // A real model on 2 loaded cores: the first prompt alone can take minutes.
    let exec = |args: Vec<String>| {
        let (home, work) = (home.path(), work.path());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            codex_within(Duration::from_secs(600), home, work, &args).await
        }
    };
    let mut runs = vec![exec(vec![ask(1)]).await];
    for n in 2..=TURNS {
        runs.push(exec(vec!["resume".into(), "--last".into(), ask(n)]).await);
    }
    let question = "Which port does the quokkabase replica listen on?".to_owned();
    runs.push(exec(vec!["resume".into(), "--last".into(), question]).await);
    assert_window_asked(&proxy);
    let figures = assert_codex_served(&relay, &proxy, &runs, home.path());
    eprintln!(
        "Codex on its built-in provider -> abridge -> llama-server: {figures}; runs took {:?} s; \
         {:.0} s in all",
        runs.iter().map(|r| r.took.as_secs()).collect::<Vec<_>>(),
        started.elapsed().as_secs_f64()
    );
}

/// What reached llama-server and what Codex recorded: no compaction item, trigger,
/// `/responses/compact` or `context_management` at the server; Codex compacted with
/// abridge's item (`abridge.v1.`), and the requests after it are shorter; no error but
/// the 426s; the fact of the second turn still reaches the model after the compaction.
fn assert_codex_served(relay: &Recorder, proxy: &Proxy, runs: &[Run], home: &Path) -> String {
    let sent = relay.requests();
    assert!(
        sent.iter().all(|r| !r.path.ends_with("/responses/compact")),
        "a /responses/compact reached llama-server"
    );
    let bodies: Vec<serde_json::Value> = sent
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .map(Recorded::json)
        .collect();
    // One model call a run at least (the compaction asks the server nothing).
    assert!(bodies.len() >= runs.len(), "{} requests", bodies.len());
    for body in &bodies {
        assert!(body.get("context_management").is_none(), "{body}");
    }
    crate::codex_remote::no_compaction_items(&bodies, "llama-server");
    let runs_n = runs.len() as u64;
    let (compacted, sizes) = compacted_and_carried_on(proxy, home, &bodies, runs_n);
    let sessions = crate::codex_remote::sessions_recorded(home);
    assert!(
        sessions.contains("abridge.v1."),
        "Codex's compaction item is not abridge's"
    );
    assert!(!runs.last().unwrap().stdout.trim().is_empty(), "no answer");
    format!(
        "{} requests reached llama-server (input items {sizes:?}), {compacted} compactions \
         recorded by Codex, {runs_n} 426s",
        bodies.len(),
    )
}

#[tokio::test]
#[ignore = "needs the anthropic Python SDK and llama-server, which scripts/test installs"]
async fn anthropic_python_sdk_compaction_betas_in_front_of_llama_server() {
    let started = Instant::now();
    // Short answers: the SDK asks for 256 tokens, the server gives 32 at most.
    let (_llama, relay) = llama_behind_relay(&["-n", "32"]).await;
    let proxy = Proxy::start_with(config_for(&relay.url("/v1"))).await;
    let base = proxy.url("/v1").trim_end_matches("/v1").to_owned();
    let out = run_within(
        // Measured 391 s alone; scripts/test runs it beside the other ignored tests.
        Duration::from_secs(2400),
        sdk_dir().join("venv/bin/python"),
        vec![
            script("anthropic_compaction.py").display().to_string(),
            base,
            "900".to_owned(),
        ],
    )
    .await;
    crate::sdk::every_compaction_scenario_passed(&out);
    let sent = relay.requests();
    // The whole and streamed compactions, the block sent back, the cleared tool uses
    // (the paused compaction and the invalid edit ask the server nothing).
    let messages = sent.iter().filter(|r| r.path == "/v1/messages").count();
    assert_eq!(messages, 4, "{:?}", paths(&sent));
    for request in &sent {
        let body = String::from_utf8_lossy(&request.body);
        assert!(
            !body.contains("\"compaction\"")
                && !body.contains("context_management")
                && !body.contains("compact_20260112")
                && !body.contains("clear_tool_uses"),
            "{body}"
        );
    }
    assert_eq!(proxy.stats().responses_5xx, 0);
    eprintln!(
        "the Anthropic SDK's compaction betas -> abridge -> llama-server: {messages} requests \
         reached the server, prompts of {:?} characters; {:.0} s in all",
        sent.iter().map(|r| r.body.len()).collect::<Vec<_>>(),
        started.elapsed().as_secs_f64()
    );
}

fn paths(sent: &[Recorded]) -> Vec<String> {
    sent.iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}
