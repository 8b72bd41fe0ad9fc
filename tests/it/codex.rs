//! Codex CLI, the real binary (npm `@openai/codex`, installed by `scripts/test` into
//! `target/sdk/codex`), pointed at abridge with a custom model provider
//! (`wire_api = "responses"`) in front of the fake provider: `codex exec` and
//! `codex exec resume --last` carry one session over several turns, its conversation
//! is compacted, and every turn still completes; a fact stated in the second turn,
//! condensed since, comes back through a streamed recall; the rollout it wrote replays
//! through `abridge replay`. `#[ignore]`d for a bare `cargo test`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_provider::FakeProvider;

use crate::common::{Proxy, config_for};

pub(crate) fn codex_binary() -> PathBuf {
    std::env::var_os("ABRIDGE_CODEX").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
            "target/sdk/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        )
    })
}

/// A `CODEX_HOME` whose only provider is abridge (not named "OpenAI", so Codex does not
/// ask for the provider's own remote compaction), with nothing that goes online.
fn codex_home(dir: &Path, base_url: &str) {
    let config = format!(
        r#"model = "fake-model"
model_provider = "abridge"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false

[model_providers.abridge]
name = "abridge"
base_url = "{base_url}"
env_key = "ABRIDGE_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"#
    );
    std::fs::write(dir.join("config.toml"), config).unwrap();
}

async fn codex(home: &Path, work: &Path, args: &[&str]) -> String {
    let binary = codex_binary();
    assert!(
        binary.exists(),
        "{} is missing: run scripts/test, which installs Codex CLI",
        binary.display()
    );
    let child = tokio::process::Command::new(&binary)
        .arg("exec")
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("ABRIDGE_KEY", "sk-codex-test")
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), child)
        .await
        .expect("codex exec finishes within 3 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "codex exec {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const FACT: &str = "The quokkabase replica listens on port 6543.";

#[tokio::test]
#[ignore = "needs Codex CLI, which scripts/test installs"]
async fn codex_cli_sessions_are_compacted_and_carry_on() {
    let provider = FakeProvider::start(fake_provider::Behavior {
        uses_recall: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut config = config_for(&provider.url());
    // Codex's own system prompt and tools are the head; the threshold leaves room for a
    // few turns of this test's long asks.
    config.compaction.threshold_tokens = 8_000;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    codex_home(home.path(), &proxy.url("/v1"));
    let flags = [
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ];
    let ask = |n: usize| {
        // On a line of its own, as notes are written; not in the first ask, which the
        // compaction keeps as the conversation's head.
        let fact = if n == 2 {
            format!("\n{FACT}\n")
        } else {
            String::new()
        };
        format!(
            "Step {n}: review module_{n} and list what to change.{fact} {}",
            "The service must stay backwards compatible and the change small. ".repeat(40)
        )
    };
    let first = ask(1);
    let mut args: Vec<&str> = flags.to_vec();
    args.push(&first);
    codex(home.path(), work.path(), &args).await;
    for n in 2..=8 {
        let next = ask(n);
        let mut args = vec!["resume", "--last"];
        args.extend(flags);
        args.push(&next);
        codex(home.path(), work.path(), &args).await;
    }
    // The second step is condensed by now; its fact comes back through the tool, inside
    // Codex's stream.
    let mut args = vec!["resume", "--last"];
    args.extend(flags);
    args.push("Which port does the quokkabase replica listen on?");
    let answer = codex(home.path(), work.path(), &args).await;
    assert!(answer.contains("6543"), "{answer}");
    assert!(!answer.contains("abridge_recall"), "{answer}");
    let stats = proxy.stats();
    assert!(stats.recalls >= 1, "{stats:?}");
    let sent: Vec<_> = provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/responses"))
        .collect();
    assert!(sent.len() >= 8, "{} requests", sent.len());
    assert_eq!(stats.responses_4xx + stats.responses_5xx, 0, "{stats:?}");
    assert!(stats.compactions_total() > 0, "compacted: {stats:?}");
    assert!(stats.checkpoints_applied > 0, "{stats:?}");
    assert_eq!(
        stats.usage_reports, stats.responses_api_requests,
        "usage read from every stream"
    );

    // What Codex wrote of the session replays: a request per answer it got. (Its base
    // instructions and tools alone are about 7,000 tokens: the threshold is above them.)
    let figures =
        crate::replay::sessions(&home.path().join("sessions"), ("rollout-", "8000"), "codex");
    let recency = &figures["strategies"]["recency"];
    assert!(recency["turns"].as_u64().unwrap() >= 9, "{figures}");
    assert_eq!(recency["all_succeeded"], true, "{figures}");
    assert!(recency["compactions"].as_u64().unwrap() >= 1, "{figures}");
    // Every forwarded request keeps the rules the provider enforces.
    assert_eq!(recency["all_valid"], true, "{figures}");
}
