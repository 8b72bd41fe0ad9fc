//! The index a `recency` marker carries: what the elided messages held, so the agent
//! still knows what was asked, done and decided. Each user ask (its first line), the tool
//! calls made (name, key argument, outcome), the files and paths touched, identifiers and
//! URLs and numbers with units, and the decisions and constraints stated — each list
//! deduplicated, most recent first, within a token budget. Paths and identifiers are read
//! from what the user and the assistant wrote and from tool-call arguments, not from tool
//! outputs (each output is its call's line). No LLM; the same messages give the same
//! bytes.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::OnceLock;

use regex::Regex;

use super::recency::{exit_status, key_argument, quoted};
use super::text::{first_line, identifiers, paths, scanned, truncate_chars};
use crate::conversation::{Item, Role};

/// Longest line of an ask, a decision or a tool call, in characters.
const LINE_CHARS: usize = 160;
/// Longest entry of any list, in characters: a path or identifier longer than this (a
/// URL can run on through kilobytes of base64) is cut, so one entry cannot take
/// its section's whole share — the first entry that does not fit ends the section.
const ENTRY_CHARS: usize = 240;

/// The sections in the order they are written, each with its share of the budget.
const SECTIONS: [(&str, u64); 5] = [
    ("Asks, latest first", 30),
    ("Tool calls", 25),
    ("Files and paths", 15),
    ("Identifiers, URLs, quantities", 15),
    ("Decisions and constraints", 15),
];

