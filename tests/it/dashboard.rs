//! The dashboard in headless Chromium (Debian's `chromium`, driven by `playwright-core`,
//! both installed by `scripts/test`): it loads without console errors, shows the numbers
//! of /admin/stats after real traffic (recalls too), drills down into a conversation,
//! and a screenshot is saved to `target/artifacts/dashboard.png`. `#[ignore]`d for a
//! bare `cargo test`.

use std::path::PathBuf;
use std::time::Duration;

use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider};
use serde_json::json;

use crate::common::agent::Agent;
use crate::common::{Proxy, config_for, eventually};

#[tokio::test]
#[ignore = "needs chromium and playwright-core, which scripts/test installs"]
async fn the_dashboard_shows_what_the_api_says() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.admin.token = Some(Secret::new("dashboard-token-0123"));
    config.compaction.threshold_tokens = 3000;
    config.compaction.background = false;
    // The fake's model priced as a small hosted one, so the money cards show money.
    let price = abridge::prices::Price {
        input: 0.4,
        cached_input: Some(0.1),
        cache_write: None,
        output: 1.6,
    };
    config.prices.insert("fake-model".to_owned(), price);
    let proxy = Proxy::start_with(config).await;
    let mut agent = Agent::new(&proxy, "sk-dashboard");
    for n in 1..=12 {
        agent.turn(n).await;
    }
    assert!(proxy.stats().compactions_total() >= 1);
    // A second conversation asks for a fact its compaction condensed: the model (the
    // fake, told to use the tool) recalls it.
    let mut messages = crate::recall::compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": crate::recall::QUESTION}));
    let body = json!({"model": "fake-model", "messages": messages});
    let answer = crate::recall::post(&proxy, "sk-recall", &body, &[("x-fake-recall", "1")]).await;
    assert_eq!(answer.headers()["x-abridge-recalls"], "1");
    assert!(
        eventually(Duration::from_secs(2), || proxy.stats().inflight_requests
            == 0)
        .await
    );

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node_dir = std::env::var_os("ABRIDGE_SDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/sdk"))
        .join("node");
    let script = node_dir.join("dashboard-check.mjs");
    std::fs::copy(root.join("tests/dashboard/check.mjs"), &script)
        .expect("scripts/test installs playwright-core into target/sdk/node");
    let artifacts = root.join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .arg(format!("http://{}", proxy.admin))
        .arg("dashboard-token-0123")
        .arg(&screenshot)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser check finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok no console errors")
            && stdout.contains("ok drill-down")
            && stdout.contains("ok plot")
            && stdout.contains("ok recalls listed"),
        "{stdout}"
    );
    assert!(
        std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 10_000),
        "a screenshot was saved"
    );
}
