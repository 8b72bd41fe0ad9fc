//! Claude Code, the real binary (npm `@anthropic-ai/claude-code`, installed by
//! `scripts/test` into `target/sdk/claude`), with `ANTHROPIC_BASE_URL` at abridge in
//! front of the fake provider (Anthropic's rules, strict alternation): `claude -p` and
//! `claude -p --continue` carry one session over several turns, its conversation is
//! compacted, and every turn still completes; a fact stated in the second turn, condensed
//! since, comes back through a streamed recall; the transcript it wrote replays through
//! `abridge replay`. `#[ignore]`d for a bare `cargo test`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_provider::{Behavior, FakeProvider};

use crate::common::{Proxy, config_for};

fn claude_binary() -> PathBuf {
    std::env::var_os("ABRIDGE_CLAUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/sdk/claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude")
        })
}

async fn claude(home: &Path, work: &Path, base_url: &str, args: &[&str]) -> String {
    let binary = claude_binary();
    assert!(
        binary.exists(),
        "{} is missing: run scripts/test, which installs Claude Code",
        binary.display()
    );
    let child = tokio::process::Command::new(&binary)
        .args(args)
        .current_dir(work)
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", base_url)
        .env("ANTHROPIC_API_KEY", "sk-ant-claude-code-test")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        // --dangerously-skip-permissions as root needs it.
        .env("IS_SANDBOX", "1")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), child)
        .await
        .expect("claude -p finishes within 3 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "claude {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const FACT: &str = "The quokkabase replica listens on port 6543.";

#[tokio::test]
#[ignore = "needs Claude Code, which scripts/test installs"]
async fn claude_code_sessions_are_compacted_and_carry_on() {
    let provider = FakeProvider::start(Behavior {
        strict_alternation: true,
        uses_recall: true,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut config = config_for(&provider.url());
    // Claude Code's system prompt and tools are outside `messages`; the threshold leaves
    // room for a few turns of this test's long asks.
    config.compaction.threshold_tokens = 8_000;
    config.compaction.background = false;
    let proxy = Proxy::start_with(config).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let base = proxy.url("");
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
    let flags = ["--dangerously-skip-permissions", "--max-turns", "4"];
    for n in 1..=8 {
        let prompt = ask(n);
        let mut args = vec!["-p"];
        if n > 1 {
            args.push("--continue");
        }
        args.extend(flags);
        args.push(&prompt);
        claude(home.path(), work.path(), &base, &args).await;
    }
    // The second step is condensed by now; its fact comes back through the tool, inside
    // Claude Code's stream.
    let mut args = vec!["-p", "--continue"];
    args.extend(flags);
    args.push("Which port does the quokkabase replica listen on?");
    let answer = claude(home.path(), work.path(), &base, &args).await;
    assert!(answer.contains("6543"), "{answer}");
    let stats = proxy.stats();
    assert!(stats.recalls >= 1, "{stats:?}");
    assert!(!answer.contains("abridge_recall"), "{answer}");
    assert!(stats.messages_requests >= 8, "{stats:?}");
    assert_eq!(stats.responses_4xx + stats.responses_5xx, 0, "{stats:?}");
    assert!(stats.compactions_total() > 0, "compacted: {stats:?}");
    assert!(stats.checkpoints_applied > 0, "{stats:?}");

    // What Claude Code wrote of the session replays: a request per answer it got.
    let figures = crate::replay::sessions(
        &home.path().join(".claude/projects"),
        // Replay puts back the system prompt and tools the transcript leaves out (about
        // 4,600 tokens as the fake counts them): the threshold is above them.
        ("", "8000"),
        "claude-code",
    );
    let recency = &figures["strategies"]["recency"];
    assert!(recency["turns"].as_u64().unwrap() >= 9, "{figures}");
    assert_eq!(recency["all_succeeded"], true, "{figures}");
    assert!(recency["compactions"].as_u64().unwrap() >= 1, "{figures}");
    // Every forwarded request keeps the rules the provider enforces.
    assert_eq!(recency["all_valid"], true, "{figures}");
}
