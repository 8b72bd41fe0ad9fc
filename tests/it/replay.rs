//! `abridge replay` as a user runs it: the binary on the shipped conversations, its
//! table, its JSON figures and its HTML page, a JSONL input, and bad arguments.

use std::process::Command;

use serde_json::Value;

fn replay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("replay")
        .args(args)
        .env_clear()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

const CHAT: &str = "tests/data/conversations/support-chat.json";

fn user_turns(path: &str) -> usize {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["request"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count()
}

#[test]
fn replay_reports_each_strategy_as_json_and_as_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("replay.html");
    let out = replay(&[
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Value = serde_json::from_slice(&out.stdout).unwrap();
    let strategies = figures["strategies"].as_object().unwrap();
    assert_eq!(strategies.len(), 2, "{figures}");
    for (name, f) in strategies {
        assert_eq!(f["turns"], user_turns(CHAT) as u64, "{name}: {f}");
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
