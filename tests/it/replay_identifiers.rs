//! `abridge replay`'s identifier figures on a conversation whose condensed part holds
//! what recall found hard: a tool's answer of one long JSON line full of URLs (read in
//! parts, each URL whole in one), and a database URL with its password (a secret recall
//! withholds, counted apart from the share).

use serde_json::{Value, json};

use super::replay::replay;

/// A conversation of `turns` user turns: the third holds the JSON line and the secret.
fn conversation(turns: usize) -> Vec<Value> {
    let urls: Vec<String> = (0..120)
        .map(|i| format!("https://api.example.com/repos/acme/app/pulls/comments/{i:08}/reactions"))
        .collect();
    let line = urls
        .iter()
        .map(|u| format!(r#"{{"url":"{u}","total_count":0}}"#))
        .collect::<Vec<_>>()
        .join(",");
    let mut messages = vec![json!({"role": "system", "content": "You help with the app."})];
    for t in 0..turns {
        let text = match t {
            2 => format!(
                "The API answered [{line}]. The app connects to \
                 postgres://app:hunter22secret@db.internal:5432/app_main."
            ),
            _ => format!(
                "Turn {t}: {}",
                "we keep working on the importer module. ".repeat(40)
            ),
        };
        messages.push(json!({"role": "user", "content": text}));
        messages.push(json!({"role": "assistant", "content": format!("Done with turn {t}.")}));
    }
    messages
}

#[test]
fn every_identifier_condensed_is_recallable_and_secrets_are_counted_apart() {
    let messages = conversation(30);
    // One request per user turn, each as the client sent it.
    let lines: Vec<String> = (0..messages.len())
        .filter(|&k| messages[k]["role"] == "user")
        .map(|k| json!({"model": "gpt-4o", "messages": messages[..=k]}).to_string())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("turns.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let path = file.to_str().unwrap();
    let args = ["--threshold", "8000", "--strategy", "recency"];
    let out = replay(&[&["--json"][..], &args, &[path]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &figures["strategies"]["recency"];
    assert!(f["compactions"].as_u64().unwrap() >= 1, "{f}");
    let kept = f["final_identifier_share"].as_f64().unwrap();
    assert!(kept < 0.5, "the URLs are condensed, not sent: {f}");
    assert_eq!(f["final_recallable_share"], 1.0, "{f}");
    assert_eq!(
        f["final_withheld_identifiers"], 1,
        "the URL with a password: {f}"
    );
    let out = replay(&[&args[..], &[path]].concat());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("recency: identifiers recall withholds as secrets (or beside one), not in its recallable share: 1"),
        "{table}"
    );
}
