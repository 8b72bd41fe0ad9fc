//! The index a `recency` marker carries: what the elided messages held, so the agent
//! still knows what was asked, done and decided. Each user ask (its first line), the tool
//! calls made (name, key argument, outcome), the files and paths touched, identifiers and
//! URLs and numbers with units, and the decisions and constraints stated — each list
//! deduplicated, most recent first, within a token budget. No LLM; the same messages give
//! the same bytes.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::OnceLock;

use regex::Regex;

use super::recency::{exit_status, key_argument, quoted};
use super::text::{first_line, identifiers, paths, scanned, truncate_chars};
use crate::conversation::{Item, Role};
use crate::tokens::approx_text;

/// Longest line of an ask, a decision or a tool call, in characters.
const LINE_CHARS: usize = 160;

/// The sections in the order they are written, each with its share of the budget.
const SECTIONS: [(&str, u64); 5] = [
    ("Asks, latest first", 30),
    ("Tool calls", 25),
    ("Files and paths", 15),
    ("Identifiers, URLs, quantities", 15),
    ("Decisions and constraints", 15),
];

/// The index of `elided` within about `max_tokens`, or `None` when it holds nothing.
pub(super) fn index(elided: &[Item<'_>], max_tokens: u64) -> Option<String> {
    if max_tokens == 0 {
        return None;
    }
    let lists = collect(elided);
    let mut out = String::from("Index of the elided messages (most recent first):");
    let mut any = false;
    for ((heading, share), entries) in SECTIONS.iter().zip(lists) {
        let room = max_tokens * share / 100;
        let mut used = approx_text(heading) + 2;
        let mut section = String::new();
        for entry in entries {
            let cost = approx_text(&entry) + 2;
            if used + cost > room {
                break;
            }
            used += cost;
            if section.is_empty() {
                let _ = write!(section, "\n{heading}:");
            }
            let _ = write!(section, "\n- {entry}");
        }
        any |= !section.is_empty();
        out.push_str(&section);
    }
    any.then_some(out)
}

/// The five lists, most recent first, each entry once.
fn collect(elided: &[Item<'_>]) -> [Vec<String>; 5] {
    // Calls by id, to describe a result by the call it answers.
    let calls: HashMap<&str, String> = elided
        .iter()
        .flat_map(|m| &m.calls)
        .map(|c| {
            let argument = key_argument(&c.arguments)
                .map(|(key, value)| format!("{key}={}", quoted(&value)))
                .unwrap_or_default();
            (c.id.as_ref(), format!("{}({argument})", c.name))
        })
        .collect();
    let mut lists: [Lister; 5] = Default::default();
    let [asks, tools, files, ids, decisions] = &mut lists;
    for m in elided.iter().rev() {
        let text = m.content.text_lossy();
        let (a, b) = scanned(&text);
        if m.is_ask() {
            asks.add(first_line(&text, LINE_CHARS).into_owned());
        }
        for id in &m.results {
            if let Some(call) = calls.get(id.as_ref()) {
                tools.add(format!("{call} → {}", outcome(&text)));
            }
        }
        let arguments: Vec<&str> = m.calls.iter().map(|c| c.arguments.as_ref()).collect();
        for piece in arguments.into_iter().rev().chain([b, a]) {
            let found: HashSet<&str> = paths(piece).into_iter().collect();
            for p in paths(piece).into_iter().rev() {
                files.add(p.to_owned());
            }
            for id in identifiers(piece).into_iter().rev() {
                if !found.contains(id.as_str()) {
                    ids.add(id);
                }
            }
        }
        if matches!(m.role, Role::User | Role::Assistant) {
            for line in b.lines().rev().chain(a.lines().rev()) {
                if decision_pattern().is_match(line) {
                    decisions.add(truncate_chars(line.trim(), LINE_CHARS).into_owned());
                }
            }
        }
    }
    lists.map(|l| l.entries)
}

/// Entries in the order added, each once, empty ones skipped.
#[derive(Default)]
struct Lister {
    entries: Vec<String>,
    seen: HashSet<String>,
}

impl Lister {
    fn add(&mut self, entry: String) {
        if !entry.is_empty() && self.seen.insert(entry.clone()) {
            self.entries.push(entry);
        }
    }
}

/// What a tool returned, in a few words: its exit status, or its size and first line.
fn outcome(text: &str) -> String {
    let lines = text.lines().count();
    let first = first_line(text, 60);
    match exit_status(text) {
        Some(status) => format!("exit status {status}, {lines} lines"),
        None if first.is_empty() => "no output".to_owned(),
        None => format!("{lines} lines: {}", quoted(&first)),
    }
}

/// A line that states a decision or a constraint.
fn decision_pattern() -> &'static Regex {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    &P.get_or_init(|| {
        super::text::compile(&[
            r"(?i)\b(?:decided|decision|agreed|going with|we(?:'ll| will) (?:use|keep|go)|let's (?:use|keep|go)|chose|must(?: not)?|never|always|do not|don't|should not|shouldn't|prefer|constraint|requirement|required|only use|avoid)\b",
        ])
    })[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::chat;

    fn items(body: &str) -> Vec<Item<'_>> {
        chat::parse(body.as_bytes()).unwrap().messages
    }

    #[test]
    fn the_index_lists_what_was_asked_done_and_decided_newest_first() {
        let body = serde_json::json!({"messages": [
            {"role": "user", "content": "Deploy the billing service to eu-west-1 (ticket OPS-812)."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\":\"kubectl apply -f deploy/billing.yaml\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "deployment.apps/billing configured\nexit code: 0"},
            {"role": "assistant", "content": "Done. We decided to keep the timeout at 250 ms; see https://wiki.example.com/billing."},
            {"role": "user", "content": "Never restart the ledger pods during business hours."},
        ]})
        .to_string();
        let elided = items(&body);
        let text = index(&elided, 2000).unwrap();
        for fact in [
            "Deploy the billing service to eu-west-1",
            "bash(command=\"kubectl apply -f deploy/billing.yaml\") → exit status 0",
            "deploy/billing.yaml",
            "OPS-812",
            "250 ms",
            "https://wiki.example.com/billing",
            "Never restart the ledger pods",
            "We decided to keep the timeout",
        ] {
            assert!(text.contains(fact), "{fact} missing:\n{text}");
        }
        // Most recent first: the later ask is listed before the earlier one.
        let later = text.find("Never restart").unwrap();
        let earlier = text.find("Deploy the billing").unwrap();
        assert!(later < earlier, "{text}");
        // Same messages, same bytes.
        assert_eq!(index(&elided, 2000).unwrap(), text);
    }

    #[test]
    fn the_index_stays_within_its_budget_and_says_nothing_of_nothing() {
        let turns: Vec<serde_json::Value> = (0..400)
            .map(|i| serde_json::json!({"role": "user", "content": format!("Look at src/mod_{i}.rs about TICKET-{i}")}))
            .collect();
        let body = serde_json::json!({ "messages": turns }).to_string();
        let elided = items(&body);
        for budget in [50, 400, 3000] {
            let text = index(&elided, budget).unwrap_or_default();
            assert!(
                approx_text(&text) <= budget + 20,
                "{budget}: {}",
                approx_text(&text)
            );
        }
        assert!(index(&elided, 3000).unwrap().contains("src/mod_399.rs"));
        assert_eq!(index(&elided, 0), None);
        let quiet = items(r#"{"messages":[{"role":"assistant","content":""}]}"#);
        assert_eq!(index(&quiet, 1000), None);
    }
}
