//! A Codex CLI rollout as the Responses requests Codex sent, and what each was billed.
//!
//! Codex writes `{"type": …, "payload": …}` lines (older builds: bare items after a
//! `{"id", "timestamp", …}` line); `response_item` payloads are the Responses items it
//! sends, `turn_context` names the model, and its compaction (`compacted`) replaces the
//! history with `replacement_history` (or, in older files, the summary `message`): a
//! conversation of its own from there. For each answer it writes a `token_count` event
//! (in some versions twice, the same both times; where, depends on the version: see
//! [`super::Answers`]) whose `last_token_usage` is what the provider billed for the
//! request that answer answered: `input_tokens` (of which `cached_input_tokens` read
//! from the cache) and `output_tokens`.

use serde_json::{Map, Value, json};

use super::Answers;
use crate::prices::Tokens;

/// A Codex rollout's conversations.
pub fn codex(lines: &[(usize, Value)]) -> Result<Vec<Answers>, String> {
    let mut base = Map::new();
    let mut model = None;
    let mut segments: Vec<Answers> = vec![Answers::default()];
    let mut last_total: Option<&Value> = None;
    for (_, line) in lines {
        let (kind, payload) = match line.get("payload") {
            Some(payload) => (line["type"].as_str().unwrap_or(""), payload),
            // The older layout: the items themselves.
            None => ("response_item", line),
        };
        let Some(segment) = segments.last_mut() else {
            continue;
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
            "response_item" if is_api_item(payload) => segment.items.push(payload.clone()),
            "event_msg" if payload["type"] == "token_count" => {
                let info = &payload["info"];
                let total = &info["total_token_usage"];
                // Written twice: the second says nothing new.
                if info.is_null() || last_total == Some(total) {
                    continue;
                }
                last_total = Some(total);
                segment.bills.push(bill(&info["last_token_usage"]));
            }
            "compacted" => segments.push(Answers {
                items: compacted(payload),
                ..Answers::default()
            }),
            _ => {}
        }
    }
    base.insert(
        "model".into(),
        Value::from(model.unwrap_or_else(|| "gpt-5-codex".into())),
    );
    base.insert("stream".into(), Value::Bool(false));
    base.insert("store".into(), Value::Bool(false));
    for segment in &mut segments {
        segment.base = base.clone();
    }
    Ok(segments)
}

/// What the provider billed for a request, from a `last_token_usage`.
fn bill(usage: &Value) -> Option<Tokens> {
    let n = |k: &str| usage[k].as_u64().unwrap_or(0);
    usage.get("input_tokens")?;
    Some(Tokens {
        input: n("input_tokens"),
        cached: n("cached_input_tokens"),
        cache_write: 0,
        output: n("output_tokens"),
    })
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
