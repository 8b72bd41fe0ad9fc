//! Codex CLI, the real binary, on its built-in `openai` provider, through abridge in
//! `native` mode to the fake provider serving the Responses WebSocket as OpenAI does:
//! Codex talks WebSocket through abridge (the fake receives its `response.create`
//! frames, relayed), its turns complete, and its time to the first answer through
//! abridge is close to its time direct to the fake; over a session of runs, the full
//! `response.create` each run opens with is compacted by abridge as a POST body is, and
//! the session carries on. `#[ignore]`d for a bare `cargo test` (it needs the Codex CLI
//! that scripts/test installs).

use std::path::Path;
use std::time::Duration;

use abridge::config::ProviderCompaction;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};

use crate::codex_remote::{ask, codex_home_for, codex_within};
use crate::common::{Proxy, compacting, config_for};

/// The `response.create` frames the fake received (its handshakes have no body).
fn frames(provider: &FakeProvider) -> usize {
    provider
        .requests()
        .iter()
        .filter(|r| r.method == http::Method::GET && !r.body.is_empty())
        .count()
}

async fn say_hello(base: &str) -> crate::codex_remote::Run {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    codex_home_for(home.path(), r#"model = "fake-model""#, base, 100_000);
    run(home.path(), work.path()).await
}

async fn run(home: &Path, work: &Path) -> crate::codex_remote::Run {
    codex_within(Duration::from_secs(90), home, work, &["Say hello."]).await
}

/// The `response.create` frames the fake received, as JSON.
fn frame_bodies(provider: &FakeProvider) -> Vec<serde_json::Value> {
    provider
        .requests()
        .iter()
        .filter(|r| r.method == http::Method::GET && !r.body.is_empty())
        .map(|r| r.json())
        .collect()
}

#[tokio::test]
#[ignore = "needs Codex CLI, which scripts/test installs"]
async fn codex_talks_websocket_through_abridge_as_fast_as_direct() {
    let behavior = Behavior {
        responses_websocket: true,
        ..Behavior::default()
    };
    let provider = FakeProvider::start(behavior).await.unwrap();
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Native;
    let proxy = Proxy::start_with(config).await;

    let direct = say_hello(&provider.url()).await;
    let direct_frames = frames(&provider);
    let through = say_hello(&proxy.url("/v1")).await;
    let through_frames = frames(&provider) - direct_frames;
    eprintln!(
        "Codex's first answer over WebSocket: {:.2} s through abridge, {:.2} s direct to the fake ({through_frames} and {direct_frames} frames)",
        through.took.as_secs_f64(),
        direct.took.as_secs_f64(),
    );
    assert!(direct.stdout.contains("Fake reply"), "{}", direct.stdout);
    assert!(through.stdout.contains("Fake reply"), "{}", through.stdout);
    assert!(direct_frames > 0, "Codex uses the fake's WebSocket");
    assert!(through_frames > 0, "and abridge's relay of it");
    assert!(
        !through.stderr.contains("Reconnecting"),
        "{}",
        through.stderr
    );
    // Within 0.5 s of direct is the aim; the bound leaves room for a busy machine.
    assert!(
        through.took < direct.took + Duration::from_millis(1500),
        "{:?} through, {:?} direct",
        through.took,
        direct.took
    );
    let stats = proxy.stats();
    assert!(
        stats.usage_reports > 0,
        "usage read from the relayed frames"
    );
}

#[tokio::test]
#[ignore = "needs Codex CLI, which scripts/test installs"]
async fn codex_over_websocket_is_compacted_through_abridge() {
    let behavior = Behavior {
        responses_websocket: true,
        reply_words: 400,
        ..Behavior::default()
    };
    let provider = FakeProvider::start(behavior).await.unwrap();
    // Codex's instructions and tools are about 5,000 tokens and every turn adds about
    // 1,100: over 8,000 by the fourth run. Codex itself never compacts (its limit is far).
    let mut config = compacting(&provider.url(), Strategy::Recency, 8_000);
    config.provider_apis.responses_compaction = ProviderCompaction::Native;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    codex_home_for(
        home.path(),
        r#"model = "fake-model""#,
        &proxy.url("/v1"),
        200_000,
    );
    let first = ask(1);
    let deadline = Duration::from_secs(90);
    codex_within(deadline, home.path(), work.path(), &[&first]).await;
    for n in 2..=7 {
        let next = ask(n);
        let args = ["resume", "--last", next.as_str()];
        codex_within(deadline, home.path(), work.path(), &args).await;
    }
    // The full requests (no previous_response_id) that generate an answer: one a run.
    let full: Vec<usize> = frame_bodies(&provider)
        .iter()
        .filter(|f| f.get("previous_response_id").is_none() && f["generate"] != false)
        .map(|f| f["input"].as_array().map_or(0, Vec::len))
        .collect();
    eprintln!("Codex over WebSocket through abridge: full requests' input items {full:?}");
    assert!(full.len() >= 7, "{full:?}");
    assert!(
        full.windows(2).any(|w| w[1] < w[0]),
        "a run's full request went compacted: {full:?}"
    );
    let marked = frame_bodies(&provider)
        .iter()
        .filter(|f| f.to_string().contains("[abridge: reference material"))
        .count();
    assert!(marked > 0, "abridge's marker reached the provider");
    let stats = proxy.stats();
    assert!(stats.checkpoints_applied > 0, "{stats:?}");
    assert!(stats.usage_reports as usize >= full.len());
}
