//! A Claude Code transcript as the Messages requests Claude Code sent: one request per
//! answer the model gave, its history rebuilt from the records as the client held it.
//!
//! Claude Code writes a line per record, each naming its parent (`parentUuid`). The
//! history is a **tree**, not a chain:
//! - an answer is written a record per content block, all with the same `message.id`,
//!   each the parent of the next: they are one message;
//! - when the model calls tools in parallel, each `tool_result` is a user record of its
//!   own whose parent is *its* `tool_use` record, so the newest record's ancestors miss
//!   every result but the last; the results of one answer are one user message;
//! - a rewound or edited turn leaves a dead branch: any other child of a record on the
//!   way (a user prompt, an answer of another `message.id`) is not part of the history;
//! - Claude Code's own compaction (`compact_boundary`: no parent, a `logicalParentUuid`)
//!   starts a new conversation, as it does at the provider; the history before it ends
//!   at the record the boundary names or, when that record was never written (Claude
//!   Code 2.1 names one it did not keep), at the newest record written before it;
//! - sub-agents (`isSidechain`) are conversations of their own, each replayed apart.
//!
//! So the history of a conversation is its newest record's ancestors, widened to the
//! records of the same answers and to the results of their tool calls, in the order
//! they were written; the walk and the widening are linear in the records.
//!
//! Each answer's `usage` is what the provider billed for the request that produced it:
//! its input tokens (`input_tokens` + `cache_read_input_tokens` +
//! `cache_creation_input_tokens`), cache reads and writes, output.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use super::{Answers, is_claude_code};
use crate::prices::Tokens;

/// Claude Code's `max_tokens` when the transcript cannot say (it does not keep it).
const CLAUDE_MAX_TOKENS: u64 = 32_000;

/// The transcript's records, by uuid and by parent.
struct Tree<'a> {
    lines: &'a [(usize, Value)],
    by_uuid: HashMap<&'a str, usize>,
    children: HashMap<&'a str, Vec<usize>>,
    /// For each line, the newest main-history user or assistant record written before it.
    last_before: Vec<Option<usize>>,
}

impl<'a> Tree<'a> {
    fn of(lines: &'a [(usize, Value)]) -> Self {
        let mut by_uuid = HashMap::new();
        let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut last_before = Vec::with_capacity(lines.len());
        let mut last = None;
        for (i, (_, line)) in lines.iter().enumerate() {
            last_before.push(last);
            if is_claude_code(line) && line["isSidechain"] != true {
                last = Some(i);
            }
            if let Some(uuid) = line["uuid"].as_str() {
                by_uuid.insert(uuid, i);
            }
            if let Some(parent) = line["parentUuid"].as_str() {
                children.entry(parent).or_default().push(i);
            }
        }
        Self {
            lines,
            by_uuid,
            children,
            last_before,
        }
    }

    fn line(&self, i: usize) -> &'a Value {
        &self.lines[i].1
    }

    /// The ancestors of `leaf`, newest first, split where Claude Code compacted (the
    /// segment before a `compact_boundary` is its own conversation): oldest segment
    /// first, each newest first.
    fn ancestors(&self, leaf: usize) -> Result<Vec<Vec<usize>>, String> {
        let mut segments = vec![Vec::new()];
        let mut at = Some(leaf);
        let mut steps = 0;
        while let Some(i) = at {
            steps += 1;
            if steps > self.lines.len() {
                return Err("the transcript's parentUuid chain has a loop".into());
            }
            if let Some(segment) = segments.last_mut() {
                segment.push(i);
            }
            let record = self.line(i);
            at = match (
                record["parentUuid"].as_str(),
                record["logicalParentUuid"].as_str(),
            ) {
                (Some(parent), _) => self.by_uuid.get(parent).copied(),
                // The record a boundary names is not always written (Claude Code 2.1
                // names one it never kept): the history it closed ends at the newest
                // record written before it.
                (None, Some(logical)) => {
                    segments.push(Vec::new());
                    self.by_uuid.get(logical).copied().or(self.last_before[i])
                }
                (None, None) => None,
            };
        }
        segments.reverse();
        Ok(segments)
    }

    /// `chain` widened to the records of the same answers and the results of their tool
    /// calls (children of a record in it), in the order they were written.
    fn widened(&self, chain: &[usize]) -> Vec<usize> {
        let mut kept: HashSet<usize> = chain.iter().copied().collect();
        let mut work: Vec<usize> = chain.to_vec();
        while let Some(i) = work.pop() {
            let Some(uuid) = self.line(i)["uuid"].as_str() else {
                continue;
            };
            for &child in self.children.get(uuid).map_or(&[][..], Vec::as_slice) {
                if !kept.contains(&child) && self.belongs(i, child) {
                    kept.insert(child);
                    work.push(child);
                }
            }
        }
        let mut kept: Vec<usize> = kept.into_iter().collect();
        kept.sort_unstable();
        kept
    }

    /// Whether `child` of `parent` is part of the same history: another record of the
    /// same answer, or a user record with the result of a tool `parent` called.
    fn belongs(&self, parent: usize, child: usize) -> bool {
        let (p, c) = (&self.line(parent)["message"], &self.line(child)["message"]);
        if self.line(child)["type"] == "assistant" {
            return p["role"] == "assistant" && p["id"].is_string() && c["id"] == p["id"];
        }
        let called: HashSet<&str> = blocks_of(p)
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str())
            .collect();
        self.line(child)["type"] == "user"
            && blocks_of(c).any(|b| {
                b["type"] == "tool_result"
                    && b["tool_use_id"]
                        .as_str()
                        .is_some_and(|id| called.contains(id))
            })
    }
}

