//! Codex CLI, the real binary, on its BUILT-IN `openai` provider (`openai_base_url` in
//! its config.toml pointed at abridge, a dummy `OPENAI_API_KEY`), abridge serving the
//! provider compaction APIs (`provider_apis.responses_compaction = "serve"`) in front of
//! the fake provider, which lacks them as llama-server does. With
//! `model_auto_compact_token_limit` low Codex compacts remotely within a few turns, over
//! remote compaction v2 (a streamed `/responses` whose input ends in a
//! `compaction_trigger`). Codex 0.171 has no other remote path: with its feature
//! `remote_compaction_v2 = false` it still compacts that way, header included, and never
//! calls v1's `POST /responses/compact` (abridge's answer to which is tested with a plain
//! client in `provider_apis.rs`). Every `codex exec` / `codex exec resume --last` turn
//! completes, the fake never receives a compaction item or trigger, Codex's session
//! records the compaction, and what the first turns said still reaches the model. Also
//! the time to Codex's first answer through abridge (whose 426 to the Responses
//! WebSocket handshake makes Codex use HTTPS at once) and direct to the fake.
//! `#[ignore]`d for a bare `cargo test`.

use std::path::Path;
use std::time::{Duration, Instant};

use abridge::config::ProviderCompaction;
use fake_provider::FakeProvider;

use crate::codex::codex_binary;
use crate::common::{Proxy, config_for};

/// A `CODEX_HOME` on the built-in provider at `base_url`, compacting over `limit` tokens,
/// and nothing that goes online.
fn codex_home(dir: &Path, base_url: &str, limit: u64) {
    codex_home_for(dir, r#"model = "fake-model""#, base_url, limit);
}

/// The same for the `model` lines given (its name, and its window when Codex cannot
/// know it).
pub(crate) fn codex_home_for(dir: &Path, model: &str, base_url: &str, limit: u64) {
    let config = format!(
        r#"{model}
openai_base_url = "{base_url}"
model_auto_compact_token_limit = {limit}
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
"#
    );
    std::fs::write(dir.join("config.toml"), config).unwrap();
}

/// What one `codex exec` printed, and how long it took.
pub(crate) struct Run {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) took: Duration,
}

async fn codex(home: &Path, work: &Path, args: &[&str]) -> Run {
    codex_within(Duration::from_secs(90), home, work, args).await
}

/// `codex exec` with `args` in `work`, on `home`'s configuration; fails the test unless
/// it exits 0 within `deadline`.
pub(crate) async fn codex_within(
    deadline: Duration,
    home: &Path,
    work: &Path,
    args: &[&str],
) -> Run {
    let binary = codex_binary();
    assert!(
        binary.exists(),
        "{} is missing: run scripts/test, which installs Codex CLI",
        binary.display()
    );
    let started = Instant::now();
    let child = tokio::process::Command::new(&binary)
        .arg("exec")
        .args([
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
        ])
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("OPENAI_API_KEY", "sk-codex-builtin-test")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("CODEX_API_KEY")
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(deadline, child)
        .await
        .unwrap_or_else(|_| panic!("codex exec {args:?} finishes within {deadline:?}"))
        .unwrap();
    let run = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    };
    assert!(
        out.status.success(),
        "codex exec {args:?} failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    run
}

pub(crate) const FACT: &str = "The quokkabase replica listens on port 6543.";

/// A short ask (the fact in the second): the fake's long replies, which a compaction
/// drops, are what take Codex over its limit; the user messages it keeps stay small.
pub(crate) fn ask(n: usize) -> String {
    let fact = if n == 2 {
        format!("\n{FACT}\n")
    } else {
        String::new()
    };
    format!("Step {n}: review module_{n} and list what to change.{fact}")
}

/// The compactions Codex recorded in its session files (`"type":"compacted"` lines).
/// What a session Codex compacted remotely through abridge shows, whatever the server
/// behind it: Codex recorded a compaction; abridge answered no error but the 426s to the
/// WebSocket handshake, one per `codex exec` (`runs`); a request after the compaction
/// carries fewer input items than the one before; the fact stated in the second turn is
/// in the last request (Codex keeps the user messages beside abridge's item). The
/// compactions recorded and each request's input items, for the test's output.
pub(crate) fn compacted_and_carried_on(
    proxy: &Proxy,
    home: &Path,
    bodies: &[serde_json::Value],
    runs: u64,
) -> (usize, Vec<usize>) {
    let compacted = compactions_recorded(home);
    assert!(compacted >= 1, "Codex recorded no compaction");
    let stats = proxy.stats();
    assert_eq!(stats.responses_4xx, runs, "{stats:?}");
    assert_eq!(stats.responses_5xx, 0, "{stats:?}");
    let sizes: Vec<usize> = bodies
        .iter()
        .map(|b| b["input"].as_array().map_or(0, Vec::len))
        .collect();
    assert!(sizes.windows(2).any(|w| w[1] < w[0]), "{sizes:?}");
    let last = bodies.last().map(ToString::to_string).unwrap_or_default();
    assert!(last.contains("6543"), "the fact is lost: {last}");
    (compacted, sizes)
}