/// The index of `elided` within about `max_tokens` as `tokens` counts them (the
/// request's estimator), or `None` when it holds nothing.
pub(super) fn index(
    (first, elided): (usize, &[Item<'_>]),
    max_tokens: u64,
    tokens: &dyn Fn(&str) -> u64,
) -> Option<String> {
    if max_tokens == 0 {
        return None;
    }
    let lists = collect(first, elided);
    // Each entry is a line of its own: "- " and the line break.
    let cost = |text: &str| tokens(text) + 2;
    // Each section first takes entries within its share; what the sections leave is then
    // spent one entry per section in turn, so a quiet section wastes nothing and a busy
    // one does not crowd out the rest.
    let mut taken = [0usize; 5];
    let mut used = 0;
    for (i, (heading, share)) in SECTIONS.iter().enumerate() {
        let room = max_tokens * share / 100;
        let mut spent = cost(heading);
        while let Some(entry) = lists[i].get(taken[i]) {
            if spent + cost(entry) > room {
                break;
            }
            spent += cost(entry);
            taken[i] += 1;
        }
        if taken[i] > 0 {
            used += spent;
        }
    }
    let mut progress = true;
    while progress {
        progress = false;
        for (i, (heading, _)) in SECTIONS.iter().enumerate() {
            let Some(entry) = lists[i].get(taken[i]) else {
                continue;
            };
            let extra = cost(entry) + if taken[i] == 0 { cost(heading) } else { 0 };
            if used + extra <= max_tokens {
                used += extra;
                taken[i] += 1;
                progress = true;
            }
        }
    }
    let mut out = String::from("Index of the elided messages (most recent first):");
    for (((heading, _), entries), n) in SECTIONS.iter().zip(&lists).zip(taken) {
        if n > 0 {
            let _ = write!(out, "\n{heading}:");
        }
        for entry in &entries[..n] {
            let _ = write!(out, "\n- {entry}");
        }
    }
    (taken.iter().sum::<usize>() > 0).then_some(out)
}

/// The five lists, most recent first, each entry once; an ask and a tool call carry
/// the id of their message (`m12`, `elided` starting at history index `first`), which
/// `abridge_recall` reads back.
fn collect(first: usize, elided: &[Item<'_>]) -> [Vec<String>; 5] {
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
    for (i, m) in elided.iter().enumerate().rev() {
        let text = m.content.text_lossy();
        let (a, b) = scanned(&text);
        let at = first + i + 1;
        if m.is_ask() {
            let ask = first_line(&text, LINE_CHARS);
            asks.add_as(format!("m{at}: {ask}"), ask.into_owned());
        }
        for id in &m.results {
            if let Some(call) = calls.get(id.as_ref()) {
                let line = format!("{call} → {}", outcome(&text));
                tools.add_as(format!("m{at}: {line}"), line);
            }
        }
        // What was said and what calls were made with; a tool's output is represented by
        // its call and outcome (a search's hundred paths would crowd out the ones that
        // matter).
        let arguments: Vec<&str> = m.calls.iter().map(|c| c.arguments.as_ref()).collect();
        let said: &[&str] = if m.is_result() { &[] } else { &[b, a] };
        for piece in arguments.into_iter().rev().chain(said.iter().copied()) {
            let found = paths(piece);
            for p in found.iter().rev() {
                files.add((*p).to_owned());
            }
            let found: HashSet<&str> = found.into_iter().collect();
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

/// Entries in the order added, each once, empty ones skipped, each cut at
/// [`ENTRY_CHARS`].
#[derive(Default)]
struct Lister {
    entries: Vec<String>,
    seen: HashSet<String>,
}

impl Lister {
    fn add(&mut self, entry: String) {
        let entry = cut(entry);
        if !entry.is_empty() && self.seen.insert(entry.clone()) {
            self.entries.push(entry);
        }
    }

    /// `entry`, once per `key` (an entry whose id differs is still the same entry).
    fn add_as(&mut self, entry: String, key: String) {
        if !key.is_empty() && self.seen.insert(cut(key)) {
            self.entries.push(cut(entry));
        }
    }
}

/// `entry` cut at [`ENTRY_CHARS`].
fn cut(entry: String) -> String {
    match truncate_chars(&entry, ENTRY_CHARS) {
        std::borrow::Cow::Borrowed(_) => entry,
        std::borrow::Cow::Owned(cut) => cut,
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
    use crate::tokens::approx_text;

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
        let text = index((0, &elided), 2000, &approx_text).unwrap();
        for fact in [
            // An ask and a tool call name their message, as abridge_recall knows it.
            "m1: Deploy the billing service to eu-west-1",
            "m3: bash(command=\"kubectl apply -f deploy/billing.yaml\") → exit status 0",
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
        assert_eq!(index((0, &elided), 2000, &approx_text).unwrap(), text);
    }

    #[test]
    fn the_index_stays_within_its_budget_and_says_nothing_of_nothing() {
        let turns: Vec<serde_json::Value> = (0..400)
            .map(|i| serde_json::json!({"role": "user", "content": format!("Look at src/mod_{i}.rs about TICKET-{i}")}))
            .collect();
        let body = serde_json::json!({ "messages": turns }).to_string();
        let elided = items(&body);
        for budget in [50, 400, 3000] {
            let text = index((0, &elided), budget, &approx_text).unwrap_or_default();
            assert!(
                approx_text(&text) <= budget + 20,
                "{budget}: {}",
                approx_text(&text)
            );
        }
        assert!(
            index((0, &elided), 3000, &approx_text)
                .unwrap()
                .contains("src/mod_399.rs")
        );
        assert_eq!(index((0, &elided), 0, &approx_text), None);
        let quiet = items(r#"{"messages":[{"role":"assistant","content":""}]}"#);
        assert_eq!(index((0, &quiet), 1000, &approx_text), None);
    }

    /// A URL that carries a screenshot (kilobytes of base64) is an identifier too: the
    /// most recent one, whole, would not fit its section's share and, first in its list,
    /// would leave the section empty.
    #[test]
    fn a_blob_of_an_identifier_is_cut_and_leaves_room_for_the_rest() {
        let blob = format!(
            "https://shots.example.com/view?png={}",
            "iVBORw0KGgoAAAANSUhEUg".repeat(400)
        );
        let body = serde_json::json!({"messages": [
            {"role": "user", "content": "The failing job is JOB-4411, see https://ci.example.com/runs/981."},
            {"role": "assistant", "content": format!("The screenshot of it: {blob}")},
        ]})
        .to_string();
        let elided = items(&body);
        let text = index((0, &elided), 1000, &approx_text).unwrap();
        for fact in [
            "JOB-4411",
            "https://ci.example.com/runs/981",
            "https://shots.example.com/view?png=iVBOR",
        ] {
            assert!(text.contains(fact), "{fact} missing:\n{text}");
        }
        assert!(
            text.lines().all(|l| l.chars().count() <= ENTRY_CHARS + 3),
            "{text}"
        );
    }
}
