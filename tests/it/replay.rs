//! `abridge replay` as a user runs it: the binary on the shipped conversations, its
//! table, its JSON figures and its HTML page, a JSONL input, its help, and bad
//! arguments and input. [`sessions`] replays the session files the real Claude Code and
//! Codex CLI wrote in their tests.

use std::process::Command;

use serde_json::Value;

pub(super) fn replay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("replay")
        .args(args)
        .env_clear()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

const CHAT: &str = "tests/data/conversations/support-chat.json";

/// The requests an agent sent for the history in `path`: one per answer it got (a run of
/// assistant messages), and the last one when the history ends with the client's turn.
fn requests(path: &str) -> usize {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let messages = doc["request"]["messages"].as_array().unwrap();
    let assistant = |i: usize| messages[i]["role"] == "assistant";
    let answers = (1..messages.len())
        .filter(|&i| assistant(i) && !assistant(i - 1))
        .count();
    answers + usize::from(!assistant(messages.len() - 1))
}

#[test]
fn replay_reports_each_strategy_as_json_and_as_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("replay.html");
    let figures = json_of(&[
        "--json",
        "--threshold",
        "8000",
        "--strategy",
        "recency",
        "--strategy",
        "structured",
        "--html",
        page.to_str().unwrap(),
        CHAT,
    ]);
    let strategies = figures["strategies"].as_object().unwrap();
    assert_eq!(strategies.len(), 2, "{figures}");
    for (name, f) in strategies {
        assert_eq!(f["turns"], requests(CHAT) as u64, "{name}: {f}");
        assert!(f["compactions"].as_u64().unwrap() >= 1, "{name}: {f}");
        assert_eq!(f["all_succeeded"], true, "{name}: {f}");
        assert!(
            f["largest_forwarded"].as_u64().unwrap() <= 8000,
            "{name}: {f}"
        );
        assert!(
            f["provider_tokens"].as_u64() < f["client_tokens"].as_u64(),
            "{name}: {f}"
        );
        assert!(f["saved_percent"].as_f64().unwrap() > 10.0, "{name}: {f}");
        let share = f["final_identifier_share"].as_f64().unwrap();
        assert!(share > 0.5 && share <= 1.0, "{name}: {f}");
        // What was condensed can be read back: every identifier is forwarded, or an
        // abridge_recall query for it returns it.
        let recallable = f["final_recallable_share"].as_f64().unwrap();
        assert!(recallable >= 0.99 && recallable >= share, "{name}: {f}");
        let stable = f["stable_prefix_share"].as_f64().unwrap();
        assert!(stable > 0.5 && stable <= 1.0, "{name}: {f}");
    }
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!doctype html>"), "{html}");
    assert_eq!(html.matches("<svg").count(), 2);
    assert!(html.contains("<polyline class=\"p\""));
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "self-contained"
    );
}

