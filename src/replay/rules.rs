//! The rules real providers enforce on a request's history, which `abridge replay`'s
//! simulated provider applies to what abridge forwards (answering 400, as they would):
//! every tool call answered and every tool result answering a call — OpenAI's chat
//! completions and Responses, Anthropic's Messages (whose results must come in the user
//! message right after the call) — a Responses `reasoning` item (or a run of them, as
//! the model writes them) followed by the item it reasoned for, and on Messages: only `user` and `assistant` turns, alternating (as
//! Anthropic-compatible servers and llama.cpp's templates require; Anthropic itself
//! merges a run of one role), and thinking blocks only in assistant turns — anywhere in
//! them: Claude Opus 4.6 answers text, then thinking, then text and tool calls in one
//! message, and Anthropic takes such a message back as it was (real Claude Code
//! sessions send it on the next request).

use std::collections::HashSet;

use serde_json::Value;

use crate::formats::Format;

/// Why a provider would refuse `items` (`None`: it would accept them).
pub fn violation(format: Format, items: &[Value]) -> Option<String> {
    match format {
        Format::Chat => chat(items),
        Format::Responses => responses(items),
        Format::Messages => messages(items),
    }
}

fn chat(items: &[Value]) -> Option<String> {
    let mut open: Vec<&str> = Vec::new();
    for (i, m) in items.iter().enumerate() {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            if !open.contains(&id) {
                return Some(format!(
                    "message {i}: a tool message answers {id:?}, which no preceding assistant message called"
                ));
            }
            open.retain(|o| *o != id);
            continue;
        }
        if let Some(id) = open.first() {
            return Some(format!(
                "message {i}: the tool call {id:?} has no tool message after it"
            ));
        }
        if let Some(calls) = m["tool_calls"].as_array() {
            open = calls.iter().filter_map(|c| c["id"].as_str()).collect();
        }
    }
    open.first()
        .map(|id| format!("the tool call {id:?} is the last message: its tool message is missing"))
}

fn responses(items: &[Value]) -> Option<String> {
    let kind = |v: &Value| v["type"].as_str().unwrap_or("message").to_owned();
    let calls: HashSet<&str> = items
        .iter()
        .filter(|v| matches!(kind(v).as_str(), "function_call" | "custom_tool_call"))
        .filter_map(|v| v["call_id"].as_str())
        .collect();
    let outputs: HashSet<&str> = items
        .iter()
        .filter(|v| kind(v).ends_with("_call_output"))
        .filter_map(|v| v["call_id"].as_str())
        .collect();
    let mut called = HashSet::new();
    for (i, v) in items.iter().enumerate() {
        let k = kind(v);
        let id = v["call_id"].as_str().unwrap_or_default();
        match k.as_str() {
            "function_call" | "custom_tool_call" => {
                if !outputs.contains(id) {
                    return Some(format!("item {i}: no output for the call {id:?}"));
                }
                called.insert(id);
            }
            "function_call_output" | "custom_tool_call_output" if !called.contains(id) => {
                let why = if calls.contains(id) {
                    "comes before its call"
                } else {
                    "answers no call"
                };
                return Some(format!("item {i}: the output for {id:?} {why}"));
            }
            // The model writes several reasoning items in one answer; the provider takes
            // a run of them before the item they reasoned for (real Codex rollouts send
            // them back so, and are billed). Only a run that ends the history has none.
            "reasoning" if i + 1 == items.len() => {
                return Some(format!(
                    "item {i}: a reasoning item without the item it reasoned for after it"
                ));
            }
            _ => {}
        }
    }
    None
}

fn messages(items: &[Value]) -> Option<String> {
    turns(items)
        .or_else(|| items.iter().enumerate().find_map(|(i, m)| thinking(i, m)))
        .or_else(|| pairs(items))
}

/// Only `user` and `assistant`, alternating, the first a `user` turn.
fn turns(items: &[Value]) -> Option<String> {
    let mut previous = None;
    for (i, m) in items.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if !matches!(role, "user" | "assistant") {
            return Some(format!(
                "message {i}: role {role:?} (only user and assistant)"
            ));
        }
        if i == 0 && role != "user" {
            return Some("message 0: the first turn must be the user's".into());
        }
        if previous == Some(role) {
            return Some(format!(
                "message {i}: two {role} turns in a row (user and assistant must alternate)"
            ));
        }
        previous = Some(role);
    }
    None
}

/// Thinking blocks only in an assistant turn.
fn thinking(i: usize, m: &Value) -> Option<String> {
    let blocks = m["content"].as_array()?;
    let is_thinking =
        |b: &Value| matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking"));
    (m["role"] != "assistant" && blocks.iter().any(is_thinking))
        .then(|| format!("message {i}: a thinking block in a user turn"))
}