/// No Responses body `server` received carried a `compaction` or `compaction_trigger`
/// item (abridge answered them).
pub(crate) fn no_compaction_items(bodies: &[serde_json::Value], server: &str) {
    for body in bodies {
        for item in body["input"].as_array().into_iter().flatten() {
            let kind = item["type"].as_str().unwrap_or("");
            assert!(
                kind != "compaction" && kind != "compaction_trigger",
                "{server} received a {kind} item"
            );
        }
    }
}

pub(crate) fn compactions_recorded(home: &Path) -> usize {
    sessions_recorded(home)
        .lines()
        .filter(|l| l.contains(r#""type":"compacted""#))
        .count()
}

/// Codex's session files under `home`, one after another.
pub(crate) fn sessions_recorded(home: &Path) -> String {
    let mut text = String::new();
    let mut stack = vec![home.join("sessions")];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                text.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    text
}

/// Runs a session of `turns` long asks and a question about the fact, Codex on its
/// built-in provider through abridge (serving the compaction APIs); returns the fake, the proxy and the last answer.
async fn session(turns: usize) -> (FakeProvider, Proxy, Run, tempfile::TempDir) {
    let provider = FakeProvider::start(fake_provider::Behavior {
        uses_recall: true,
        reply_words: 400,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    let proxy = Proxy::start_with(config).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    // Codex's base instructions and tools are about 5,000 tokens and every turn adds about
    // 1,100 (a reply and a tool call): over 8,000 by the fifth. Compacted, the history is
    // about 6,500 (under the limit, or Codex would compact again at once, for ever).
    codex_home(home.path(), &proxy.url("/v1"), 8_000);
    let first = ask(1);
    codex(home.path(), work.path(), &[&first]).await;
    for n in 2..=turns {
        let next = ask(n);
        codex(home.path(), work.path(), &["resume", "--last", &next]).await;
    }
    // Every word of it is in the fact the compaction kept in context: a word found
    // nowhere else ("listen" against "listens") makes the fake model call
    // `abridge_recall`, which a served compaction now offers, and recall reads only
    // what the compaction replaced.
    let question = "Which port is the quokkabase replica on?";
    let answer = codex(home.path(), work.path(), &["resume", "--last", question]).await;
    (provider, proxy, answer, home)
}

/// What the session shows: the fake got neither a compaction item nor a trigger nor a
/// `/responses/compact`, Codex recorded a compaction that shortened its requests, abridge
/// answered no error but the 426s, the fact is in what the model gets after it, and the
/// question was answered; the figures, for the test's output.
fn assert_served(
    provider: &FakeProvider,
    proxy: &Proxy,
    (answer, runs): (&Run, u64),
    home: &Path,
) -> String {
    let sent = provider.requests();
    assert!(
        sent.iter()
            .all(|r| !r.uri.path().ends_with("/responses/compact")),
        "a /responses/compact reached the fake"
    );
    let bodies: Vec<serde_json::Value> = sent
        .iter()
        .filter(|r| r.uri.path().ends_with("/responses"))
        .map(|r| r.json())
        .collect();
    assert!(bodies.len() >= 6, "{} requests", bodies.len());
    no_compaction_items(&bodies, "the fake");
    let (compacted, sizes) = compacted_and_carried_on(proxy, home, &bodies, runs);
    assert!(
        answer.stdout.contains("Fake reply to: Which port"),
        "{}",
        answer.stdout
    );
    format!(
        "{} requests forwarded (input items {sizes:?}), {compacted} compactions recorded, \
         {} 426s",
        bodies.len(),
        runs
    )
}

#[tokio::test]
#[ignore = "needs Codex CLI, which scripts/test installs"]
async fn codex_builtin_provider_remote_compaction_v2_is_served() {
    let (provider, proxy, answer, home) = session(7).await;
    // Codex asked for v2 (the header abridge passes on).
    assert!(
        provider.requests().iter().any(|r| r
            .headers
            .get("x-codex-beta-features")
            .is_some_and(|v| v.to_str().unwrap_or("").contains("remote_compaction_v2"))),
        "Codex did not announce remote_compaction_v2"
    );
    let figures = assert_served(&provider, &proxy, (&answer, 8), home.path());
    eprintln!("Codex on its built-in provider through abridge: {figures}");
}

#[tokio::test]
#[ignore = "needs Codex CLI, which scripts/test installs"]
async fn codex_builtin_provider_answers_at_once_through_abridge() {
    let provider = FakeProvider::start(fake_provider::Behavior::default())
        .await
        .unwrap();
    let mut config = config_for(&provider.url());
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    let proxy = Proxy::start_with(config).await;
    let timed = |base: String| {
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        async move {
            codex_home(home.path(), &base, 100_000);
            codex(home.path(), work.path(), &["Say hello."]).await
        }
    };
    let through = timed(proxy.url("/v1")).await;
    let direct = timed(provider.url()).await;
    eprintln!(
        "Codex's first answer: {:.2} s through abridge, {:.2} s direct to the fake",
        through.took.as_secs_f64(),
        direct.took.as_secs_f64()
    );
    assert!(through.stdout.contains("Fake reply"), "{}", through.stdout);
    // abridge's 426: no WebSocket retries (about 7 s of them direct to the fake).
    assert!(
        !through.stderr.contains("Reconnecting"),
        "{}",
        through.stderr
    );
    assert!(through.took < Duration::from_secs(6), "{:?}", through.took);
}