fn blocks_of(message: &Value) -> impl Iterator<Item = &Value> {
    message["content"].as_array().into_iter().flatten()
}

/// A Claude Code transcript's conversations: the main history's (one per compaction
/// Claude Code made), then each sub-agent's.
pub fn claude_code(lines: &[(usize, Value)]) -> Result<Vec<Answers>, String> {
    let tree = Tree::of(lines);
    let is_record = |i: usize| is_claude_code(tree.line(i));
    let side = |i: usize| tree.line(i)["isSidechain"] == true;
    let leaf = (0..lines.len())
        .rev()
        .find(|&i| is_record(i) && !side(i))
        .ok_or("a Claude Code transcript with no user or assistant record")?;
    let mut out = Vec::new();
    for segment in tree.ancestors(leaf)? {
        out.push(conversation(&tree, &tree.widened(&segment)));
    }
    // Each sub-agent: a sidechain record that no later sidechain record continues.
    let continued: HashSet<&str> = (0..lines.len())
        .filter(|&i| side(i))
        .filter_map(|i| tree.line(i)["parentUuid"].as_str())
        .collect();
    for i in (0..lines.len()).filter(|&i| is_record(i) && side(i)) {
        let uuid = tree.line(i)["uuid"].as_str().unwrap_or("");
        if continued.contains(uuid) {
            continue;
        }
        let chain: Vec<usize> = tree
            .ancestors(i)?
            .into_iter()
            .flatten()
            .filter(|&j| side(j))
            .collect();
        out.push(conversation(&tree, &tree.widened(&chain)));
    }
    Ok(out.into_iter().filter(|a| !a.items.is_empty()).collect())
}

/// The records `kept` (in the order written) as Messages messages and the bill of
/// each answer: an answer's records joined by `message.id` (wherever its later records
/// were written), a run of user records one message, roles alternating from the user,
/// error and synthetic answers left out.
fn conversation(tree: &Tree<'_>, kept: &[usize]) -> Answers {
    let mut items: Vec<Value> = Vec::new();
    let mut bills: Vec<Option<Tokens>> = Vec::new();
    // An answer's id → its message and its bill.
    let mut answers: HashMap<&str, (usize, Option<usize>)> = HashMap::new();
    for &i in kept {
        let record = tree.line(i);
        if !is_claude_code(record) || is_synthetic(record) {
            continue;
        }
        let message = &record["message"];
        let role = message["role"].as_str().unwrap_or("user");
        let blocks = blocks(&message["content"]);
        if items.is_empty() && role != "user" {
            continue;
        }
        let id = message["id"].as_str().filter(|_| role == "assistant");
        if let Some(&(at, billed)) = id.and_then(|id| answers.get(id)) {
            append(&mut items[at], blocks);
            // Its later records may carry the final output count.
            if let (Some(b), Some(later)) = (billed, bill(&message["usage"]))
                && let Some(bill) = &mut bills[b]
            {
                bill.output = bill.output.max(later.output);
            }
            continue;
        }
        let billed = match items.last_mut() {
            Some(last) if last["role"] == role => {
                append(last, blocks);
                None
            }
            _ => {
                let billed = (role == "assistant").then(|| {
                    bills.push(bill(&message["usage"]));
                    bills.len() - 1
                });
                items.push(json!({"role": role, "content": blocks}));
                billed
            }
        };
        if let Some(id) = id {
            answers.insert(id, (items.len() - 1, billed));
        }
    }
    let model = kept
        .iter()
        .rev()
        .filter_map(|&i| tree.line(i)["message"]["model"].as_str())
        .find(|m| !m.starts_with('<'))
        .unwrap_or("claude-sonnet-4-5");
    let mut base = Map::new();
    base.insert("model".into(), Value::from(model));
    base.insert("max_tokens".into(), Value::from(CLAUDE_MAX_TOKENS));
    base.insert("stream".into(), Value::Bool(false));
    Answers { base, items, bills }
}

fn append(message: &mut Value, blocks: Vec<Value>) {
    if let Some(content) = message["content"].as_array_mut() {
        content.extend(blocks);
    }
}

/// What the provider billed for the request an answer answered, from its `usage`.
fn bill(usage: &Value) -> Option<Tokens> {
    let n = |k: &str| usage[k].as_u64().unwrap_or(0);
    usage.get("input_tokens")?;
    let (read, write) = (
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
    );
    Some(Tokens {
        input: n("input_tokens") + read + write,
        cached: read,
        cache_write: write,
        output: n("output_tokens"),
    })
}

/// An answer Claude Code wrote itself (an API error, an interruption).
fn is_synthetic(record: &Value) -> bool {
    record["isApiErrorMessage"] == true
        || record["message"]["model"]
            .as_str()
            .is_some_and(|m| m.starts_with('<'))
}

/// A message's content as blocks (a typed prompt is a string).
fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    }
}