/// Each `tool_use` answered by a `tool_result` in the next (user) turn, and each result
/// answering a call of the turn before.
fn pairs(items: &[Value]) -> Option<String> {
    let blocks = |m: &Value, kind: &str, id: &str| -> Vec<String> {
        m["content"]
            .as_array()
            .map(|b| {
                b.iter()
                    .filter(|b| b["type"] == kind)
                    .filter_map(|b| b[id].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut called: Vec<String> = Vec::new();
    for (i, m) in items.iter().enumerate() {
        let results = blocks(m, "tool_result", "tool_use_id");
        if m["role"] == "user" {
            if let Some(id) = results.iter().find(|r| !called.contains(r)) {
                return Some(format!(
                    "message {i}: a tool_result for {id:?} not called by the message before it"
                ));
            }
        } else if !results.is_empty() {
            return Some(format!("message {i}: tool_result outside a user message"));
        }
        if let Some(id) = called.iter().find(|c| !results.contains(c)) {
            return Some(format!(
                "message {i}: the tool_use {id:?} has no tool_result right after it"
            ));
        }
        called = if m["role"] == "assistant" {
            blocks(m, "tool_use", "id")
        } else {
            Vec::new()
        };
    }
    called
        .first()
        .map(|id| format!("the tool_use {id:?} is in the last turn: its tool_result is missing"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn chat_calls_and_results_pair_up() {
        let call = json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]});
        let result = json!({"role": "tool", "tool_call_id": "c1", "content": "ok"});
        let user = json!({"role": "user", "content": "go"});
        let ok = [user.clone(), call.clone(), result.clone(), user.clone()];
        assert_eq!(violation(Format::Chat, &ok), None);
        let orphan = [user.clone(), result.clone()];
        assert!(
            violation(Format::Chat, &orphan)
                .unwrap()
                .contains("no preceding")
        );
        let unanswered = [user.clone(), call.clone(), user];
        assert!(
            violation(Format::Chat, &unanswered)
                .unwrap()
                .contains("no tool message")
        );
        let last = [call];
        assert!(
            violation(Format::Chat, &last)
                .unwrap()
                .contains("last message")
        );
    }

    #[test]
    fn responses_outputs_follow_their_calls_and_reasoning_its_item() {
        let user = json!({"type": "message", "role": "user", "content": "go"});
        let reasoning = json!({"type": "reasoning", "summary": []});
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
        let output = json!({"type": "function_call_output", "call_id": "c1", "output": "ok"});
        let ok = [
            user.clone(),
            reasoning.clone(),
            call.clone(),
            output.clone(),
        ];
        assert_eq!(violation(Format::Responses, &ok), None);
        let run = [
            user.clone(),
            reasoning.clone(),
            reasoning.clone(),
            call.clone(),
            output.clone(),
        ];
        assert_eq!(
            violation(Format::Responses, &run),
            None,
            "a run of reasoning"
        );
        let orphan = [user.clone(), output.clone()];
        assert!(
            violation(Format::Responses, &orphan)
                .unwrap()
                .contains("answers no call")
        );
        let unanswered = [user.clone(), call];
        assert!(
            violation(Format::Responses, &unanswered)
                .unwrap()
                .contains("no output")
        );
        let ending = [user.clone(), reasoning.clone(), reasoning.clone()];
        assert!(violation(Format::Responses, &ending).is_some());
        let alone = [user, reasoning];
        assert!(
            violation(Format::Responses, &alone)
                .unwrap()
                .contains("reasoning")
        );
    }

    #[test]
    fn messages_results_come_right_after_their_calls() {
        let user = json!({"role": "user", "content": "go"});
        let call = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
            "name": "f", "input": {}}]});
        let result = json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": "t1", "content": "ok"}]});
        let text = json!({"role": "assistant", "content": [{"type": "text", "text": "done"}]});
        let ok = [user.clone(), call.clone(), result.clone(), text.clone()];
        assert_eq!(violation(Format::Messages, &ok), None);
        let late = [user.clone(), call.clone(), text.clone(), result.clone()];
        assert!(violation(Format::Messages, &late).is_some());
        let orphan = [user.clone(), result.clone()];
        assert!(violation(Format::Messages, &orphan).is_some());
        let unanswered = [user.clone(), call.clone()];
        assert!(
            violation(Format::Messages, &unanswered)
                .unwrap()
                .contains("missing")
        );
    }

    #[test]
    fn messages_turns_alternate_and_thinking_stays_in_assistant_turns() {
        let user = json!({"role": "user", "content": "go"});
        let answer = |blocks: Value| json!({"role": "assistant", "content": blocks});
        let thinking = json!({"type": "thinking", "thinking": "hm", "signature": "s"});
        let text = json!({"type": "text", "text": "done"});
        let ok = [user.clone(), answer(json!([thinking, text]))];
        assert_eq!(violation(Format::Messages, &ok), None);
        let twice = [user.clone(), user.clone()];
        assert!(
            violation(Format::Messages, &twice)
                .unwrap()
                .contains("in a row")
        );
        let system = [user.clone(), json!({"role": "system", "content": "x"})];
        assert!(
            violation(Format::Messages, &system)
                .unwrap()
                .contains("role")
        );
        // As Claude Opus 4.6 answers (a real Claude Code session): text, thinking, text
        // and a call in one message, taken back by Anthropic as it was.
        let call = json!({"type": "tool_use", "id": "t1", "name": "Read", "input": {}});
        let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]});
        let interleaved = [
            user.clone(),
            answer(json!([text, thinking, text, call])),
            result,
        ];
        assert_eq!(violation(Format::Messages, &interleaved), None);
        let in_user = [json!({"role": "user", "content": [thinking]})];
        assert!(
            violation(Format::Messages, &in_user)
                .unwrap()
                .contains("thinking block in a user turn")
        );
        let first = [answer(json!([text]))];
        assert!(
            violation(Format::Messages, &first)
                .unwrap()
                .contains("first")
        );
    }
}
