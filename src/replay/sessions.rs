//! Agents' own session files as the requests the agent sent: a Claude Code transcript
//! becomes Messages requests, a Codex CLI rollout Responses requests, a request per
//! answer the model gave. What the files do not keep is left out: Claude Code's system
//! prompt and tools, Codex's tools (its `base_instructions` are kept).
//!
//! Claude Code writes a line per record, chained by `parentUuid`; rewinds and edits leave
//! dead branches, so the history is the chain from the newest record back, not the file
//! read top to bottom. An answer is written a line per content block, all with the same
//! `message.id`: they are one message. Its own compaction (`compact_boundary`, then the
//! summary as a user message) starts a new conversation, as it does at the provider.
//!
//! Codex writes `{"type": …, "payload": …}` lines (older builds: bare items after a
//! `{"id", "timestamp", …}` line); `response_item` payloads are the Responses items it
//! sends, `turn_context` names the model, and its compaction (`compacted`) replaces the
//! history with `replacement_history` (or, in older files, the summary `message`).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::input::{Input, cuts, is_output};
use crate::formats::Format;

/// Claude Code's `max_tokens` when the transcript cannot say (it does not keep it).
const CLAUDE_MAX_TOKENS: u64 = 32_000;

/// Whether a line is a Codex rollout's.
pub fn is_codex(line: &Value) -> bool {
    let envelope = matches!(
        line["type"].as_str(),
        Some("session_meta" | "response_item" | "turn_context" | "event_msg" | "compacted")
    ) && line.get("payload").is_some();
    // Before the envelope (2025-08): a first line of the session's id and instructions.
    let bare_meta = line.get("id").is_some()
        && line.get("timestamp").is_some()
        && line.get("instructions").is_some()
        && line.get("type").is_none();
    envelope || bare_meta
}

/// Whether a line is a Claude Code transcript's.
pub fn is_claude_code(line: &Value) -> bool {
    matches!(line["type"].as_str(), Some("user" | "assistant"))
        && line["message"].is_object()
        && line.get("uuid").is_some()
}

/// A Codex rollout's conversations.
pub fn codex(lines: &[(usize, Value)]) -> Result<Vec<Input>, String> {
    let mut base = Map::new();
    let mut model = None;
    let mut segments: Vec<Vec<Value>> = vec![Vec::new()];
    for (_, line) in lines {
        let (kind, payload) = match line.get("payload") {
            Some(payload) => (line["type"].as_str().unwrap_or(""), payload),
            // The older layout: the items themselves.
            None => ("response_item", line),
        };
        match kind {
            "session_meta" => {
                let instructions = payload["base_instructions"]["text"]
                    .as_str()
                    .or(payload["instructions"].as_str());
                if let Some(text) = instructions {
                    base.insert("instructions".into(), Value::from(text));
                }
            }
            "turn_context" => model = payload["model"].as_str().map(str::to_owned),
            "response_item" if is_api_item(payload) => {
                if let Some(segment) = segments.last_mut() {
                    segment.push(payload.clone());
                }
            }
            "compacted" => segments.push(compacted(payload)),
            _ => {}
        }
    }
    base.insert(
        "model".into(),
        Value::from(model.unwrap_or_else(|| "gpt-5-codex".into())),
    );
    base.insert("stream".into(), Value::Bool(false));
    base.insert("store".into(), Value::Bool(false));
    Ok(conversations(Format::Responses, "codex", &base, segments))
}

/// The Responses items Codex sends the model (not its own bookkeeping items).
fn is_api_item(item: &Value) -> bool {
    matches!(
        item["type"].as_str(),
        Some(
            "message"
                | "reasoning"
                | "function_call"
                | "function_call_output"
                | "custom_tool_call"
                | "custom_tool_call_output"
                | "local_shell_call"
                | "web_search_call"
        )
    )
}

/// The history a Codex compaction leaves.
fn compacted(payload: &Value) -> Vec<Value> {
    match payload["replacement_history"].as_array() {
        Some(items) => items.iter().filter(|i| is_api_item(i)).cloned().collect(),
        None => match payload["message"].as_str().filter(|m| !m.is_empty()) {
            Some(summary) => vec![json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": summary}]})],
            None => Vec::new(),
        },
    }
}

/// One input per non-empty segment, a turn per request the model answered.
fn conversations(
    format: Format,
    kind: &'static str,
    base: &Map<String, Value>,
    segments: Vec<Vec<Value>>,
) -> Vec<Input> {
    segments
        .into_iter()
        .filter_map(|items| {
            let cuts = cuts(&items, |item| is_output(format, item));
            (!cuts.is_empty()).then(|| Input::growing(format, kind, base.clone(), items, cuts))
        })
        .collect()
}

/// A Claude Code transcript's conversations.
pub fn claude_code(lines: &[(usize, Value)]) -> Result<Vec<Input>, String> {
    let records: HashMap<&str, &Value> = lines
        .iter()
        .filter_map(|(_, l)| Some((l["uuid"].as_str()?, l)))
        .collect();
    // The newest user or assistant record of the main chain is where the history ends.
    let leaf = lines
        .iter()
        .rev()
        .map(|(_, l)| l)
        .find(|l| is_claude_code(l) && l["isSidechain"] != true)
        .ok_or("a Claude Code transcript with no user or assistant record")?;
    let mut segments: Vec<Vec<&Value>> = vec![Vec::new()];
    let mut at = Some(leaf);
    let mut steps = 0;
    while let Some(record) = at {
        steps += 1;
        if steps > lines.len() {
            return Err("the transcript's parentUuid chain has a loop".into());
        }
        if let Some(segment) = segments.last_mut() {
            segment.push(record);
        }
        let parent = record["parentUuid"].as_str();
        at = match (parent, record["logicalParentUuid"].as_str()) {
            (Some(parent), _) => records.get(parent).copied(),
            // A compaction: what came before it is a conversation of its own.
            (None, Some(logical)) => {
                segments.push(Vec::new());
                records.get(logical).copied()
            }
            (None, None) => None,
        };
    }
    let model = leaf_model(lines);
    let mut base = Map::new();
    base.insert("model".into(), Value::from(model));
    base.insert("max_tokens".into(), Value::from(CLAUDE_MAX_TOKENS));
    base.insert("stream".into(), Value::Bool(false));
    let segments = segments
        .into_iter()
        .rev()
        .map(|mut segment| {
            segment.reverse();
            messages_of(&segment)
        })
        .collect();
    Ok(conversations(
        Format::Messages,
        "claude-code",
        &base,
        segments,
    ))
}

/// The model of the transcript's newest real answer.
fn leaf_model(lines: &[(usize, Value)]) -> String {
    lines
        .iter()
        .rev()
        .filter_map(|(_, l)| l["message"]["model"].as_str())
        .find(|m| !m.starts_with('<'))
        .unwrap_or("claude-sonnet-4-5")
        .to_owned()
}

/// A chain of records as Messages messages: the lines of one answer joined, roles
/// alternating (consecutive messages of a role joined, as the API requires), starting
/// with the user; error and synthetic answers left out.
fn messages_of(records: &[&Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for record in records {
        if !is_claude_code(record) || is_synthetic(record) {
            continue;
        }
        let message = &record["message"];
        let role = message["role"].as_str().unwrap_or("user");
        let blocks = blocks(&message["content"]);
        if out.is_empty() && role != "user" {
            continue;
        }
        match out.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(content) = last["content"].as_array_mut() {
                    content.extend(blocks);
                }
            }
            _ => out.push(json!({"role": role, "content": blocks})),
        }
    }
    out
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

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
