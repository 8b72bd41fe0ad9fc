//! Context editing applied to what is forwarded, as Anthropic applies it before the
//! prompt reaches the model: `clear_thinking_20251015` removes the thinking blocks of
//! all but the last `keep` assistant turns that have some (a turn: the assistant
//! messages between two user messages that are not only tool results; the current
//! turn's thinking is always kept, so the rule that a tool loop's assistant message
//! starts with its thinking still holds); `clear_tool_uses_20250919`, once the prompt is
//! over its trigger, replaces the oldest tool results (and, if asked, their calls'
//! inputs) with a placeholder, keeping the newest `keep` and every use of an excluded
//! tool — blocks are never removed, so every `tool_use` keeps its `tool_result`. Each
//! reports what it cleared, for the answer's `context_management.applied_edits`.

use serde_json::{Value, json};

use super::Entry;
use super::edits::{ClearThinking, ClearToolUses, Inputs, Trigger};
use crate::tokens::approx_text;

/// What a cleared tool result says instead.
pub const PLACEHOLDER: &str = "[tool result cleared by context management]";

fn tokens(value: &Value) -> u64 {
    approx_text(&value.to_string())
}

fn blocks(message: &Value) -> &[Value] {
    message["content"].as_array().map_or(&[], Vec::as_slice)
}

fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

/// A user message that asks (not only tool results): where an assistant turn ends.
pub(super) fn asks(message: &Value) -> bool {
    message["role"] == "user"
        && match &message["content"] {
            Value::Array(b) => b.is_empty() || b.iter().any(|b| b["type"] != "tool_result"),
            _ => true,
        }
}

/// `clear_thinking_20251015` on `entries`: its applied edit, when it cleared anything.
pub fn thinking(entries: &mut [Entry<'_>], edit: &ClearThinking) -> Option<Value> {
    let keep = edit.keep?;
    // Each assistant message's turn number, counted from the end.
    let mut turn = 0u64;
    let mut turns = vec![0u64; entries.len()];
    let mut thinking_turns: Vec<u64> = Vec::new();
    for (k, entry) in entries.iter().enumerate().rev() {
        if asks(&entry.value) {
            turn += 1;
        }
        turns[k] = turn;
        if entry.value["role"] == "assistant"
            && blocks(&entry.value).iter().any(is_thinking)
            && thinking_turns.last() != Some(&turn)
        {
            thinking_turns.push(turn);
        }
    }
    let kept: Vec<u64> = thinking_turns.iter().take(keep as usize).copied().collect();
    let (mut cleared_turns, mut cleared_tokens) = (Vec::new(), 0);
    for (k, entry) in entries.iter_mut().enumerate() {
        let message = &entry.value;
        let clear = message["role"] == "assistant"
            && !kept.contains(&turns[k])
            && blocks(message).iter().any(is_thinking)
            // An assistant message of thinking only would be left empty: kept whole.
            && blocks(message).iter().any(|b| !is_thinking(b));
        if !clear {
            continue;
        }
        let before = tokens(&entry.value["content"]);
        if let Some(list) = entry.value["content"].as_array_mut() {
            list.retain(|b| !is_thinking(b));
        }
        cleared_tokens += before.saturating_sub(tokens(&entry.value["content"]));
        entry.changed = true;
        if !cleared_turns.contains(&turns[k]) {
            cleared_turns.push(turns[k]);
        }
    }
    (!cleared_turns.is_empty()).then(|| {
        json!({"type": "clear_thinking_20251015", "cleared_thinking_turns": cleared_turns.len(),
            "cleared_input_tokens": cleared_tokens})
    })
}

/// One tool use: where its call and its result are.
struct Use {
    call: (usize, usize),
    result: Option<(usize, usize)>,
    name: String,
}

fn uses(entries: &[Entry<'_>]) -> Vec<Use> {
    let mut out = Vec::new();
    for (m, entry) in entries.iter().enumerate() {
        if entry.value["role"] != "assistant" {
            continue;
        }
        for (b, block) in blocks(&entry.value).iter().enumerate() {
            if block["type"] != "tool_use" {
                continue;
            }
            let id = &block["id"];
            let result = entries.get(m + 1).and_then(|next| {
                blocks(&next.value)
                    .iter()
                    .position(|r| r["type"] == "tool_result" && r["tool_use_id"] == *id)
                    .map(|at| (m + 1, at))
            });
            let name = block["name"].as_str().unwrap_or_default().to_owned();
            out.push(Use {
                call: (m, b),
                result,
                name,
            });
        }
    }
    out
}

/// `clear_tool_uses_20250919` on `entries`, whose prompt is `prompt` tokens: its applied
/// edit, when it cleared anything.
pub fn tool_uses(entries: &mut [Entry<'_>], edit: &ClearToolUses, prompt: u64) -> Option<Value> {
    let all = uses(entries);
    let over = match edit.trigger {
        Trigger::InputTokens(n) => prompt > n,
        Trigger::ToolUses(n) => all.len() as u64 > n,
    };
    if !over {
        return None;
    }
    let clearable: Vec<&Use> = all
        .iter()
        .filter(|u| !edit.exclude.contains(&u.name))
        .filter(|u| {
            u.result.is_some_and(|(m, b)| {
                blocks(&entries[m].value)[b]["content"] != Value::String(PLACEHOLDER.into())
            })
        })
        .collect();
    let keep = usize::try_from(edit.keep).unwrap_or(usize::MAX);
    let cleared = &clearable[..clearable.len().saturating_sub(keep)];
    if cleared.is_empty() {
        return None;
    }
    // What clearing would save, first: under `clear_at_least`, nothing is touched.
    let mut saved = 0;
    let mut changes: Vec<((usize, usize), Value)> = Vec::new();
    for u in cleared {
        if let Some((m, b)) = u.result {
            let old = &blocks(&entries[m].value)[b];
            let mut new = json!({"type": "tool_result", "tool_use_id": old["tool_use_id"],
                "content": PLACEHOLDER});
            if let Some(cache) = old.get("cache_control") {
                new["cache_control"] = cache.clone();
            }
            saved += tokens(old).saturating_sub(tokens(&new));
            changes.push(((m, b), new));
        }
        let inputs = match &edit.inputs {
            Inputs::None => false,
            Inputs::All => true,
            Inputs::Of(names) => names.contains(&u.name),
        };
        if inputs {
            let (m, b) = u.call;
            let mut new = blocks(&entries[m].value)[b].clone();
            saved += tokens(&new["input"]).saturating_sub(2);
            new["input"] = json!({});
            changes.push(((m, b), new));
        }
    }
    if edit.clear_at_least.is_some_and(|least| saved < least) {
        return None;
    }
    for ((m, b), new) in changes {
        if let Some(slot) = entries[m].value["content"].get_mut(b) {
            *slot = new;
            entries[m].changed = true;
        }
    }
    Some(
        json!({"type": "clear_tool_uses_20250919", "cleared_tool_uses": cleared.len(),
        "cleared_input_tokens": saved}),
    )
}
