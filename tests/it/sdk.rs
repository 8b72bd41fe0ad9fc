//! The official OpenAI SDKs (Python and Node) against abridge and straight against the
//! provider, chat completions and Responses, and the Anthropic Python SDK on the
//! Messages API: every scenario gives the same result both ways. The SDKs are installed by
//! `scripts/test` into `target/sdk/` (a Python venv and an npm prefix); these tests are
//! `#[ignore]`d for a bare `cargo test` and run by `scripts/test`.

use std::path::PathBuf;
use std::time::Duration;

use fake_provider::FakeProvider;

use crate::common::{Proxy, config_for};

/// The fake provider and abridge with a threshold small enough for the SDK scripts' long
/// conversation to be compacted (their other scenarios stay far below it).
async fn setup() -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.compaction.threshold_tokens = 2000;
    let proxy = Proxy::start_with(config).await;
    (provider, proxy)
}

pub(crate) fn sdk_dir() -> PathBuf {
    std::env::var_os("ABRIDGE_SDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sdk"))
}

/// `tests/sdk/anthropic_compaction.py` said every scenario passed.
pub(crate) fn every_compaction_scenario_passed(out: &str) {
    for scenario in [
        "compaction_whole",
        "block_sent_back",
        "compaction_streamed",
        "paused",
        "invalid_edit",
        "clear_tool_uses",
    ] {
        assert!(out.contains(&format!("ok {scenario}")), "{scenario}: {out}");
    }
}

pub(crate) fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(name)
}

/// Runs `program args` with a deadline and returns its output, failing loudly.
pub(crate) async fn run(program: PathBuf, args: Vec<String>) -> String {
    run_within(Duration::from_secs(120), program, args).await
}

/// The same within `deadline`.
pub(crate) async fn run_within(deadline: Duration, program: PathBuf, args: Vec<String>) -> String {
    assert!(
        program.exists(),
        "{} is missing: run scripts/test, which installs the SDKs",
        program.display()
    );
    let child = tokio::process::Command::new(&program)
        .args(&args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(deadline, child)
        .await
        .unwrap_or_else(|_| panic!("the SDK check finishes within {deadline:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
#[ignore = "needs the openai Python SDK that scripts/test installs"]
async fn python_sdk_sees_no_difference() {
    let (provider, proxy) = setup().await;
    let python = sdk_dir().join("venv/bin/python");
    let out = run(
        python,
        vec![
            script("check.py").display().to_string(),
            provider.url(),
            proxy.url("/v1"),
        ],
    )
    .await;
    assert!(
        out.contains("ok embeddings") && out.contains("ok usage invisible"),
        "{out}"
    );
    assert!(proxy.stats().usage_reports >= 6, "{:?}", proxy.stats());
}

#[tokio::test]
#[ignore = "needs the openai Node SDK that scripts/test installs"]
async fn node_sdk_sees_no_difference() {
    let (provider, proxy) = setup().await;
    // ES modules resolve packages next to the script, so it runs from the npm prefix.
    let dir = sdk_dir().join("node");
    let copy = dir.join("check.mjs");
    std::fs::copy(script("check.mjs"), &copy)
        .expect("scripts/test installs the Node SDK into target/sdk/node");
    let node = which("node");
    let out = run(
        node,
        vec![copy.display().to_string(), provider.url(), proxy.url("/v1")],
    )
    .await;
    assert!(
        out.contains("ok embeddings") && out.contains("ok usage invisible"),
        "{out}"
    );
    assert!(proxy.stats().usage_reports >= 6, "{:?}", proxy.stats());
}

#[tokio::test]
#[ignore = "needs the openai Python SDK that scripts/test installs"]
async fn python_sdk_responses_see_no_difference() {
    let (provider, proxy) = setup().await;
    let python = sdk_dir().join("venv/bin/python");
    let out = run(
        python,
        vec![
            script("responses_check.py").display().to_string(),
            provider.url(),
            proxy.url("/v1"),
        ],
    )
    .await;
    assert!(
        out.contains("ok invalid_input") && out.contains("ok long_conversation"),
        "{out}"
    );
    assert!(
        proxy.stats().responses_api_requests >= 30,
        "{:?}",
        proxy.stats()
    );
}

#[tokio::test]
#[ignore = "needs the openai Node SDK that scripts/test installs"]
async fn node_sdk_responses_see_no_difference() {
    let (provider, proxy) = setup().await;
    let dir = sdk_dir().join("node");
    let copy = dir.join("responses_check.mjs");
    std::fs::copy(script("responses_check.mjs"), &copy)
        .expect("scripts/test installs the Node SDK into target/sdk/node");
    let out = run(
        which("node"),
        vec![copy.display().to_string(), provider.url(), proxy.url("/v1")],
    )
    .await;
    assert!(
        out.contains("ok invalid_input") && out.contains("ok long_conversation"),
        "{out}"
    );
    assert!(
        proxy.stats().responses_api_requests >= 30,
        "{:?}",
        proxy.stats()
    );
}

#[tokio::test]
#[ignore = "needs the anthropic Python SDK that scripts/test installs"]
async fn anthropic_python_sdk_sees_no_difference() {
    let (provider, proxy) = setup().await;
    let python = sdk_dir().join("venv/bin/python");
    // The Anthropic SDK's base URL has no /v1: it adds /v1/messages itself.
    let base = |url: String| url.trim_end_matches("/v1").to_owned();
    let out = run(
        python,
        vec![
            script("anthropic_check.py").display().to_string(),
            base(provider.url()),
            base(proxy.url("/v1")),
        ],
    )
    .await;
    assert!(
        out.contains("ok count_tokens") && out.contains("ok long_conversation"),
        "{out}"
    );
    assert!(proxy.stats().messages_requests >= 30, "{:?}", proxy.stats());
}

/// The Anthropic SDK's compaction and context-management betas against abridge in front
/// of a server that lacks them (the fake provider: `messages_compaction = "auto"` serves
/// them): the SDK parses every answer as its own types (`tests/sdk/anthropic_compaction.py`).
#[tokio::test]
#[ignore = "needs the anthropic Python SDK that scripts/test installs"]
async fn anthropic_python_sdk_compaction_betas_are_served() {
    let provider = FakeProvider::start(Default::default()).await.unwrap();
    let proxy = Proxy::start_with(config_for(&provider.url())).await;
    let out = run(
        sdk_dir().join("venv/bin/python"),
        vec![
            script("anthropic_compaction.py").display().to_string(),
            proxy.url("/v1").trim_end_matches("/v1").to_owned(),
            "--count".to_owned(),
        ],
    )
    .await;
    every_compaction_scenario_passed(&out);
    assert!(out.contains("ok count_tokens_served"), "{out}");
    // Nothing of the betas reached the server that lacks them, nor their values.
    for request in provider.requests() {
        let body = String::from_utf8_lossy(&request.body);
        assert!(
            !body.contains("\"compaction\"") && !body.contains("context_management"),
            "{body}"
        );
        for beta in request.headers.get_all("anthropic-beta") {
            let beta = beta.to_str().unwrap();
            assert!(
                !beta.contains("compact-2026") && !beta.contains("context-management"),
                "{beta}"
            );
        }
    }
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not found: run scripts/test, which installs it"))
}
