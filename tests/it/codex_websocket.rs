//! Codex CLI, the real binary, on its built-in `openai` provider, through abridge in
//! `native` mode to the fake provider serving the Responses WebSocket as OpenAI does:
//! Codex talks WebSocket through abridge (the fake receives its `response.create`
//! frames, relayed), its turns complete, and its time to the first answer through
//! abridge is close to its time direct to the fake. `#[ignore]`d for a bare
//! `cargo test` (it needs the Codex CLI that scripts/test installs).

use std::path::Path;
use std::time::Duration;

use abridge::config::ProviderCompaction;
use fake_provider::{Behavior, FakeProvider};

use crate::codex_remote::{codex_home_for, codex_within};
use crate::common::{Proxy, config_for};

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