#[test]
fn a_jsonl_of_turns_is_replayed_as_sent_and_the_table_names_every_strategy() {
    let text = std::fs::read_to_string(format!("{}/{CHAT}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let messages = doc["request"]["messages"].as_array().unwrap();
    let lines: Vec<String> = (0..messages.len())
        .filter(|&k| messages[k]["role"] == "user")
        .map(|k| serde_json::json!({"model": "gpt-4o", "messages": messages[..=k]}).to_string())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("turns.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = replay(&["--threshold", "8000", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for strategy in ["deterministic", "recency", "structured", "llm_replace"] {
        let row = table
            .lines()
            .find(|l| l.starts_with(strategy))
            .unwrap_or_else(|| panic!("{strategy} in\n{table}"));
        let turns: usize = row.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(turns, lines.len(), "{row}");
        assert!(row.contains(" yes "), "every request succeeded: {row}");
    }
}

#[test]
fn bad_arguments_exit_2_and_say_why() {
    let out = replay(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no FILE"));
    let out = replay(&["--strategy", "bogus", CHAT]);
    assert_eq!(out.status.code(), Some(2));
    let out = replay(&["tests/data/conversations/missing.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.json"));
}

#[test]
fn help_is_an_answer_not_an_error() {
    for args in [&["--help"][..], &["-h"], &["--json", "--help"]] {
        let out = replay(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for names in [
            "Claude Code",
            "Codex",
            "--strategy",
            "--threshold",
            "--html",
        ] {
            assert!(help.contains(names), "{args:?}: {help}");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("abridge replay --help"));
}

#[test]
fn a_bad_line_is_named_by_the_file_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("turns.jsonl");
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    std::fs::write(&file, format!("{body}\n{body}\n{{\"model\": tru\n")).unwrap();
    let out = replay(&[file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains(&format!("{}: line 3, column ", file.display())),
        "{error}"
    );
}

#[test]
fn a_history_a_real_provider_would_refuse_is_refused_and_said_whose_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orphan.jsonl");
    // A tool result no call asked for: OpenAI answers 400. (One request, replayed
    // growing an answer at a time: with no answer in it, it is one request.)
    let body = serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
        {"role": "user", "content": "go on"}]});
    std::fs::write(&file, format!("{body}\n")).unwrap();
    let out = replay(&["--strategy", "recency", file.to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(" NO "), "{table}");
    assert!(
        table.contains("recency: a provider would refuse orphan.jsonl, request 1: message 1")
            && table.contains("as the client sent it too")
            && table.contains("left out of the figures"),
        "{table}"
    );
    // Its conversation is listed as failed, and nothing of it is counted.
    assert!(
        table
            .lines()
            .any(|l| l.contains("orphan.jsonl") && l.contains("FAILED")),
        "{table}"
    );
    // The cost table says it too.
    assert!(table.contains("every request valid"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("recency") && l.ends_with(" NO")),
        "{table}"
    );
}

/// Runs `replay` with `args` (which ask for `--json`), which must succeed; its figures.
fn json_of(args: &[&str]) -> Value {
    let out = replay(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `replay --json` with `args`; the one strategy's figures.
fn figures_of(args: &[&str]) -> Value {
    let figures = json_of(args);
    let strategies = figures["strategies"].as_object().unwrap();
    assert_eq!(strategies.len(), 1, "{figures}");
    strategies.values().next().unwrap().clone()
}

#[test]
fn replay_prices_both_sides_on_one_model_of_the_prompt_cache() {
    let usd = |f: &Value, k: &str| f[k].as_f64().unwrap_or_else(|| panic!("{k}: {f}"));
    // Never compacted: through abridge is the requests as sent, to the cent.
    let plain = figures_of(&[
        "--json",
        "--strategy",
        "recency",
        "--threshold",
        "1000000",
        CHAT,
    ]);
    assert_eq!(plain["compactions"], 0, "{plain}");
    assert!(usd(&plain, "cost_direct_usd") > 0.0, "{plain}");
    assert!(
        (usd(&plain, "cost_direct_usd") - usd(&plain, "cost_through_usd")).abs() < 1e-9,
        "{plain}"
    );
    assert_eq!(usd(&plain, "net_saved_usd"), 0.0, "{plain}");
    assert_eq!(plain["all_valid"], true, "{plain}");

    // Compacted with summaries: what they spent is in the cost through abridge, and the
    // net is the difference.
    let f = figures_of(&[
        "--json",
        "--strategy",
        "structured",
        "--threshold",
        "8000",
        CHAT,
    ]);
    assert!(f["summary_calls"].as_u64().unwrap() >= 1, "{f}");
    assert!(usd(&f, "summary_usd") > 0.0, "{f}");
    assert!(usd(&f, "cost_through_usd") > usd(&f, "summary_usd"), "{f}");
    assert_eq!(
        usd(&f, "cost_direct_usd"),
        usd(&plain, "cost_direct_usd"),
        "the same requests as sent"
    );
    let net = usd(&f, "cost_direct_usd") - usd(&f, "cost_through_usd");
    assert!((usd(&f, "net_saved_usd") - net).abs() < 1e-9, "{f}");
    assert_eq!(f["all_valid"], true, "{f}");
}

/// What abridge told the client is in the figures, counted with its numbers written
/// `N`; the per-minute summary budget, which replay's pace (a session in seconds) would
/// spend where the session's own never would, is not applied.
#[test]
fn notes_are_counted_and_replay_spends_no_per_minute_summary_budget() {
    let f = figures_of(&[
        "--json",
        "--strategy",
        "structured",
        "--threshold",
        "3000",
        "tests/data/conversations/long-session.json",
    ]);
    let notes = f["conversations"][0]["notes"].as_object().unwrap();
    assert!(!notes.is_empty(), "{f}");
    assert!(
        notes
            .keys()
            .any(|k| k.contains("fell back to recency") && k.contains("N tokens")),
        "{notes:?}"
    );
    assert!(
        notes.keys().all(|k| !k.contains("summary budget")),
        "{notes:?}"
    );
    assert!(
        notes.keys().all(|k| !k.chars().any(|c| c.is_ascii_digit())),
        "{notes:?}"
    );
}

#[test]
fn a_model_without_a_price_is_counted_in_tokens_and_prices_can_be_given() {
    let text = std::fs::read_to_string(format!("{}/{CHAT}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut doc: Value = serde_json::from_str(&text).unwrap();
    doc["request"]["model"] = "my-local-model".into();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("local.json");
    std::fs::write(&input, doc.to_string()).unwrap();
    let input = input.to_str().unwrap();
    let out = replay(&["--strategy", "recency", "--threshold", "8000", input]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("no price for my-local-model: tokens only"),
        "{table}"
    );

    // One dollar per million input tokens, a tenth of it cached, two per million output.
    let prices = dir.path().join("prices.toml");
    std::fs::write(
        &prices,
        "[prices]\n\"my-local\" = { input = 1.0, cached_input = 0.1, output = 2.0 }\n",
    )
    .unwrap();
    let f = figures_of(&[
        "--json",
        "--strategy",
        "recency",
        "--threshold",
        "8000",
        "--prices",
        prices.to_str().unwrap(),
        input,
    ]);
    let direct = f["cost_direct_usd"].as_f64().unwrap();
    // Every token as sent costs between the cached and the full price.
    let tokens = f["client_tokens"].as_f64().unwrap();
    assert!(
        direct <= tokens / 1e6 + f["turns"].as_f64().unwrap() * 5.0 * 2.0 / 1e6,
        "{f}"
    );
    assert!(direct >= tokens * 0.1 / 1e6, "{f}");
    assert!(f.get("unpriced_models").is_none(), "{f}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "\"m\" = { input = -1.0, output = 1.0 }\n").unwrap();
    let out = replay(&["--prices", bad.to_str().unwrap(), input]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("m: every price"),
        "{err}"
    );
}

/// Session files an agent wrote under `dir` (each `.jsonl` whose path contains `within`),
/// copied to `target/artifacts/sessions/<kind>/` (in place of the last run's) for whoever
/// wants to see what the real client writes, and replayed at `threshold`: the figures,
/// as JSON.
pub(super) fn sessions(
    dir: &std::path::Path,
    (within, threshold): (&str, &str),
    kind: &str,
) -> Value {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl")
                && path.to_string_lossy().contains(within)
            {
                files.push(path);
            }
        }
    }
    assert!(!files.is_empty(), "no session file under {}", dir.display());
    let keep = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/artifacts/sessions")
        .join(kind);
    // Only this run's files: the directory does not grow with every run.
    let _ = std::fs::remove_dir_all(&keep);
    std::fs::create_dir_all(&keep).unwrap();
    for file in &files {
        std::fs::copy(file, keep.join(file.file_name().unwrap())).unwrap();
    }
    let mut args = vec!["--json", "--threshold", threshold, "--strategy", "recency"];
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    args.extend(names.iter().map(String::as_str));
    json_of(&args)
}

/// `ABRIDGE_SUMMARY__UPSTREAM` in the environment: replay says, before it starts, that
/// the sessions' text goes there; with `--offline` nothing goes.
#[tokio::test]
async fn replay_says_what_leaves_the_machine_and_offline_sends_nothing() {
    let summariser = fake_provider::FakeProvider::start(fake_provider::Behavior::default())
        .await
        .unwrap();
    let url = summariser.url();
    let run = move |offline: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_abridge"));
        command
            .arg("replay")
            .args([
                "--json",
                "--strategy",
                "structured",
                "--threshold",
                "3000",
                CHAT,
            ])
            .env_clear()
            .env("ABRIDGE_SUMMARY__UPSTREAM", &url)
            .env("ABRIDGE_SUMMARY__API_KEY", "sk-operator")
            .env("ABRIDGE_SUMMARY__MODEL", "fake-model")
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if offline {
            command.arg("--offline");
        }
        command
    };
    let again = run.clone();
    let stderr = succeeded(run(true)).await;
    assert!(stderr.contains("--offline: summary.upstream"), "{stderr}");
    assert!(
        summariser.requests().is_empty(),
        "offline: nothing was sent"
    );

    let stderr = succeeded(again(false)).await;
    assert!(
        stderr.contains(&format!("summaries go to {}", summariser.url()))
            && stderr.contains("with summary.api_key"),
        "{stderr}"
    );
    assert!(!summariser.requests().is_empty(), "said, then sent");
    // Without one named, nothing leaves, and it says that too.
    let plain = replay(&["--json", "--strategy", "recency", CHAT]);
    assert!(String::from_utf8_lossy(&plain.stderr).contains("nothing leaves this machine"));
}

/// Runs `command` off the async workers; it succeeded, and this is what it said on
/// stderr.
async fn succeeded(mut command: Command) -> String {
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

const SESSIONS: [&str; 4] = [
    "tests/data/sessions/claude-code/entire-opus45-parallel-review.jsonl",
    "tests/data/sessions/claude-code/yoavf-sonnet45-pomodoro.jsonl",
    "tests/data/sessions/codex/duet-gpt55-onboarding.jsonl",
    "tests/data/sessions/codex/yoavf-gpt5codex-pomodoro.jsonl",
];

/// Real sessions people committed (`tests/data/sessions/SOURCES.md`), replayed with a
/// threshold they cross: every request is one a provider takes (parallel tool calls
/// rebuilt intact), replay's count of what each client sent is within 5 % of the bill
/// the session recorded, and the share of it the provider's cache served is what they
/// recorded (89–98 % on agents' long sessions).
#[test]
fn real_sessions_replay_as_sent_and_within_five_percent_of_their_bill() {
    let mut args = vec![
        "--json",
        "--offline",
        "--strategy",
        "recency",
        "--threshold",
        "30000",
    ];
    args.extend(SESSIONS);
    let f = figures_of(&args);
    assert_eq!(f["all_valid"], true, "{f}");
    assert_eq!(f["failed_conversations"], 0, "{f}");
    let conversations = f["conversations"].as_array().unwrap();
    let billed: Vec<&Value> = conversations
        .iter()
        .filter(|c| c.get("count_error_percent").is_some())
        .collect();
    // Each file's main conversation, and the Claude Code sub-agent.
    assert_eq!(billed.len(), 5, "{f}");
    for c in &billed {
        let error = c["count_error_percent"].as_f64().unwrap();
        assert!(
            error.abs() < 5.0,
            "{}: {error:+.1} % against its bill",
            c["name"]
        );
        assert!(c["failed"].is_null(), "{c}");
        // No compaction saves more than the conversation paid for its history.
        let (net, at_most) = (
            c["net_saved_percent"].as_f64().unwrap(),
            c["at_most_percent"].as_f64().unwrap(),
        );
        assert!(net <= at_most && at_most < 100.0, "{c}");
        // Nor, near enough, more than the requests over the threshold paid for theirs:
        // below it abridge forwards what the client sent.
        let here = c["at_most_here_percent"].as_f64().unwrap();
        assert!(here <= at_most && net <= here + 0.5, "{c}");
    }
    let by_name = |name: &str| {
        *billed
            .iter()
            .find(|c| c["name"].as_str().unwrap().starts_with(name))
            .unwrap()
    };
    // Claude Code leaves its system prompt and tools out of the transcript: ~20 K
    // tokens a request, sized from the first bill.
    let sonnet = by_name("yoavf-sonnet45-pomodoro.jsonl#1");
    assert!(sonnet["requests"].as_u64().unwrap() >= 40, "{sonnet}");
    assert!(
        sonnet["head_tokens_added"].as_u64().unwrap() > 15_000,
        "{sonnet}"
    );
    let share = sonnet["recorded_cache_read_share"].as_f64().unwrap();
    assert!(share > 0.89, "{sonnet}");
    // It crosses the threshold: compacted, as its size says. Most of what it paid was
    // for its head and its answers; its history, read from the cache, is a share of it.
    assert!(sonnet["compactions"].as_u64().unwrap() >= 1, "{sonnet}");
    let at_most = sonnet["at_most_percent"].as_f64().unwrap();
    assert!(at_most > 5.0 && at_most < 60.0, "{sonnet}");
    // Its first requests are under the threshold, with a history of their own.
    let here = sonnet["at_most_here_percent"].as_f64().unwrap();
    assert!(here > 1.0 && here < at_most, "{sonnet}");
    let codex = by_name("yoavf-gpt5codex-pomodoro.jsonl");
    assert_eq!(codex["requests"], 21, "{codex}");
    assert!(
        codex["recorded_cache_read_share"].as_f64().unwrap() > 0.8,
        "{codex}"
    );
}
